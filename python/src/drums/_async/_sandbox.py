"""Sessions: `AsyncSandbox`, its turns and its inspector stream."""

from __future__ import annotations

import builtins
import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Literal

import httpx

from drums import _parse
from drums._async._client import AsyncClient, seg
from drums._async._commands import AsyncCommands
from drums._async._files import AsyncFiles
from drums._errors import DaemonUnavailable, DrumsError, InvalidArgument, NotFound
from drums._types import parse_size
from drums.models import (
    AgentMarked,
    CoordinatedTurn,
    CoordinatedTurns,
    Replication,
    ReplicaVersion,
    RestoreResult,
    Session,
    SessionList,
    SessionStats,
    SessionVersion,
    SessionVersions,
    TurnBegun,
    TurnEffects,
)

if TYPE_CHECKING:
    from drums._async._checkpoints import AsyncCheckpoint

OSWORLD_PORT = 5000
# A screenshot is a few MiB at most; a session answering more is refused.
_SCREENSHOT_MAX = 64 << 20
_PNG = b"\x89PNG\r\n\x1a\n"

Policy = Literal["selective", "full", "files", "off"]


def _client_or_default(client: AsyncClient | None) -> AsyncClient:
    if client is not None:
        return client
    from drums._default import async_default_client

    return async_default_client()


class AsyncTurnStream:
    """The live stream of a session's turn effects (`sandbox.inspect()`).

    It is an async iterator of `TurnEffects`, one per turn as it ends, and
    an async context manager that closes it. It ends when the session is
    removed.
    """

    def __init__(self, client: AsyncClient, path: str) -> None:
        self._client = client
        self._path = path
        self._r: httpx.Response | None = None
        self._lines: AsyncIterator[str] | None = None

    async def open(self) -> AsyncTurnStream:
        """Connect now (iterating connects too); raises `NotFound` for a
        session that is gone."""
        if self._r is None:
            self._r = await self._client._open_stream("GET", self._path)
            self._lines = self._r.aiter_lines()
        return self

    def __aiter__(self) -> AsyncTurnStream:
        return self

    async def __anext__(self) -> TurnEffects:
        await self.open()
        assert self._lines is not None
        while True:
            try:
                line = await self._lines.__anext__()
            except StopAsyncIteration:
                await self.close()
                raise
            except httpx.HTTPError as e:
                await self.close()
                raise DaemonUnavailable(f"the turns stream broke off: {e}") from e
            if line.strip():
                try:
                    doc = json.loads(line)
                except ValueError as e:
                    raise DrumsError("a turns frame that is not JSON", kind="protocol") from e
                return _parse.parse(TurnEffects, doc)

    async def close(self) -> None:
        """Stop reading the stream."""
        if self._r is not None:
            await self._r.aclose()

    async def __aenter__(self) -> AsyncTurnStream:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncTurn:
    """Agent turns of one session (`sandbox.turn`): the inspector's unit of work."""

    def __init__(self, client: AsyncClient, base: str) -> None:
        self._client = client
        self._base = base

    async def begin(self) -> TurnBegun:
        """A turn begins; the first one starts inspecting the session."""
        return await self._client._call_json(TurnBegun, "POST", f"{self._base}/turn/begin")

    async def end(
        self,
        *,
        checkpoint: bool | None = None,
        policy: Policy | None = None,
        wait: bool | None = None,
    ) -> TurnEffects:
        """The open turn ends; returns its net effects.

        Args:
            checkpoint: take a version as the turn's effects ask (docs/engine.md).
            policy: `selective`, `full`, `files` or `off`.
            wait: answer once the version is durable or failed (else it is
                taken in the background; see `drums.jobs`).
        """
        body: dict[str, Any] = {}
        if checkpoint is not None:
            body["checkpoint"] = checkpoint
        if policy is not None:
            body["policy"] = policy
        if wait is not None:
            body["wait"] = wait
        return await self._client._call_json(
            TurnEffects, "POST", f"{self._base}/turn/end", body=body
        )


