# GENERATED from src/drums/_async/_commands.py by scripts/unasync.py: do not edit.
"""Commands in a session: `POST /v1/sessions/{s}/exec` and its NDJSON stream."""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import signal as _signal
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Literal, overload

import httpx

from drums import _parse
from drums._sync._client import seg
from drums._backends import Task, abort_response, call_handler
from drums._errors import CommandExitError, CommandTimeout, DaemonUnavailable, DrumsError
from drums._types import CommandResult, Utf8Stream, argv_of, exec_body
from drums.models import ExitStatus

if TYPE_CHECKING:
    from drums._sync._client import Client

# A foreground command that names no timeout is killed after this many
# seconds (E2B's default): an agent's stuck command must not hold it forever.
# Pass timeout=None for no limit.
DEFAULT_COMMAND_TIMEOUT_S = 60.0

OutputHandler = Callable[[str], object]
"""Called with each piece of output as it arrives, decoded as UTF-8. The async
twin also takes a coroutine function."""


class CommandHandle:
    """A command running in the background (`commands.run(..., background=True)`).

    Its output is read as it comes, into `stdout` and `stderr` and to the
    handlers, whether or not anyone waits.
    """

    def __init__(
        self,
        response: httpx.Response,
        on_stdout: OutputHandler | None,
        on_stderr: OutputHandler | None,
        check: bool,
        argv: list[str],
    ) -> None:
        self._r = response
        self._on_stdout = on_stdout
        self._on_stderr = on_stderr
        self._check = check
        self._argv = argv
        self._out = Utf8Stream()
        self._err = Utf8Stream()
        self._killed = False
        # Held only between awaits: `kill()` may shut the socket only while
        # the response is still this command's, never once `_pump` has begun
        # to close it (its connection may go back to the pool and serve
        # another call).
        self._guard = threading.Lock()
        self._finishing = False
        pid = response.headers.get("x-drums-pid", "")
        self.pid: int | None = int(pid) if pid.isdigit() else None
        """The command's pid inside the session (also its process group)."""
        self._task: Task[CommandResult] | None = None

    @property
    def stdout(self) -> str:
        """Its standard output so far."""
        return self._out.text()

    @property
    def stderr(self) -> str:
        """Its standard error so far."""
        return self._err.text()

    def _start_background(self) -> None:
        self._task = Task(self._pump)

    def _pump(self) -> CommandResult:
        """Reads frames up to the exit frame; the response is closed after."""
        status: ExitStatus | None = None
        try:
            try:
                # Lines split from the raw bytes (frames are ASCII JSON): no
                # text decoder in the way. Read on past the exit frame to the
                # body's end (nothing follows it): a response read whole
                # returns its connection to the pool, where a cut one is closed.
                buf = b""
                for chunk in self._r.iter_raw():
                    buf += chunk
                    *lines, buf = buf.split(b"\n")
                    for line in lines:
                        if line and status is None:
                            status = self._frame(line)
                if buf.strip() and status is None:
                    status = self._frame(buf)
            except httpx.HTTPError as e:
                if not self._killed:
                    raise DaemonUnavailable(
                        f"the output stream of {self._argv[0]!r} broke off before its exit "
                        f"status (drumsd or the session went away): {e}"
                    ) from e
        finally:
            with self._guard:
                self._finishing = True
            self._r.close()
        out, err = self._out.finish(), self._err.finish()
        if out and self._on_stdout:
            call_handler(self._on_stdout, out)
        if err and self._on_stderr:
            call_handler(self._on_stderr, err)
        if status is None:
            if not self._killed:
                raise DaemonUnavailable(
                    f"the output stream of {self._argv[0]!r} ended without an exit status "
                    "(drumsd or the session went away)"
                )
            # Closing the stream made the session SIGKILL the command's group
            # (docs/guest-api.md, "client disconnect").
            return CommandResult(self.stdout, self.stderr, None, int(_signal.SIGKILL), False)
        result = CommandResult(
            self.stdout, self.stderr, status.code, status.signal, status.timed_out
        )
        if self._check:
            _check(result, self._argv)
        return result

    def _frame(self, line: bytes) -> ExitStatus | None:
        try:
            frame = json.loads(line)
        except ValueError as e:
            raise DrumsError(
                f"an exec frame that is not JSON: {line[:200]!r}", kind="protocol"
            ) from e
        if not isinstance(frame, dict):
            raise DrumsError(
                f"an exec frame that is not an object: {line[:200]!r}", kind="protocol"
            )
        if "exit" in frame:
            return _parse.parse(ExitStatus, frame["exit"], "ExecFrame.exit")
        stream, data = frame.get("stream"), frame.get("data")
        if stream not in ("stdout", "stderr") or not isinstance(data, str):
            raise DrumsError(f"an exec frame of no known shape: {line[:200]!r}", kind="protocol")
        try:
            raw = base64.b64decode(data, validate=True)
        except binascii.Error as e:
            raise DrumsError("an exec frame whose data is not base64", kind="protocol") from e
        if stream == "stdout":
            text = self._out.feed(raw)
            if text and self._on_stdout:
                call_handler(self._on_stdout, text)
        else:
            text = self._err.feed(raw)
            if text and self._on_stderr:
                call_handler(self._on_stderr, text)
        return None

    def wait(self) -> CommandResult:
        """Wait for the command to end and return its result (raising
        `CommandExitError` if it was started with `check=True` and failed)."""
        assert self._task is not None
        return self._task.join()

    def kill(self) -> None:
        """Kill the command: closing its stream makes the session SIGKILL its
        process group. A later `wait()` returns what it wrote, with signal 9."""
        with self._guard:
            self._killed = True
            if not self._finishing:
                abort_response(self._r)
        if self._task is not None:
            with contextlib.suppress(DrumsError):
                self._task.join()


