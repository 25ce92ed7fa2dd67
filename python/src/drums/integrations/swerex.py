"""A SWE-ReX deployment whose runtime is a drums sandbox, driven through the
SDK: no server runs in the sandbox.

    from drums.integrations.swerex import DrumsDeployment
    from swerex.runtime.abstract import BashAction, CreateBashSessionRequest

    deployment = DrumsDeployment(image="default")
    await deployment.start()
    rt = deployment.runtime
    await rt.create_session(CreateBashSessionRequest())
    obs = await rt.run_in_session(BashAction(command="cd /tmp && export X=1"))
    obs = await rt.run_in_session(BashAction(command="pwd; echo $X"))  # /tmp, 1
    await deployment.stop()

**Bash sessions.** `create_session` starts one long-lived `bash` in the
sandbox (detached), reading its commands from a fifo; `run_in_session` writes
the command to a file there, checks it with `bash -n` (a syntax error raises
`BashIncorrectSyntaxError`, as SWE-ReX's local runtime does), and has that
bash source it, so `cd`, variables, functions and aliases persist from one
call to the next. What differs from SWE-ReX's pexpect session:

- there is no terminal: commands run with stdin from /dev/null and stdout
  and stderr into one file, so `isatty` is false, and interactive programs
  (`is_interactive_command`, `is_interactive_quit`, `expect`) are refused
  with `NotImplementedError`;
- the output is what the command wrote, byte for byte (no `\\r\\n`, no echo),
  and `expect_string` is always "";
- a `BashInterruptAction` sends SIGINT to the bash's child processes
  (`pkill -INT -P`, from procps), then waits for the interrupted command to
  end; after `n_retry` tries it sends SIGKILL instead. The running program
  stops, but the rest of the command's line goes on (a terminal's Ctrl-C
  would abandon it);
- a command that makes the bash exit raises `SessionNotInitializedError`.

**Commands** (`execute`) run as `subprocess.run` would: a `str` with
`shell=True` under `/bin/sh -c`, a list as the argv; `env` replaces the
whole environment (through `env -i`); a timeout raises `CommandTimeoutError`,
a non-zero exit with `check` raises `NonZeroExitCodeError`, and a missing
program raises `FileNotFoundError`, as in SWE-ReX's local runtime.

Each call opens its own connection to drumsd, so the deployment works from
one event loop or from several (`asyncio.run` per call, as mini-swe-agent's
SWE-ReX environments do).
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import logging
import os
import posixpath
import secrets
import shlex
import signal
import tarfile
import tempfile
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO, Any, Literal

try:
    from pydantic import BaseModel, ConfigDict
    from swerex.deployment.abstract import AbstractDeployment
    from swerex.deployment.hooks.abstract import CombinedDeploymentHook, DeploymentHook
    from swerex.exceptions import (
        BashIncorrectSyntaxError,
        CommandTimeoutError,
        DeploymentNotStartedError,
        NonZeroExitCodeError,
        SessionDoesNotExistError,
        SessionExistsError,
        SessionNotInitializedError,
    )
    from swerex.runtime.abstract import (
        AbstractRuntime,
        Action,
        BashInterruptAction,
        BashObservation,
        CloseBashSessionResponse,
        CloseResponse,
        CloseSessionRequest,
        CloseSessionResponse,
        Command,
        CommandResponse,
        CreateBashSessionRequest,
        CreateBashSessionResponse,
        CreateSessionRequest,
        CreateSessionResponse,
        IsAliveResponse,
        Observation,
        ReadFileRequest,
        ReadFileResponse,
        UploadRequest,
        UploadResponse,
        WriteFileRequest,
        WriteFileResponse,
    )
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError(
        "drums.integrations.swerex needs SWE-ReX: pip install swe-rex (drums tests 1.4.0)"
    ) from e

import drums
from drums.models import Session

__all__ = ["DrumsDeployment", "DrumsDeploymentConfig", "DrumsRuntime"]

_log = logging.getLogger("drums.integrations.swerex")

# The runner of one command of a bash session, run by exec in the sandbox:
#   run.sh DIR N PID LINE   check DIR/cmd-N, hand LINE to the bash, wait
#   run.sh DIR N PID        only wait for command N (after an interrupt)
# The bash, once done with command N, creates DIR/rc-N.STATUS (a file's
# creation is atomic: the status is whole or absent) and writes a byte to the
# fifo DIR/done-N, opened read-write so that the write never blocks even when
# no runner waits any more (a runner killed by its timeout). The runner
# prints the command's output on stdout and its verdict on stderr's last line.
_RUN_SH = r"""#!/bin/bash
d=$1 n=$2 pid=$3
fifo=$d/done-$n
if [ $# -eq 4 ]; then
  if ! bash -n "$d/cmd-$n" 2>"$d/syntax-$n"; then
    cat "$d/syntax-$n"
    rm -f "$d/syntax-$n" "$d/cmd-$n"
    echo "DRUMS_REX syntax" >&2
    exit 0
  fi
  rm -f "$d/syntax-$n"
  mkfifo "$fifo" || exit 1
fi
exec 4<>"$fifo" || exit 1
if [ $# -eq 4 ]; then printf '%s\n' "$4" >"$d/in" || exit 1; fi
while :; do
  for f in "$d/rc-$n".*; do
    if [ -e "$f" ]; then
      cat "$d/out-$n"
      rm -f "$d/cmd-$n" "$d/out-$n" "$f" "$fifo"
      echo "DRUMS_REX rc ${f##*.}" >&2
      exit 0
    fi
  done
  if ! kill -0 "$pid" 2>/dev/null; then
    cat "$d/out-$n" 2>/dev/null
    echo "DRUMS_REX dead" >&2
    exit 0
  fi
  read -r -t 1 -n 1 -u 4 x
done
"""

# The session's bash: its stdin is the fifo DIR/in, opened read-write, so
# that it never sees an end of file between two commands.
_BASH = 'exec bash --noprofile --norc -s 0<>"$1"'


class DrumsDeploymentConfig(BaseModel):
    """What a `DrumsDeployment` makes (SWE-ReX's deployment-config shape)."""

    image: str = ""
    """A drums image or an OCI reference (default: drumsd's, `default`)."""
    profile: str = ""
    """`headless` (default) or `desktop`."""
    name: str = ""
    """The session's name (default: drumsd picks one)."""
    from_checkpoint: str = ""
    """Restore this checkpoint (id or name) instead, or `pool=NAME`: take a
    ready member of warm pool NAME."""
    sandbox_kwargs: dict[str, Any] = {}
    """More arguments of `drums.AsyncSandbox.create` (`memory`, `cpus`, ...)."""
    socket: str = ""
    """drumsd's socket (default: as the SDK finds it, `DRUMS_SOCKET` ...)."""

    type: Literal["drums"] = "drums"
    """Discriminator, as SWE-ReX's deployment configs have one."""

    model_config = ConfigDict(extra="forbid")

    def get_deployment(self) -> DrumsDeployment:
        return DrumsDeployment.from_config(self)


@asynccontextmanager
async def _client(socket: str) -> AsyncIterator[drums.AsyncClient]:
    # One client per call, closed at its end: an httpx connection belongs to
    # the event loop that opened it, and a SWE-ReX caller may use a new loop
    # for every call. A unix-socket connect costs tens of microseconds.
    async with drums.AsyncClient(socket or None) as c:
        yield c


class DrumsDeployment(AbstractDeployment):
    """A SWE-ReX deployment: one drums session per `start()`, removed by
    `stop()` (and, if `stop()` is never awaited, when the deployment is
    collected or the interpreter exits).

    Args:
        logger: where to log (default `drums.integrations.swerex`).
        **kwargs: the fields of `DrumsDeploymentConfig`.
    """

    def __init__(self, *, logger: logging.Logger | None = None, **kwargs: Any) -> None:
        self._config = DrumsDeploymentConfig(**kwargs)
        self.logger = logger or _log
        self._runtime: DrumsRuntime | None = None
        self._hooks = CombinedDeploymentHook()
        # Set by start(): removes a session never stopped (see __del__).
        self._finalizer: Callable[[], object] | None = None

    @classmethod
    def from_config(cls, config: DrumsDeploymentConfig) -> DrumsDeployment:
        return cls(**config.model_dump(exclude={"type"}))

    def add_hook(self, hook: DeploymentHook) -> None:
        self._hooks.add_hook(hook)

    async def is_alive(self, *, timeout: float | None = None) -> IsAliveResponse:
        """Whether the session runs (False before `start()`, as SWE-ReX's
        local deployment answers)."""
        if self._runtime is None:
            return IsAliveResponse(is_alive=False, message="Runtime is None.")
        return await self._runtime.is_alive(timeout=timeout)

    async def start(self) -> None:
        """Make the session (raises `drums.DrumsError`, e.g. `NotFound` for
        an image that does not exist; nothing is left behind then)."""
        if self._runtime is not None:
            return
        c = self._config
        self._hooks.on_custom_step("Starting drums session")
        async with _client(c.socket) as client:
            if c.from_checkpoint.startswith("pool="):
                pool = await drums.AsyncPool.connect(
                    c.from_checkpoint.removeprefix("pool="), client=client
                )
                sb = await pool.take()
            elif c.from_checkpoint:
                ck = await client.checkpoints.get(c.from_checkpoint)
                sb = (await ck.restore(1, name=c.name or None))[0]
            else:
                sb = await drums.AsyncSandbox.create(
                    image=c.image or None,
                    profile=c.profile or None,  # type: ignore[arg-type]  # drumsd checks it
                    name=c.name or None,
                    client=client,
                    **c.sandbox_kwargs,
                )
        self._finalizer = weakref.finalize(self, _remove, c.socket, sb.id, self.logger)
        self._runtime = DrumsRuntime(sb.info, socket=c.socket, logger=self.logger)
        self.logger.info("drums session %s (%s) ready", sb.name, sb.id)

    async def stop(self) -> None:
        """Remove the session (its bash sessions go with it)."""
        rt, self._runtime = self._runtime, None
        if rt is None:
            return
        async with _client(self._config.socket) as client:
            await drums.AsyncSandbox(rt.session, client=client).kill()
        if isinstance(self._finalizer, weakref.finalize):
            self._finalizer.detach()

    @property
    def runtime(self) -> DrumsRuntime:
        """The runtime; `DeploymentNotStartedError` before `start()`."""
        if self._runtime is None:
            raise DeploymentNotStartedError()  # type: ignore[no-untyped-call]  # SWE-ReX's
        return self._runtime

    @property
    def sandbox_id(self) -> str:
        """The session's id (`DeploymentNotStartedError` before `start()`)."""
        return self.runtime.session.id

    def __del__(self) -> None:
        # The weakref finalizer removes a session that was never stopped, on
        # any thread and without an event loop; SWE-ReX's own __del__ would
        # run `stop()` on whatever loop it finds.
        pass


def _remove(socket: str, session_id: str, logger: logging.Logger) -> None:
    """The finalizer of a deployment that was not stopped."""
    try:
        with drums.Client(socket or None) as c:
            drums.Sandbox.connect(session_id, client=c).kill()
    except drums.NotFound:
        pass
    except Exception as e:  # drumsd gone at exit: say so, never raise from a finalizer
        logger.warning("could not remove drums session %s: %s", session_id, e)


class _BashSession:
    def __init__(self, directory: str, pid: int) -> None:
        self.dir = directory
        self.pid = pid
        self.counter = itertools.count()
        self.pending: int | None = None
        """A command whose runner timed out: what an interrupt waits for."""


class DrumsRuntime(AbstractRuntime):
    """SWE-ReX's runtime interface over a drums session, through the SDK.

    Made by `DrumsDeployment.start()`; see the module's docstring for how
    its bash sessions work and where they differ from SWE-ReX's.
    """

    def __init__(
        self, session: Session, *, socket: str = "", logger: logging.Logger | None = None
    ) -> None:
        self.session = session
        """The drums session, as drumsd described it when it was made."""
        self._socket = socket
        self.logger = logger or _log
        self._sessions: dict[str, _BashSession] = {}
        self._n = itertools.count()
        # Our files in the sandbox: a name the session cannot predict, so
        # that nothing prepared there in advance is ours to trust.
        self._base = f"/tmp/.drums-rex-{secrets.token_hex(8)}"

    @asynccontextmanager
    async def _sb(self) -> AsyncIterator[drums.AsyncSandbox]:
        async with _client(self._socket) as c:
            yield drums.AsyncSandbox(self.session, client=c)

    async def is_alive(self, *, timeout: float | None = None) -> IsAliveResponse:
        try:
            async with self._sb() as sb:
                info = await asyncio.wait_for(sb.refresh(), timeout)
        except (drums.DrumsError, TimeoutError) as e:
            return IsAliveResponse(is_alive=False, message=str(e))
        if info.state != "running":
            return IsAliveResponse(is_alive=False, message=f"session is {info.state}")
        return IsAliveResponse(is_alive=True)

    # ---- bash sessions ---------------------------------------------------------

    async def create_session(self, request: CreateSessionRequest) -> CreateSessionResponse:
        if request.session in self._sessions:
            raise SessionExistsError(f"session {request.session} already exists")
        if not isinstance(request, CreateBashSessionRequest):
            raise ValueError(f"unknown session type: {request!r}")
        d = f"{self._base}/{next(self._n)}"
        async with self._sb() as sb:
            await sb.commands.run(["mkdir", "-p", d], check=True)
            await sb.files.write(f"{d}/run.sh", _RUN_SH, mode=0o700)
            await sb.commands.run(["mkfifo", f"{d}/in"], check=True)
            pid = await sb.commands.detach(["bash", "-c", _BASH, "bash", f"{d}/in"], log=f"{d}/log")
        session = _BashSession(d, pid)
        self._sessions[request.session] = session
        output = ""
        for path in request.startup_source:
            obs = await self._run(
                session, f". {shlex.quote(path)}", request.startup_timeout, "silent"
            )
            output += obs.output
        return CreateBashSessionResponse(output=output)

    async def run_in_session(self, action: Action) -> Observation:
        if action.session not in self._sessions:
            raise SessionDoesNotExistError(f"session {action.session!r} does not exist")
        session = self._sessions[action.session]
        if isinstance(action, BashInterruptAction):
            return await self._interrupt(session, action)
        if action.is_interactive_command or action.is_interactive_quit or action.expect:
            raise NotImplementedError(
                "drums' bash sessions have no terminal: interactive commands and `expect` "
                "are not supported"
            )
        obs = await self._run(session, action.command, action.timeout, action.check)
        if action.check == "raise" and obs.exit_code != 0:
            msg = (
                f"Command {action.command!r} failed with exit code {obs.exit_code}. "
                f"Here is the output:\n{obs.output!r}"
            )
            if action.error_msg:
                msg = f"{action.error_msg}: {msg}"
            raise NonZeroExitCodeError(msg)
        return obs

    async def _run(
        self,
        session: _BashSession,
        command: str,
        timeout: float | None,
        check: Literal["silent", "raise", "ignore"],
    ) -> BashObservation:
        n = next(session.counter)
        d = session.dir
        q = shlex.quote
        line = (
            f". {q(f'{d}/cmd-{n}')} </dev/null >{q(f'{d}/out-{n}')} 2>&1; "
            f": >{q(f'{d}/rc-{n}')}.$?; printf x 1<>{q(f'{d}/done-{n}')}"
        )
        async with self._sb() as sb:
            # The command goes as a file's contents, never into a shell string.
            await sb.files.write(f"{d}/cmd-{n}", command)
            r = await sb.commands.run(
                ["bash", f"{d}/run.sh", d, str(n), str(session.pid), line], timeout=timeout
            )
        if r.timed_out:
            session.pending = n
            raise CommandTimeoutError(
                f"timeout after {timeout} seconds while running command {command!r}"
            )
        verdict = _verdict(r)
        if verdict == "syntax":
            raise BashIncorrectSyntaxError(
                f"Error (exit code 2) while checking bash command \n{command!r}\n"
                f"---- Stderr ----\n{r.stdout}\n---- Stdout ----\n",
                extra_info={"bash_stdout": "", "bash_stderr": r.stdout},
            )
        if verdict == "dead":
            del_name = next((k for k, v in self._sessions.items() if v is session), None)
            if del_name is not None:
                del self._sessions[del_name]
            raise SessionNotInitializedError(
                f"the bash session exited while running {command!r}; output:\n{r.stdout}"
            )
        code = int(verdict)
        return BashObservation(output=r.stdout, exit_code=None if check == "ignore" else code)

    async def _interrupt(
        self, session: _BashSession, action: BashInterruptAction
    ) -> BashObservation:
        n = session.pending
        sig = signal.SIGINT
        for attempt in range(max(1, action.n_retry) + 1):
            if attempt == action.n_retry:
                sig = signal.SIGKILL
            async with self._sb() as sb:
                await sb.commands.run(["pkill", f"-{sig.name[3:]}", "-P", str(session.pid)])
                if n is None:
                    return BashObservation(output="", exit_code=0)
                r = await sb.commands.run(
                    ["bash", f"{session.dir}/run.sh", session.dir, str(n), str(session.pid)],
                    timeout=action.timeout,
                )
            if not r.timed_out:
                session.pending = None
                return BashObservation(output=r.stdout.strip(), exit_code=0)
        raise CommandTimeoutError("Failed to interrupt session")

    async def close_session(self, request: CloseSessionRequest) -> CloseSessionResponse:
        if request.session not in self._sessions:
            raise SessionDoesNotExistError(f"session {request.session!r} does not exist")
        session = self._sessions.pop(request.session)
        async with self._sb() as sb:
            await sb.commands.run(["kill", "-s", "KILL", "--", f"-{session.pid}"])
            await sb.commands.run(["rm", "-rf", "--", session.dir])
        return CloseBashSessionResponse()

    # ---- commands and files ----------------------------------------------------

    async def execute(self, command: Command) -> CommandResponse:
        cmd = command.command
        if command.shell:
            argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else ["/bin/sh", "-c", *cmd]
        else:
            argv = [cmd] if isinstance(cmd, str) else list(cmd)
        if command.env is not None:
            # subprocess's env= is the whole environment.
            argv = ["env", "-i", *(f"{k}={v}" for k, v in command.env.items()), *argv]
        if command.merge_output_streams:
            argv = ["/bin/sh", "-c", 'exec "$@" 2>&1', "sh", *argv]
        try:
            async with self._sb() as sb:
                r = await sb.commands.run(argv, cwd=command.cwd, timeout=command.timeout)
        except drums.CommandNotFound as e:
            raise FileNotFoundError(errno.ENOENT, e.message, argv[0]) from e
        if r.timed_out:
            raise CommandTimeoutError(
                f"Timeout ({command.timeout}s) exceeded while running command"
            )
        code = r.exit_code if r.exit_code is not None else -(r.signal or 0)
        out = CommandResponse(stdout=r.stdout, stderr=r.stderr, exit_code=code)
        if command.check and code != 0:
            msg = (
                f"Command {command.command!r} failed with exit code {code}. "
                f"Stdout:\n{out.stdout!r}\nStderr:\n{out.stderr!r}"
            )
            if command.error_msg:
                msg = f"{command.error_msg}: {msg}"
            raise NonZeroExitCodeError(msg)
        return out

    async def read_file(self, request: ReadFileRequest) -> ReadFileResponse:
        try:
            async with self._sb() as sb:
                data = await sb.files.read(request.path, format="bytes")
        except drums.NotFound as e:
            raise FileNotFoundError(errno.ENOENT, e.message, request.path) from e
        content = data.decode(request.encoding or "utf-8", request.errors or "strict")
        return ReadFileResponse(content=content)

    async def write_file(self, request: WriteFileRequest) -> WriteFileResponse:
        async with self._sb() as sb:
            # The parents are made, as SWE-ReX's local runtime makes them.
            await sb.commands.run(["mkdir", "-p", "--", _parent(request.path)], cwd="/", check=True)
            await sb.files.write(request.path, request.content)
        return WriteFileResponse()

    async def upload(self, request: UploadRequest) -> UploadResponse:
        """A file, or a directory's contents into `target_path` (made if
        missing), sent as one tar archive and unpacked in the session."""
        source, kind = await asyncio.to_thread(_source_kind, request.source_path)
        target = request.target_path
        async with self._sb() as sb:
            if kind == "file":
                await sb.commands.run(["mkdir", "-p", "--", _parent(target)], cwd="/", check=True)
                with open(source, "rb") as f:
                    await sb.files.write(target, f, mode=os.fstat(f.fileno()).st_mode & 0o7777)
            elif kind == "dir":
                archive = f"{self._base}/upload-{secrets.token_hex(8)}.tar"
                await sb.commands.run(
                    ["mkdir", "-p", "--", self._base, target], cwd="/", check=True
                )
                with tempfile.TemporaryFile() as tmp:
                    # A big tree takes a while to pack: not on the event loop.
                    await asyncio.to_thread(_pack, source, tmp)
                    await sb.files.write(archive, tmp, mode=0o600)
                try:
                    await sb.commands.run(
                        ["tar", "-xf", archive, "-C", target, "--no-same-owner"],
                        cwd="/",
                        check=True,
                        timeout=None,
                    )
                finally:
                    await sb.commands.run(["rm", "-f", "--", archive])
            else:
                raise ValueError(f"Source path {source} is not a file or directory")
        return UploadResponse()

    async def close(self) -> CloseResponse:
        """Close every bash session."""
        for name in list(self._sessions):
            await self.close_session(CloseSessionRequest(session=name))
        return CloseResponse()


def _source_kind(path: str) -> tuple[Path, str]:
    source = Path(path).resolve()
    return source, "file" if source.is_file() else "dir" if source.is_dir() else "none"


def _pack(source: Path, into: IO[bytes]) -> None:
    with tarfile.open(fileobj=into, mode="w") as tar:
        tar.add(source, arcname=".")
    into.seek(0)


def _parent(path: str) -> str:
    return posixpath.dirname(posixpath.normpath(path)) or "."


def _verdict(r: drums.CommandResult) -> str:
    """The runner's verdict: an exit status, `syntax` or `dead`. What the
    sandbox sent is parsed, never trusted further."""
    lines = r.stderr.strip().splitlines()
    last = lines[-1].split() if lines else []
    if r.exit_code == 0 and len(last) >= 2 and last[0] == "DRUMS_REX":
        if last[1] in ("syntax", "dead") and len(last) == 2:
            return last[1]
        if last[1] == "rc" and len(last) == 3 and last[2].isdigit() and len(last[2]) <= 3:
            return last[2]
    raise drums.DrumsError(
        f"the bash session's runner failed (exit {r.exit_code}): {r.stderr[-500:]!r}",
        kind="swerex_runner",
    )