class AsyncReplicas:
    """A session's replication gate (`sandbox.replication`): while it is on,
    the end of each model answer through drumsd's LLM proxy is held until
    the replica of the turn's version on another host is acknowledged, at
    most the gate's timeout. `drums.ray` is the copier: it turns the gate
    on, copies each version `next()` names, and `ack()`s it
    (docs/cluster.md)."""

    def __init__(self, client: AsyncClient, base: str) -> None:
        self._client = client
        self._base = f"{base}/replication"

    async def on(self, *, timeout: float | None = None) -> Replication:
        """Turn the gate on (or change its timeout, in seconds; default 30)."""
        body: dict[str, Any] = {}
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
                raise TypeError(f"timeout must be a positive number of seconds, not {timeout!r}")
            body["timeout_ms"] = max(1, round(timeout * 1000))
        return await self._client._call_json(Replication, "PUT", self._base, body=body)

    async def state(self) -> Replication:
        """The gate; `NotFound` if it is off."""
        return await self._client._get_json(Replication, self._base)

    async def off(self) -> bool:
        """Turn the gate off (every held answer goes on); False if it was off."""
        try:
            await self._client._request("DELETE", self._base)
        except NotFound:
            return False
        return True

    async def next(self, *, wait: float = 0.0) -> str | None:
        """The oldest version an answer waits on for its replica, waiting up
        to `wait` seconds (at most 30) for one; None if none came."""
        if isinstance(wait, bool) or not isinstance(wait, int | float) or wait < 0:
            raise TypeError(f"wait must be a non-negative number of seconds, not {wait!r}")
        ms = round(min(wait, 30.0) * 1000)
        r = await self._client._request(
            "GET", f"{self._base}/next", params={"wait_ms": str(ms)}, timeout=ms / 1000 + 30
        )
        if r.status_code == 204:
            return None
        return _parse.parse(ReplicaVersion, r.json()).version

    async def ack(self, version: str) -> None:
        """The replica of `version` (an id of this session's) is made."""
        if not isinstance(version, str):
            raise TypeError(f"version must be a str, not {type(version).__name__}")
        await self._client._request("POST", f"{self._base}/ack", json={"version": version})


