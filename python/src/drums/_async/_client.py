"""The connection to drumsd: one httpx client over its unix socket, kept for
the client's life (one connection pool, the socket path resolved once), and
the CLI's way of finding and autostarting the daemon (crates/client/src/connect.rs).
"""

from __future__ import annotations

import json
import os
import shutil
import socket as pysocket
import subprocess
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar, cast
from urllib.parse import quote

import httpx

from drums import _parse
from drums._backends import AsyncLock, abort_response, async_sleep
from drums._errors import DaemonUnavailable, DrumsError, error_from_response
from drums.models import AuditReport, Capacity, HostKey, Version

if TYPE_CHECKING:
    from drums._async._checkpoints import AsyncCheckpoints
    from drums._async._images import AsyncImages
    from drums._async._jobs import AsyncJobs
    from drums._async._pools import AsyncPools
    from drums._async._sandbox import AsyncSandboxes

T = TypeVar("T")

DEFAULT_STATE_DIR = "/var/lib/drums"
# How long drumsd may take to answer its socket after an autostart (the CLI's).
AUTOSTART_WAIT_S = 60.0
# A call that is not a stream may take this long: creates, checkpoints and
# restores of desktops take tens of seconds, and a hung call must still end.
DEFAULT_TIMEOUT_S = 300.0
_FALSEY = {"", "0", "false", "no", "off"}
_STARTED: list[subprocess.Popen[bytes]] = []
# The host part only fills the Host header: the socket is the address.
_ORIGIN = "http://drumsd"


def seg(s: str) -> str:
    """An id or name as one path segment (a `/` in it cannot change the route)."""
    return quote(s, safe="")


def _env_flag(name: str) -> bool:
    v = os.environ.get(name)
    return v is not None and v.strip().lower() not in _FALSEY


