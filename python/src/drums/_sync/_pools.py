# GENERATED from src/drums/_async/_pools.py by scripts/unasync.py: do not edit.
"""Warm pools: restored siblings of a checkpoint kept ready, handed out once."""

from __future__ import annotations

import builtins
import math
from typing import TYPE_CHECKING, Any

from drums._sync._checkpoints import Checkpoint
from drums._sync._client import seg
from drums._backends import Lock
from drums._errors import NotFound
from drums.models import Pool as PoolInfo
from drums.models import PoolList, Session

if TYPE_CHECKING:
    from drums._sync._client import Client
    from drums._sync._sandbox import Sandbox

# Added to a take's own wait for the HTTP call's limit: the daemon answers
# 503 at the take's end, and the answer must not be cut off before.
_TAKE_SLACK_S = 30.0


def _client_or_default(client: Client | None) -> Client:
    if client is not None:
        return client
    from drums._default import default_client

    return default_client()


class Pool:
    """A warm pool of `size` sandboxes restored from `checkpoint`, kept ready
    by drumsd so that `take()` answers in milliseconds.

    `with Pool(ck, size=4) as pool:` creates the pool on enter and
    removes it on exit, with its members not taken (taken ones are yours:
    kill them). Without `with`, the first `take()` or `info()` creates it;
    call `remove()` when done.

    Args:
        checkpoint: the checkpoint (an `Checkpoint`, or its id or name).
        size: members kept ready (1 to 64).
        name: the pool's name (default: drumsd picks one).
        client: the daemon connection (default: the module's).
    """

    def __init__(
        self,
        checkpoint: Checkpoint | str,
        *,
        size: int = 1,
        name: str | None = None,
        client: Client | None = None,
    ) -> None:
        if isinstance(checkpoint, Checkpoint):
            checkpoint = checkpoint.id
        if not isinstance(checkpoint, str):
            raise TypeError(f"checkpoint must be a checkpoint or its id, not {checkpoint!r}")
        if isinstance(size, bool) or not isinstance(size, int):
            raise TypeError(f"size must be an int, not {size!r}")
        self._checkpoint = checkpoint
        self._size = size
        self._name = name
        self._c = client
        self._info: PoolInfo | None = None
        self._lock = Lock()

    def __repr__(self) -> str:
        what = f"id={self._info.id} name={self._info.name!r}" if self._info else "not created"
        return f"<Pool {what}>"

    @property
    def _client(self) -> Client:
        return _client_or_default(self._c)

    @classmethod
    def connect(cls, id_or_name: str, *, client: Client | None = None) -> Pool:
        """The existing pool `id_or_name` (leaving a `with` block on it removes it)."""
        c = _client_or_default(client)
        info = c._get_json(PoolInfo, f"/v1/pools/{seg(id_or_name)}")
        pool = cls(info.checkpoint, size=info.size, name=info.name, client=c)
        pool._info = info
        return pool

    @property
    def id(self) -> str:
        """The pool's id; `NotFound` before the pool is created (`with`,
        `create()` or a first `take()`)."""
        if self._info is None:
            raise NotFound("the pool is not created yet: use it in `with`, or take() first")
        return self._info.id

    @property
    def name(self) -> str:
        """The pool's name."""
        if self._info is None:
            raise NotFound("the pool is not created yet: use it in `with`, or take() first")
        return self._info.name

    def create(self) -> PoolInfo:
        """Create the pool now (once; later calls return what drumsd said)."""
        with self._lock:
            if self._info is None:
                body: dict[str, Any] = {"checkpoint": self._checkpoint, "size": self._size}
                if self._name is not None:
                    body["name"] = self._name
                self._info = self._client._call_json(PoolInfo, "POST", "/v1/pools", body=body)
            return self._info

    def _id(self) -> str:
        if self._info is None:
            self.create()
        assert self._info is not None
        return self._info.id

    def info(self) -> PoolInfo:
        """How the pool stands now: ready, restoring, taken, and why it is short."""
        pid = self._id()
        self._info = self._client._get_json(PoolInfo, f"/v1/pools/{seg(pid)}")
        return self._info

    def take(self, timeout: float = 30.0) -> Sandbox:
        """Hand out one ready member, once, as an ordinary sandbox (yours to
        kill); drumsd restores a replacement in the background. With none
        ready, waits up to `timeout` seconds, then raises `Unavailable` with
        drumsd's reason."""
        from drums._sync._sandbox import Sandbox

        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout < 0:
            raise TypeError(f"timeout must be a non-negative number of seconds, not {timeout!r}")
        pid = self._id()
        c = self._client
        info = c._call_json(
            Session,
            "POST",
            f"/v1/pools/{seg(pid)}/take",
            body={"timeout_ms": math.ceil(timeout * 1000)},
            timeout=timeout + _TAKE_SLACK_S,
        )
        return Sandbox(info, client=c)

    def remove(self) -> bool:
        """Remove the pool and its members not taken. Returns False if it was
        never created or is already gone."""
        if self._info is None:
            return False
        try:
            self._client._request("DELETE", f"/v1/pools/{seg(self._info.id)}")
        except NotFound:
            return False
        return True

    def __enter__(self) -> Pool:
        self.create()
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


class Pools:
    """Warm pools of one daemon (`client.pools`, `drums.pools`)."""

    def __init__(self, client: Client | None = None) -> None:
        self._c = client

    def list(self) -> builtins.list[PoolInfo]:
        """Every pool."""
        pl = _client_or_default(self._c)._get_json(PoolList, "/v1/pools")
        return builtins.list(pl.pools)

    def get(self, id_or_name: str) -> PoolInfo:
        """Pool `id_or_name` as it stands."""
        return _client_or_default(self._c)._get_json(PoolInfo, f"/v1/pools/{seg(id_or_name)}")