class AsyncSandbox:
    """A drums session: an isolated Linux sandbox with its own root, network
    and limits, that can be checkpointed, forked, rolled back and recovered.

    Make one with `AsyncSandbox.create()`, or get one with `connect()`;
    `async with` removes it on exit, also after an exception.
    """

    def __init__(self, info: Session, *, client: AsyncClient) -> None:
        self._info = info
        self._client = client
        self._base = f"/v1/sessions/{seg(info.id)}"
        self.commands: AsyncCommands = AsyncCommands(client, info.id)
        """Run commands in the session."""
        self.files: AsyncFiles = AsyncFiles(client, info.id, self.commands)
        """Read and write the session's files."""
        self.turn: AsyncTurn = AsyncTurn(client, self._base)
        """Begin and end agent turns."""
        self.replication: AsyncReplicas = AsyncReplicas(client, self._base)
        """Its replication gate (drums.ray's sessions that survive their node)."""

    def __repr__(self) -> str:
        return f"<AsyncSandbox id={self.id} name={self.name!r}>"

    # ---- making and finding ------------------------------------------------

    @classmethod
    async def create(
        cls,
        *,
        image: str | None = None,
        profile: Literal["headless", "desktop"] | None = None,
        memory: int | str | None = None,
        cpus: float | None = None,
        pids: int | None = None,
        disk: int | str | None = None,
        egress: Literal["none", "nat"] | None = None,
        network: Literal["bridge", "none"] | None = None,
        name: str | None = None,
        privileged: bool | None = None,
        desktop_url: str | None = None,
        screen: str | None = None,
        run: bool | None = None,
        client: AsyncClient | None = None,
    ) -> AsyncSandbox:
        """Create a session; returns once its guest agent answers.

        Every argument is optional: what is left out takes drumsd's default.

        Args:
            image: a drums image (default `default`), an OCI reference or id.
            profile: `headless` (default) or `desktop` (X, Chromium and
                OSWorld's port 5000; needs memory >= 512M and pids >= 256).
            memory: memory limit, bytes or a size such as "512M".
            cpus: CPU limit, in CPUs.
            pids: task limit.
            disk: the session's own disk quota, bytes or a size such as "2G".
            egress: `none` (default) or `nat` (the outside, never the host).
            network: `bridge` (default) or `none`.
            name: a name to find it by (default: drumsd picks one).
            privileged: run without confinement (never on unless asked).
            desktop_url: the page Chromium opens (desktop profile).
            screen: the desktop's size, "WxH" (desktop profile).
            run: start the OCI image's entrypoint once ready.
            client: the daemon connection (default: the module's).
        """
        c = _client_or_default(client)
        return await c.sandboxes.create(
            image=image,
            profile=profile,
            memory=memory,
            cpus=cpus,
            pids=pids,
            disk=disk,
            egress=egress,
            network=network,
            name=name,
            privileged=privileged,
            desktop_url=desktop_url,
            screen=screen,
            run=run,
        )

    @classmethod
    async def connect(cls, id_or_name: str, *, client: AsyncClient | None = None) -> AsyncSandbox:
        """The existing session `id_or_name`."""
        return await _client_or_default(client).sandboxes.connect(id_or_name)

    @classmethod
    async def list(cls, *, client: AsyncClient | None = None) -> builtins.list[AsyncSandbox]:
        """Every session of the daemon (members of warm pools included: their
        `info.pool` is set)."""
        return await _client_or_default(client).sandboxes.list()

    # ---- what it is ---------------------------------------------------------

    @property
    def id(self) -> str:
        """The session's id."""
        return self._info.id

    @property
    def name(self) -> str:
        """The session's name."""
        return self._info.name

    @property
    def info(self) -> Session:
        """The session as drumsd last described it (see `refresh()`)."""
        return self._info

    @property
    def client(self) -> AsyncClient:
        """The daemon connection this sandbox uses."""
        return self._client

    async def refresh(self) -> Session:
        """Ask drumsd again; updates and returns `info`."""
        self._info = await self._client._get_json(Session, self._base)
        return self._info

    async def stats(self) -> SessionStats:
        """What the session's cgroup accounts now (memory, tasks)."""
        return await self._client._get_json(SessionStats, f"{self._base}/stats")

    # ---- ending -------------------------------------------------------------

    async def kill(self) -> bool:
        """Remove the session and everything it owns. Returns False if it was
        already gone."""
        try:
            await self._client._request("DELETE", self._base)
        except NotFound:
            return False
        return True

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.kill()

    # ---- checkpoints, forks, versions -----------------------------------------

    async def checkpoint(
        self,
        *,
        name: str | None = None,
        clean: bool = False,
        leave_running: bool = True,
    ) -> AsyncCheckpoint:
        """Dump the session to a published checkpoint (durable when this returns).

        Args:
            name: the checkpoint's name (default: drumsd picks one).
            clean: a restore may reset browser state (desktop sessions).
            leave_running: keep this session running (the API's default is to
                stop it; the SDK's is to keep it).
        """
        return await self._client.checkpoints.create(
            self.id, name=name, clean=clean, leave_running=leave_running
        )

    async def fork(
        self,
        n: int = 1,
        *,
        at: str | int | None = None,
        keep: bool = False,
        name: str | None = None,
    ) -> builtins.list[AsyncSandbox]:
        """`n` hygienic siblings of this session as it is now (it keeps
        running), or of its done version `at` (id, name or number).

        The checkpoint the fork makes goes with the last sibling unless `keep`.
        `name` is only for `n == 1`.
        """
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"n must be an int, not {n!r}")
        body: dict[str, Any] = {"count": n}
        if at is not None:
            body["at"] = str(at)
        if keep:
            body["keep"] = True
        if name is not None:
            body["name"] = name
        res = await self._client._call_json(RestoreResult, "POST", f"{self._base}/fork", body=body)
        return [AsyncSandbox(s, client=self._client) for s in res.sessions]

    async def versions(self) -> builtins.list[SessionVersion]:
        """The session's versions, oldest first, in every state."""
        v = await self._client._get_json(SessionVersions, f"{self._base}/versions")
        return builtins.list(v.versions)

    async def rollback(self, to: str | int | None = None) -> Session:
        """Continue this same session (id, name, address) from its done
        version `to` (id, name or number; default: the one it is at). Returns
        and keeps the new `info`."""
        body: dict[str, Any] = {} if to is None else {"to": str(to)}
        self._info = await self._client._call_json(
            Session, "POST", f"{self._base}/rollback", body=body
        )
        return self._info

    async def recover(self) -> Session:
        """Bring back a session whose processes died, from its newest done
        version, under the same identity. Returns and keeps the new `info`."""
        self._info = await self._client._call_json(Session, "POST", f"{self._base}/recover")
        return self._info

    async def turns(self) -> builtins.list[CoordinatedTurn]:
        """What the coordinator's LLM proxy saw of this session: one
        `CoordinatedTurn` per model request, oldest first."""
        t = await self._client._get_json(CoordinatedTurns, f"{self._base}/coordinator")
        return builtins.list(t.turns)

    async def mark_agent(self, pid: int) -> AgentMarked:
        """Process `pid` (inside the session) is an agent: it and its
        descendants of now are left out of the inspector's process tracking."""
        if isinstance(pid, bool) or not isinstance(pid, int):
            raise TypeError(f"pid must be an int, not {pid!r}")
        return await self._client._call_json(
            AgentMarked, "POST", f"{self._base}/agent", body={"pid": pid}
        )

    def inspect(self) -> AsyncTurnStream:
        """The live stream of this session's turn effects (`async with` /
        `async for`)."""
        return AsyncTurnStream(self._client, f"{self._base}/turns")

    async def stop_inspecting(self) -> None:
        """Stop inspecting the session (the eBPF programs unload with the last
        inspected session)."""
        await self._client._request("DELETE", f"{self._base}/turns")

    # ---- desktop --------------------------------------------------------------

    @property
    def osworld_url(self) -> str:
        """OSWorld's guest protocol of a desktop session, `http://IP:5000`."""
        ip = self._info.ip
        if not ip:
            raise InvalidArgument(
                f"session {self.name} has no address (network none): no OSWorld endpoint",
                kind="no_address",
            )
        return f"http://{ip}:{OSWORLD_PORT}"

    async def screenshot(self, *, timeout: float = 30.0) -> bytes:
        """A PNG of a desktop session's screen (OSWorld's `GET /screenshot`)."""
        url = f"{self.osworld_url}/screenshot"
        # The session's own server, not drumsd: what it sends is checked
        # (size, PNG signature) and nothing more is trusted.
        async with (
            httpx.AsyncClient(timeout=timeout, trust_env=False) as http,
            http.stream("GET", url) as r,
        ):
            if r.status_code != 200:
                body = (await r.aread())[:500].decode("utf-8", "replace")
                raise DrumsError(
                    f"the session's OSWorld server answered {r.status_code}: {body}",
                    kind="osworld",
                    status=r.status_code,
                )
            buf = bytearray()
            async for chunk in r.aiter_bytes():
                buf += chunk
                if len(buf) > _SCREENSHOT_MAX:
                    raise DrumsError("the session's screenshot is over 64 MiB", kind="osworld")
        if not buf.startswith(_PNG):
            raise DrumsError("the session's screenshot is not a PNG", kind="osworld")
        return bytes(buf)