class AsyncClient:
    """A connection to drumsd, the daemon that owns the sessions.

    Args:
        socket: drumsd's unix socket. Default: `DRUMS_SOCKET`, else
            `STATE_DIR/drumsd.sock` (the CLI's rule).
        state_dir: drumsd's state directory, for an autostart (`--state-dir`,
            and its `drumsd.log`). Default: `DRUMS_STATE_DIR`, else
            `/var/lib/drums`.
        autostart: start a drumsd when none answers, as the CLI does.
            Default: on unless `DRUMS_NO_AUTOSTART` is set (to anything but
            `0`, `false`, `no`, `off` or nothing).
        timeout: seconds a call that is not a stream may take (None: no limit).
        drumsd: the drumsd executable an autostart runs. Default:
            `DRUMS_DRUMSD`, else `drumsd` on `PATH`.

    One client keeps one pool of connections: make one and share it (the
    module-level helpers share a default one). Close it with `close()` or
    use it as an async context manager.
    """

    def __init__(
        self,
        socket: str | os.PathLike[str] | None = None,
        *,
        state_dir: str | os.PathLike[str] | None = None,
        autostart: bool | None = None,
        timeout: float | None = DEFAULT_TIMEOUT_S,
        drumsd: str | None = None,
    ) -> None:
        self.state_dir = Path(state_dir or os.environ.get("DRUMS_STATE_DIR") or DEFAULT_STATE_DIR)
        env_socket = os.environ.get("DRUMS_SOCKET")
        self.socket = Path(socket or env_socket or self.state_dir / "drumsd.sock")
        self.autostart = not _env_flag("DRUMS_NO_AUTOSTART") if autostart is None else autostart
        self.timeout = timeout
        self._drumsd = drumsd
        self._start_lock = AsyncLock()
        # The transport, without an httpx.AsyncClient around it: the client
        # layer (auth, redirects, cookies, default headers) has nothing to do
        # for a unix socket to drumsd, and cost each command a third of the
        # SDK's time over raw HTTP (bench/overhead.py). The transport keeps
        # the connection pool.
        self._transport = httpx.AsyncHTTPTransport(uds=str(self.socket))
        self._hooks: list[Callable[[httpx.Request], object]] = []
        self._timeout_ext = {"timeout": httpx.Timeout(timeout, connect=10.0).as_dict()}
        from drums._async._checkpoints import AsyncCheckpoints
        from drums._async._images import AsyncImages
        from drums._async._jobs import AsyncJobs
        from drums._async._pools import AsyncPools
        from drums._async._sandbox import AsyncSandboxes

        self.sandboxes: AsyncSandboxes = AsyncSandboxes(self)
        """Sessions: `create`, `connect`, `list` (what `AsyncSandbox`'s class methods use)."""
        self.checkpoints: AsyncCheckpoints = AsyncCheckpoints(self)
        """Checkpoints: `list`, `get`, `import_`."""
        self.images: AsyncImages = AsyncImages(self)
        """Images: `list`, `pull`, `remove`, `import_`."""
        self.jobs: AsyncJobs = AsyncJobs(self)
        """Checkpoint jobs: `get`, `promote`."""
        self.pools: AsyncPools = AsyncPools(self)
        """Warm pools: `list`, `get`, `create`."""
        self.debug: AsyncDebug = AsyncDebug(self)
        """Test-only calls (`set_fault`)."""

    def __repr__(self) -> str:
        return f"<AsyncClient socket={str(self.socket)!r}>"

    async def close(self) -> None:
        """Close the connection pool."""
        await self._transport.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- the daemon's own operations --------------------------------------

    async def version(self) -> Version:
        """drumsd's version, API version, pid and state directory."""
        return await self._get_json(Version, "/v1/version")

    async def host_key(self) -> HostKey:
        """The public key this host signs checkpoint archives with."""
        return await self._get_json(HostKey, "/v1/keys/host")

    async def capacity(self) -> Capacity:
        """What the daemon's host holds and may still take (sessions, memory,
        CPUs): what `drums.ray` places sessions by."""
        return await self._get_json(Capacity, "/v1/capacity")

    async def audit(self, a: str, b: str) -> AuditReport:
        """Isolation and clone checks between sessions `a` and `b` (ids or names)."""
        return await self._get_json(AuditReport, "/v1/audit", params={"a": a, "b": b})

    async def openapi(self) -> str:
        """The API document drumsd serves (YAML text)."""
        r = await self._request("GET", "/openapi.yaml")
        return r.text

    # ---- plumbing (private to the SDK) -----------------------------------

    async def _get_json(
        self, cls: type[T], path: str, *, params: Mapping[str, str] | None = None
    ) -> T:
        r = await self._request("GET", path, params=params)
        return _parse.parse(cls, _decode(r))

    async def _call_json(
        self,
        cls: type[T],
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
        content: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | object | None = ...,
    ) -> T:
        r = await self._request(
            method,
            path,
            json=body,
            params=params,
            content=content,
            headers=headers,
            timeout=timeout,
        )
        return _parse.parse(cls, _decode(r))

    async def _request(
        self,
        method: str,
        path: str | httpx.URL,
        *,
        json: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
        content: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | object | None = ...,
    ) -> httpx.Response:
        """One call, its whole answer read; an error answer raises its class."""
        req = self._build(method, path, json, params, content, headers, timeout)
        r = await self._send(req)
        if r.status_code >= 400:
            await self._raise_error(req, r)
        await self._read_all(r)
        return r

    @asynccontextmanager
    async def _stream(
        self,
        method: str,
        path: str,
        *,
        json: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
        content: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> AsyncIterator[httpx.Response]:
        """A call whose answer is read as it comes (no read timeout: a stream
        lasts as long as its command, or its subscriber). Leaving the block
        closes the connection, which for an exec kills the command."""
        r = await self._open_stream(
            method, path, json=json, params=params, content=content, headers=headers
        )
        try:
            yield r
        finally:
            await r.aclose()

    async def _open_stream(
        self,
        method: str,
        path: str | httpx.URL,
        *,
        json: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
        content: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """`stream` without the block: the caller closes the response. An
        error answer is read, closed and raised here."""
        req = self._build(method, path, json, params, content, headers, None)
        r = await self._send(req)
        if r.status_code >= 400:
            await self._raise_error(req, r)
        return r

    async def _raise_error(self, req: httpx.Request, r: httpx.Response) -> NoReturn:
        """Read an error answer, close it and raise its class.

        The body is read from the raw stream, which, unlike `aread()`, does
        not hand the connection back to the pool at its end: a connection
        that must not be reused is shut while it is still this call's.
        """
        chunks: list[bytes] = []
        try:
            async for chunk in cast(AsyncIterable[bytes], r.stream):
                chunks.append(chunk)
        except httpx.HTTPError as e:
            await r.aclose()
            raise DaemonUnavailable(f"drumsd's answer broke off: {e}") from e
        _drop_connection_after_error(req, r)
        await r.aclose()
        body = b"".join(chunks)
        raise error_from_response(r.status_code, body, r.headers.get("x-request-id"))

    async def _read_all(self, r: httpx.Response) -> bytes:
        try:
            return await r.aread()
        except httpx.HTTPError as e:
            raise DaemonUnavailable(f"drumsd's answer broke off: {e}") from e

    def _build(
        self,
        method: str,
        path: str | httpx.URL,
        json: Mapping[str, Any] | None,
        params: Mapping[str, str] | None,
        content: Any,
        headers: Mapping[str, str] | None,
        timeout: float | object | None,
    ) -> httpx.Request:
        # An httpx.Request made directly, not through build_request: no base
        # URL to merge, no default headers or cookies to fold in, so a
        # command pays for none of it (bench/overhead.py). The timeout always
        # goes in: without it the transport would wait forever.
        if timeout is ...:
            ext = self._timeout_ext
        else:
            t = timeout if timeout is None or isinstance(timeout, int | float) else None
            ext = {"timeout": httpx.Timeout(t, connect=10.0).as_dict()}
        return httpx.Request(
            method,
            path if isinstance(path, httpx.URL) else httpx.URL(_ORIGIN + path),
            json=json,
            params=params,
            content=content,
            headers=headers,
            extensions=ext,
        )

    def _url(self, path: str) -> httpx.URL:
        """A path's URL, made once by a caller that sends to it often."""
        return httpx.URL(_ORIGIN + path)

    async def _send_once(self, req: httpx.Request) -> httpx.Response:
        for hook in self._hooks:
            hook(req)
        r = await self._transport.handle_async_request(req)
        r.request = req
        return r

    async def _send(self, req: httpx.Request) -> httpx.Response:
        """Send; the answer's body is read by the caller (and closed by it)."""
        try:
            return await self._send_once(req)
        except httpx.ConnectError as e:
            _close_failed_socket(e)
            # Nothing listens (no socket, or a dead daemon's): the request was
            # never sent, so it is safe to start a daemon and send it again.
            if not self.autostart:
                raise DaemonUnavailable(
                    f"no drumsd answers on {self.socket} (autostart is off): {e}"
                ) from e
            await self._autostart()
        except httpx.TimeoutException as e:
            raise DaemonUnavailable(f"drumsd did not answer in time ({e!r})") from e
        except httpx.TransportError as e:
            raise DaemonUnavailable(f"drumsd's connection broke: {e}") from e
        try:
            return await self._send_once(req)
        except httpx.TransportError as e:
            raise DaemonUnavailable(f"drumsd started but its connection broke: {e}") from e

    async def _ping(self) -> bool:
        req = self._build("GET", "/v1/version", None, None, None, None, 5.0)
        try:
            r = await self._transport.handle_async_request(req)
            await r.aread()
            await r.aclose()
        except httpx.TransportError as e:
            _close_failed_socket(e)
            return False
        return r.status_code == 200

    async def _autostart(self) -> None:
        """Start drumsd as the CLI does and wait up to 60 s for it to answer."""
        async with self._start_lock:
            # Reap daemons this process started that have exited since.
            _STARTED[:] = [p for p in _STARTED if p.poll() is None]
            if await self._ping():  # another task or thread started it meanwhile
                return
            exe = self._drumsd or os.environ.get("DRUMS_DRUMSD") or shutil.which("drumsd")
            if not exe:
                raise DaemonUnavailable(
                    f"no drumsd answers on {self.socket}, and no drumsd executable to "
                    "start (not on PATH; set DRUMS_DRUMSD)"
                )
            log_path = self.state_dir / "drumsd.log"
            try:
                self.state_dir.mkdir(parents=True, exist_ok=True)
                with open(log_path, "ab") as log:
                    child = subprocess.Popen(
                        [exe, "--state-dir", str(self.state_dir), "--socket", str(self.socket)],
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=log,
                        # Its own session, as the CLI's setsid: a ^C here does
                        # not stop the daemon, which outlives this process.
                        start_new_session=True,
                    )
            except OSError as e:
                raise DaemonUnavailable(f"could not start {exe}: {e}") from e
            # Kept, never waited for: the daemon outlives this process, and a
            # Popen dropped while its child runs would warn.
            _STARTED.append(child)
            deadline = time.monotonic() + AUTOSTART_WAIT_S
            while time.monotonic() < deadline:
                if await self._ping():
                    return
                if child.poll() is not None:  # it refused to start
                    break
                await async_sleep(0.02)
            tail = _tail(log_path, 6)
            raise DaemonUnavailable(f"drumsd could not start (log {log_path}):\n{tail}")


class AsyncDebug:
    """Test-only calls, served by a drumsd started with `--enable-fault-injection`."""

    def __init__(self, client: AsyncClient | None = None) -> None:
        self._client = client

    async def set_fault(self, point: str | None, *, hold: bool = False) -> None:
        """Arm fault `point` (such as `create.subvolume`); None disarms. With
        `hold`, the step waits at the point until drumsd is killed."""
        c = self._client or _default()
        await c._request("POST", "/v1/debug/faults", json={"point": point, "hold": hold})


def _default() -> AsyncClient:
    from drums._default import async_default_client

    return async_default_client()


def _decode(r: httpx.Response) -> object:
    try:
        return json.loads(r.content)
    except ValueError as e:
        raise DrumsError(
            f"drumsd answered {r.request.url.path} with something that is not JSON",
            kind="protocol",
            status=r.status_code,
            request_id=r.headers.get("x-request-id"),
        ) from e


def _drop_connection_after_error(req: httpx.Request, r: httpx.Response) -> None:
    """Keep no connection that answered an error to a request with a body.

    drumsd may answer (404 for no route, 413, 415) before it has read the
    body, then close the connection with that body unread: the kernel resets
    it, and the next request sent on it from the pool fails with "connection
    reset". Shutting the socket now makes the pool see it closed and open a
    new one. Errors are rare, so this costs nothing on the common path.
    """
    if req.method in ("GET", "HEAD", "DELETE") and "content-length" not in req.headers:
        return
    abort_response(r)


def _close_failed_socket(e: BaseException) -> None:
    """Close the socket a failed unix connect leaves open.

    httpcore's sync backend (1.0) does not close the socket whose
    `connect()` failed; it lives on in the traceback's frames until the
    garbage collector warns about it. The frames are this exception's own.
    """
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        tb = cur.__traceback__
        while tb is not None:
            for v in tb.tb_frame.f_locals.values():
                if isinstance(v, pysocket.socket):
                    v.close()
            tb = tb.tb_next
        cur = cur.__context__


def _tail(path: Path, n: int) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as e:
        return f"(cannot read the log: {e})"
    return "\n".join(lines[-n:])
