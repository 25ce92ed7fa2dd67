"""Files in a session: the API's files and dir endpoints, and exec for the rest."""

from __future__ import annotations

import builtins
import io
from collections.abc import AsyncIterator
from typing import IO, TYPE_CHECKING, Literal, overload

import httpx

from drums._async._client import seg
from drums._errors import CommandExitError, DaemonUnavailable
from drums._types import ReadFormat, octal_mode
from drums.models import DirEntry, DirListing, Written

if TYPE_CHECKING:
    from drums._async._client import AsyncClient
    from drums._async._commands import AsyncCommands

_CHUNK = 256 * 1024


class AsyncFileStream:
    """A file's bytes as they arrive (`files.read(path, format="stream")`):
    an async iterator of chunks and an async context manager that closes the
    transfer. Iterating to the end closes it too."""

    def __init__(self, response: httpx.Response, path: str) -> None:
        self._r = response
        self._path = path
        self._it: AsyncIterator[bytes] | None = None

    @property
    def mode(self) -> str | None:
        """The file's permission bits ("0644")."""
        mode: str | None = self._r.headers.get("x-drums-mode")
        return mode

    def __aiter__(self) -> AsyncFileStream:
        return self

    async def __anext__(self) -> bytes:
        if self._it is None:
            self._it = self._r.aiter_bytes(_CHUNK)
        try:
            return await self._it.__anext__()
        except StopAsyncIteration:
            await self.close()
            raise
        except httpx.HTTPError as e:
            await self.close()
            raise DaemonUnavailable(f"the transfer of {self._path} broke off: {e}") from e

    async def close(self) -> None:
        """Stop the transfer."""
        await self._r.aclose()

    async def __aenter__(self) -> AsyncFileStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def file_chunks(f: IO[bytes]) -> AsyncIterator[bytes]:
    """A binary file object's bytes, read a chunk at a time (never whole)."""
    while True:
        b = f.read(_CHUNK)
        if not b:
            return
        if not isinstance(b, bytes | bytearray):
            raise TypeError("write() takes a binary file object (opened 'rb'), not a text one")
        yield bytes(b)


class AsyncFiles:
    """Files in one session (`sandbox.files`). Paths are the session's; a
    relative one is taken from `/`.

    `exists` and `remove` have no API endpoint: they run `test -e` and
    `rm -rf --` in the session with the path as an argv element (never in a
    shell string), so no path can turn into a command.
    """

    def __init__(self, client: AsyncClient, session_id: str, commands: AsyncCommands) -> None:
        self._client = client
        self._base = f"/v1/sessions/{seg(session_id)}"
        self._commands = commands

    @overload
    async def read(self, path: str, format: Literal["text"] = "text") -> str: ...
    @overload
    async def read(self, path: str, format: Literal["bytes"]) -> bytes: ...
    @overload
    async def read(self, path: str, format: Literal["stream"]) -> AsyncFileStream: ...

    async def read(self, path: str, format: ReadFormat = "text") -> str | bytes | AsyncFileStream:
        """A file's contents: `text` (UTF-8, invalid bytes replaced), `bytes`,
        or `stream` (an `AsyncFileStream` of chunks, for files too big to hold)."""
        _check_path(path)
        if format not in ("text", "bytes", "stream"):
            raise ValueError(f"format must be 'text', 'bytes' or 'stream', not {format!r}")
        r = await self._client._open_stream("GET", f"{self._base}/files", params={"path": path})
        stream = AsyncFileStream(r, path)
        if format == "stream":
            return stream
        buf = bytearray()
        async with stream:
            async for chunk in stream:
                buf += chunk
        return buf.decode("utf-8", "replace") if format == "text" else bytes(buf)

    async def write(
        self,
        path: str,
        data: str | bytes | bytearray | memoryview | IO[bytes],
        *,
        mode: int | str | None = None,
    ) -> Written:
        """Write a file atomically (readers see the old contents or the new).

        Args:
            path: the file; its parent directory must exist.
            data: a str (written as UTF-8), bytes, or a binary file object,
                streamed a chunk at a time.
            mode: permission bits, 0o644 or "0644"; default: a replaced file
                keeps its mode, a new one gets 0644.
        """
        _check_path(path)
        content: bytes | AsyncIterator[bytes]
        if isinstance(data, str):
            content = data.encode()
        elif isinstance(data, bytes | bytearray | memoryview):
            content = bytes(data)
        elif isinstance(data, io.TextIOBase):
            raise TypeError("write() takes a binary file object (opened 'rb'), not a text one")
        elif hasattr(data, "read"):
            content = file_chunks(data)
        else:
            raise TypeError(
                f"data must be str, bytes or a binary file object, not {type(data).__name__}"
            )
        params = {"path": path}
        m = octal_mode(mode)
        if m is not None:
            params["mode"] = m
        return await self._client._call_json(
            Written,
            "PUT",
            f"{self._base}/files",
            params=params,
            content=content,
            headers={"content-type": "application/octet-stream"},
        )

    async def list(self, path: str) -> builtins.list[DirEntry]:
        """A directory's entries, sorted by name (symlinks are not followed)."""
        _check_path(path)
        listing = await self._client._get_json(
            DirListing, f"{self._base}/dir", params={"path": path}
        )
        return builtins.list(listing.entries)

    async def exists(self, path: str) -> bool:
        """Whether `path` exists in the session (runs `test -e PATH` as an argv)."""
        _check_path(path)
        r = await self._commands.run(["test", "-e", path], cwd="/")
        if r.exit_code in (0, 1):
            return r.exit_code == 0
        raise CommandExitError(f"test -e {path!r} failed: {r.stderr.strip()}", r)

    async def remove(self, path: str) -> None:
        """Remove a file or a directory tree; a missing path is no error (runs
        `rm -rf -- PATH` as an argv, as root)."""
        _check_path(path)
        r = await self._commands.run(["rm", "-rf", "--", path], cwd="/")
        if r.exit_code != 0:
            raise CommandExitError(f"rm -rf -- {path!r} failed: {r.stderr.strip()}", r)


def _check_path(path: object) -> None:
    if not isinstance(path, str):
        raise TypeError(f"path must be a str, not {type(path).__name__}")
    if not str(path):
        raise ValueError("path must not be empty")