class AsyncSandboxes:
    """Sessions of one daemon (`client.sandboxes`)."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def create(
        self,
        *,
        image: str | None = None,
        profile: str | None = None,
        memory: int | str | None = None,
        cpus: float | None = None,
        pids: int | None = None,
        disk: int | str | None = None,
        egress: str | None = None,
        network: str | None = None,
        name: str | None = None,
        privileged: bool | None = None,
        desktop_url: str | None = None,
        screen: str | None = None,
        run: bool | None = None,
    ) -> AsyncSandbox:
        """Create a session (see `AsyncSandbox.create`)."""
        body: dict[str, Any] = {}
        for key, val in (
            ("image", image),
            ("profile", profile),
            ("egress", egress),
            ("network", network),
            ("name", name),
        ):
            if val is not None:
                if not isinstance(val, str):
                    raise TypeError(f"{key} must be a str, not {type(val).__name__}")
                body[key] = val
        for key, flag in (("privileged", privileged), ("run", run)):
            if flag is not None:
                if not isinstance(flag, bool):
                    raise TypeError(f"{key} must be a bool, not {type(flag).__name__}")
                body[key] = flag
        limits: dict[str, Any] = {}
        if memory is not None:
            limits["memory_bytes"] = parse_size(memory, "memory")
        if disk is not None:
            limits["disk_bytes"] = parse_size(disk, "disk")
        if pids is not None:
            if isinstance(pids, bool) or not isinstance(pids, int):
                raise TypeError(f"pids must be an int, not {type(pids).__name__}")
            limits["pids_max"] = pids
        if cpus is not None:
            if isinstance(cpus, bool) or not isinstance(cpus, int | float):
                raise TypeError(f"cpus must be a number, not {type(cpus).__name__}")
            limits["cpus"] = float(cpus)
        if limits:
            body["limits"] = limits
        if desktop_url is not None or screen is not None:
            body["desktop"] = {
                k: v for k, v in (("url", desktop_url), ("screen", screen)) if v is not None
            }
        info = await self._client._call_json(Session, "POST", "/v1/sessions", body=body)
        return AsyncSandbox(info, client=self._client)

    async def connect(self, id_or_name: str) -> AsyncSandbox:
        """The existing session `id_or_name`."""
        if not isinstance(id_or_name, str):
            raise TypeError(f"id_or_name must be a str, not {type(id_or_name).__name__}")
        info = await self._client._get_json(Session, f"/v1/sessions/{seg(id_or_name)}")
        return AsyncSandbox(info, client=self._client)

    async def list(self) -> builtins.list[AsyncSandbox]:
        """Every session of the daemon."""
        sl = await self._client._get_json(SessionList, "/v1/sessions")
        return [AsyncSandbox(s, client=self._client) for s in sl.sessions]