def _check(result: CommandResult, argv: list[str]) -> None:
    what = argv[2] if argv[:2] == ["/bin/sh", "-c"] and len(argv) > 2 else " ".join(argv)
    if result.timed_out:
        raise CommandTimeout(f"command timed out: {what}", result)
    if result.exit_code != 0:
        how = (
            f"exit code {result.exit_code}"
            if result.exit_code is not None
            else f"signal {result.signal}"
        )
        tail = result.stderr.strip()[-2000:]
        raise CommandExitError(
            f"command failed with {how}: {what}" + (f"\n{tail}" if tail else ""), result
        )


class Commands:
    """Commands in one session (`sandbox.commands`)."""

    def __init__(self, client: Client, session_id: str) -> None:
        self._client = client
        self._path = client._url(f"/v1/sessions/{seg(session_id)}/exec")

    @overload
    def run(
        self,
        cmd: str | Sequence[str],
        *,
        background: Literal[False] = False,
        cwd: str | None = None,
        envs: Mapping[str, str] | None = None,
        user: str | int | None = None,
        timeout: float | None = DEFAULT_COMMAND_TIMEOUT_S,
        on_stdout: OutputHandler | None = None,
        on_stderr: OutputHandler | None = None,
        check: bool = False,
    ) -> CommandResult: ...

    @overload
    def run(
        self,
        cmd: str | Sequence[str],
        *,
        background: Literal[True],
        cwd: str | None = None,
        envs: Mapping[str, str] | None = None,
        user: str | int | None = None,
        timeout: float | None = None,
        on_stdout: OutputHandler | None = None,
        on_stderr: OutputHandler | None = None,
        check: bool = False,
    ) -> CommandHandle: ...

    def run(
        self,
        cmd: str | Sequence[str],
        *,
        background: bool = False,
        cwd: str | None = None,
        envs: Mapping[str, str] | None = None,
        user: str | int | None = None,
        timeout: float | object | None = ...,
        on_stdout: OutputHandler | None = None,
        on_stderr: OutputHandler | None = None,
        check: bool = False,
    ) -> CommandResult | CommandHandle:
        """Run a command in the session; its output streams as it comes.

        Args:
            cmd: a str runs under `/bin/sh -c` (E2B's behaviour: pipes,
                globs and `&&` work); a list is the argv itself, no shell.
            background: return an `CommandHandle` at once instead of
                waiting for the end.
            cwd: working directory (default: the user's home, else `/`).
            envs: extra environment variables.
            user: user name or uid in the session (default root).
            timeout: seconds after which the session kills the command
                (default 60 in the foreground, none in the background; None:
                no limit).
            on_stdout: called with each piece of standard output.
            on_stderr: called with each piece of standard error.
            check: raise `CommandExitError` (`CommandTimeout` after a
                timeout) unless it exits 0.

        Returns:
            a `CommandResult`: a non-zero exit is a result, not an exception,
            unless `check`.

        Raises:
            CommandNotFound: `argv[0]` is not in the session.
            PermissionDenied: the user may not run it, or enter `cwd`.
            NotFound: no such session, user or `cwd`.
        """
        if timeout is ...:
            timeout = None if background else DEFAULT_COMMAND_TIMEOUT_S
        if timeout is not None and not isinstance(timeout, int | float):
            raise TypeError(f"timeout must be a number of seconds or None, not {timeout!r}")
        argv = argv_of(cmd)
        body = exec_body(argv, cwd=cwd, envs=envs, user=user, timeout=timeout)
        r = self._client._open_stream("POST", self._path, json=body)
        handle = CommandHandle(r, on_stdout, on_stderr, check, argv)
        if background:
            handle._start_background()
            return handle
        return handle._pump()

    def detach(
        self,
        cmd: str | Sequence[str],
        *,
        cwd: str | None = None,
        envs: Mapping[str, str] | None = None,
        user: str | int | None = None,
        timeout: float | None = None,
        log: str | None = None,
    ) -> int:
        """Start a command and leave it running without a stream (the API's
        `detach`, `podman exec -d`); its output goes to `log` inside the
        session (default /dev/null), appended. Returns its pid in the session."""
        argv = argv_of(cmd)
        body = exec_body(argv, cwd=cwd, envs=envs, user=user, timeout=timeout, detach=True, log=log)
        r = self._client._request("POST", self._path, json=body)
        try:
            pid = json.loads(r.content)["pid"]
        except (ValueError, KeyError, TypeError) as e:
            raise DrumsError("a detached exec answered without a pid", kind="protocol") from e
        if not isinstance(pid, int) or isinstance(pid, bool):
            raise DrumsError(f"a detached exec answered pid {pid!r}", kind="protocol")
        return pid

    def kill(self, pid: int, *, signal: int = _signal.SIGKILL) -> bool:
        """Send `signal` to process `pid` in the session (the API has no kill:
        this runs `kill -s SIG PID` as an argv, not through a shell). Returns
        whether the signal was delivered."""
        if isinstance(pid, bool) or not isinstance(pid, int):
            raise TypeError(f"pid must be an int, not {pid!r}")
        res = self.run(["kill", "-s", _signal.Signals(signal).name[3:], str(pid)])
        return res.exit_code == 0
