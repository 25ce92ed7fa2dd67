# GENERATED from src/drums/_async/_checkpoints.py by scripts/unasync.py: do not edit.
"""Checkpoints: publish, restore, export and import."""

from __future__ import annotations

import builtins
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

import httpx

from drums._sync._client import seg
from drums._sync._files import file_chunks
from drums._errors import DaemonUnavailable
from drums.models import Checkpoint as CheckpointInfo
from drums.models import CheckpointList, RestoreResult

if TYPE_CHECKING:
    from drums._sync._client import Client
    from drums._sync._sandbox import Sandbox

_CHUNK = 1 << 20


def _client_or_default(client: Client | None) -> Client:
    if client is not None:
        return client
    from drums._default import default_client

    return default_client()


class Checkpoint:
    """A published checkpoint: restore it into sandboxes, export or remove it."""

    def __init__(self, info: CheckpointInfo, *, client: Client) -> None:
        self._info = info
        self._client = client
        self._base = f"/v1/checkpoints/{seg(info.id)}"

    def __repr__(self) -> str:
        return f"<Checkpoint id={self.id} name={self.name!r}>"

    @property
    def id(self) -> str:
        """The checkpoint's id."""
        return self._info.id

    @property
    def name(self) -> str:
        """The checkpoint's name."""
        return self._info.name

    @property
    def info(self) -> CheckpointInfo:
        """What drumsd says of it."""
        return self._info

    def restore(
        self, count: int = 1, *, name: str | None = None
    ) -> builtins.list[Sandbox]:
        """`count` hygienic siblings, restored concurrently, all or nothing.
        `name` is only for `count == 1`."""
        from drums._sync._sandbox import Sandbox

        if isinstance(count, bool) or not isinstance(count, int):
            raise TypeError(f"count must be an int, not {count!r}")
        body: dict[str, Any] = {"count": count}
        if name is not None:
            body["name"] = name
        res = self._client._call_json(
            RestoreResult, "POST", f"{self._base}/restore", body=body
        )
        return [Sandbox(s, client=self._client) for s in res.sessions]

    def remove(self) -> None:
        """Remove the checkpoint."""
        self._client._request("DELETE", self._base)

    def export(self, dest: str | os.PathLike[str] | IO[bytes]) -> int:
        """Stream the checkpoint's signed archive to a file, a chunk at a time.

        A path is written as `PATH.part` and renamed once the archive is whole,
        so a broken transfer leaves no archive. A file object gets the bytes as
        they come (a broken transfer raises; what was written is no archive).
        Returns the archive's size.
        """
        if isinstance(dest, str | os.PathLike):
            final = Path(dest)
            part = final.with_name(final.name + ".part")
            try:
                with open(part, "wb") as f:
                    n = self._export_to(f)
                    f.flush()
                    os.fsync(f.fileno())
                part.replace(final)
            except BaseException:
                part.unlink(missing_ok=True)
                raise
            return n
        return self._export_to(dest)

    def iter_export(self, chunk_size: int = _CHUNK) -> Iterator[bytes]:
        """The checkpoint's signed archive, a chunk of at most `chunk_size`
        bytes at a time (never whole in memory): to send it on without a file
        (`drums.ray` moves checkpoints between nodes so). A broken transfer
        raises `DaemonUnavailable`: what was yielded is no archive."""
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise TypeError(f"chunk_size must be a positive int, not {chunk_size!r}")
        n = 0
        with self._client._stream("GET", f"{self._base}/export") as r:
            try:
                for chunk in r.iter_bytes(chunk_size):
                    n += len(chunk)
                    yield chunk
            except httpx.HTTPError as e:
                raise DaemonUnavailable(
                    f"the export of checkpoint {self.name} broke off after {n} bytes: "
                    f"no archive ({e})"
                ) from e

    def _export_to(self, f: IO[bytes]) -> int:
        n = 0
        with self._client._stream("GET", f"{self._base}/export") as r:
            try:
                for chunk in r.iter_bytes(_CHUNK):
                    f.write(chunk)
                    n += len(chunk)
            except httpx.HTTPError as e:
                raise DaemonUnavailable(
                    f"the export of checkpoint {self.name} broke off after {n} bytes: "
                    f"no archive ({e})"
                ) from e
        return n


class Checkpoints:
    """Checkpoints of one daemon (`client.checkpoints`, `drums.checkpoints`)."""

    def __init__(self, client: Client | None = None) -> None:
        self._c = client

    @property
    def _client(self) -> Client:
        return _client_or_default(self._c)

    def create(
        self,
        session: str,
        *,
        name: str | None = None,
        clean: bool = False,
        leave_running: bool = True,
    ) -> Checkpoint:
        """Checkpoint session `session` (see `Sandbox.checkpoint`)."""
        body: dict[str, Any] = {"session": session, "clean": clean, "leave_running": leave_running}
        if name is not None:
            body["name"] = name
        c = self._client
        info = c._call_json(CheckpointInfo, "POST", "/v1/checkpoints", body=body)
        return Checkpoint(info, client=c)

    def list(self) -> builtins.list[Checkpoint]:
        """Every published checkpoint."""
        c = self._client
        cl = c._get_json(CheckpointList, "/v1/checkpoints")
        return [Checkpoint(i, client=c) for i in cl.checkpoints]

    def get(self, id_or_name: str) -> Checkpoint:
        """The checkpoint `id_or_name`."""
        c = self._client
        info = c._get_json(CheckpointInfo, f"/v1/checkpoints/{seg(id_or_name)}")
        return Checkpoint(info, client=c)

    def import_(
        self,
        src: str | os.PathLike[str] | IO[bytes] | Iterable[bytes],
        *,
        trust_unsigned: bool = False,
        name: str | None = None,
    ) -> Checkpoint:
        """Import an exported archive, streamed from a path, a binary file
        object or an iterable of chunks; it gets a fresh id, and the archive's
        name unless `name`. Raises `Untrusted` for an unsigned archive or an
        unknown signer unless `trust_unsigned`. An iterable that raises stops
        the upload short: drumsd keeps nothing of a truncated archive."""
        c = self._client
        params: dict[str, str] = {}
        if trust_unsigned:
            params["trust_unsigned"] = "true"
        if name is not None:
            if not isinstance(name, str):
                raise TypeError(f"name must be a str, not {type(name).__name__}")
            params["name"] = name
        headers = {"content-type": "application/x-tar"}
        if isinstance(src, str | os.PathLike):
            with open(src, "rb") as f:
                info = c._call_json(
                    CheckpointInfo,
                    "POST",
                    "/v1/checkpoints/import",
                    params=params or None,
                    content=file_chunks(f),
                    headers=headers,
                )
        else:
            # A file object is iterable too (by lines): read it by chunks.
            content: Iterable[bytes] = (
                file_chunks(cast("IO[bytes]", src)) if hasattr(src, "read") else src
            )
            info = c._call_json(
                CheckpointInfo,
                "POST",
                "/v1/checkpoints/import",
                params=params or None,
                content=content,
                headers=headers,
            )
        return Checkpoint(info, client=c)
