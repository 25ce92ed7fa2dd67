"""A Harbor environment whose trials run in drums sessions.

Select it by its import path (Harbor >= 0.26; the package on `PYTHONPATH`):

    harbor run -p TASKS -a oracle \\
      -e drums.integrations.harbor:DrumsEnvironment \\
      --ek socket=/var/lib/drums/drumsd.sock --ek insecure=true

Each trial's environment is one drums session. `start()` builds the task's
`environment/Dockerfile` with `drums build` (buildah; cached by drums' own
build cache, keyed by the build's inputs) into the image
`localhost/harbor-ENVIRONMENT_ID:latest`, or uses the task's prebuilt
`[environment].docker_image` (pulled unless drumsd holds it already), then
creates the session with the task's `cpus`, `memory_mb` and `storage_mb` as
its limits and egress `nat` only when the task's network policy is public
(`none` otherwise). `stop()` removes the session; images stay, as the
build cache's.

Options (`--ek key=value`, all optional; an unknown one fails the job at
preflight):

- `socket`: drumsd's socket (default: as the SDK finds it, `DRUMS_SOCKET`...).
- `state_dir`: drumsd's state directory, for `drums build`'s own buildah
  storage (default: the CLI's, `DRUMS_STATE_DIR` or `/var/lib/drums`).
- `drums`: the `drums` CLI that builds (default: `drums` on `PATH`).
- `insecure`: FROM images (and a prebuilt `docker_image`) come from a
  plain-HTTP registry, such as one on loopback.
- `build_network`: a Dockerfile's RUN steps get the host's network
  (`drums build --network`); off by default: give it only to Dockerfiles
  you trust.
- `keep`: leave the session when the trial ends, for debugging.
- `sandbox_kwargs`: more arguments of `drums.aio.AsyncSandbox.create`
  (`pids`, `privileged`, ...), as JSON.

What differs from Harbor's docker environment is in docs/integrations.md.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import secrets
import shutil
import stat
import tarfile
import tempfile
import weakref
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

from harbor.environments.base import (  # type: ignore[import-untyped]
    BaseEnvironment,
    ExecResult,
    SandboxBuildFailedError,
    transfer_tar_filter,
)
from harbor.environments.capabilities import (  # type: ignore[import-untyped]
    EnvironmentCapabilities,
    EnvironmentResourceCapabilities,
)
from harbor.environments.definition import (  # type: ignore[import-untyped]
    COMPOSE_FILE_NAME,
    DOCKERFILE_NAME,
    should_use_prebuilt_docker_image,
)
from harbor.environments.options import EnvironmentOptions  # type: ignore[import-untyped]
from harbor.models.trial.paths import EnvironmentPaths  # type: ignore[import-untyped]
from pydantic import Field, field_validator

from drums import AsyncClient, AsyncSandbox, Client, DrumsError

__all__ = ["DrumsEnvironment", "DrumsOptions"]

# Arguments of AsyncSandbox.create that the environment sets itself.
_OWN_CREATE_ARGS = frozenset({"image", "cpus", "memory", "disk", "egress", "client"})
# The last lines of a failed build's output that its error carries.
_BUILD_TAIL_LINES = 40


class DrumsOptions(EnvironmentOptions):  # type: ignore[misc]
    """`DrumsEnvironment`'s options, from `--ek key=value` (see the module)."""

    socket: str = Field(default="", description="drumsd's socket")
    state_dir: str = Field(default="", description="drumsd's state directory, for builds")
    drums: str = Field(default="", description="the drums CLI (default: drums on PATH)")
    insecure: bool = Field(default=False, description="FROM/docker_image over plain HTTP")
    build_network: bool = Field(default=False, description="RUN steps get the host's network")
    keep: bool = Field(default=False, description="leave the session when the trial ends")
    sandbox_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="more arguments of AsyncSandbox.create"
    )

    @field_validator("sandbox_kwargs")
    @classmethod
    def _known_create_args(cls, value: dict[str, Any]) -> dict[str, Any]:
        known = set(inspect.signature(AsyncSandbox.create).parameters) - {"cls"}
        own = sorted(_OWN_CREATE_ARGS & set(value))
        if own:
            raise ValueError(f"set by the environment itself: {', '.join(own)}")
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"not arguments of AsyncSandbox.create: {', '.join(unknown)}")
        return value


class DrumsEnvironment(BaseEnvironment):  # type: ignore[misc]
    """A Harbor `BaseEnvironment` over one drums session (see the module).

    Beyond Harbor's contract: `sandbox` (the SDK's session, once started),
    `rollback()` and `fork(n)`.
    """

    options_model: ClassVar[type[EnvironmentOptions]] = DrumsOptions
    # One build at a time per environment definition (Harbor's docker
    # environment locks the same way): concurrent trials of one task share it.
    # Per event loop: a lock belongs to the loop that first waits on it.
    _build_locks: ClassVar[
        weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Lock]]
    ] = weakref.WeakKeyDictionary()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._client: AsyncClient | None = None
        self._sandbox: AsyncSandbox | None = None
        super().__init__(*args, **kwargs)
        self.options: DrumsOptions

    # ---- what Harbor asks of an environment ------------------------------------

    @staticmethod
    def type() -> str:
        return "drums"

    @classmethod
    def preflight(cls, kwargs: dict[str, Any] | None = None) -> None:
        """Once per job, before any trial: the options parse (an unknown one
        is an error), the `drums` CLI given is there, and drumsd answers.
        Harbor prints a `ValueError` and exits 1."""
        super().preflight(kwargs)
        o = cls.parse_options(kwargs)
        if o.drums and not (os.path.isfile(o.drums) and os.access(o.drums, os.X_OK)):
            raise ValueError(f"drums: the drums CLI {o.drums} is not an executable file")
        try:
            with Client(o.socket or None, state_dir=o.state_dir or None) as c:
                c.version()
        except DrumsError as e:
            raise ValueError(f"drums: drumsd does not answer: {e}") from None

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        # No mounts, no compose, no allowlist, no GPUs, no Windows, no stream.
        return EnvironmentCapabilities(disable_internet=True)

    @classmethod
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities:
        return EnvironmentResourceCapabilities(
            cpu_limit=True, memory_limit=True, fractional_cpus=True
        )

    def _validate_definition(self) -> None:
        env_dir = Path(self.environment_dir)
        if (env_dir / COMPOSE_FILE_NAME).exists() or self.extra_docker_compose_paths:
            raise ValueError(
                f"drums: {env_dir} uses docker compose, which the drums environment "
                "does not run (one session per environment)"
            )
        if not (env_dir / DOCKERFILE_NAME).is_file() and not self.task_env_config.docker_image:
            raise FileNotFoundError(
                f"drums: the task has no {env_dir / DOCKERFILE_NAME} and no "
                "[environment].docker_image: nothing to start a session from"
            )

    async def start(self, force_build: bool) -> None:
        if self._sandbox is not None:
            raise RuntimeError(f"drums: {self.session_id} is started already")
        o = self.options
        self._client = AsyncClient(o.socket or None, state_dir=o.state_dir or None)
        try:
            prebuilt = should_use_prebuilt_docker_image(
                Path(self.environment_dir),
                docker_image=self.task_env_config.docker_image,
                force_build=force_build,
            )
            if prebuilt:
                image = await self._prebuilt(self.task_env_config.docker_image)
            else:
                image = await self._build(force_build)
            mem = self._effective_memory_mb
            disk = self._effective_storage_mb
            self._sandbox = await AsyncSandbox.create(
                image=image,
                cpus=self._effective_cpus,
                memory=f"{mem}M" if mem else None,
                disk=f"{disk}M" if disk else None,
                egress="nat" if self._network_is_public else "none",
                client=self._client,
                **o.sandbox_kwargs,
            )
            self.logger.debug("drums session %s for %s", self._sandbox.name, self.session_id)
            if self.task_env_config.workdir:
                # As compose's working_dir: made if the image has not got it.
                await self._run_checked(["mkdir", "-p", "--", self.task_env_config.workdir])
            # Harbor's /logs dirs, mode 777, as its docker environment makes
            # them (the trial names them; without a trial, the usual three).
            paths = EnvironmentPaths.for_os(self.os)
            dirs = self._mount_targets(writable_only=True) or [
                str(paths.agent_dir),
                str(paths.verifier_dir),
                str(paths.artifacts_dir),
            ]
            await self.ensure_dirs(dirs)
            if prebuilt:
                await self._upload_environment_dir_after_start()
        except BaseException:
            await self._remove(force=True)
            raise

    async def stop(self, delete: bool) -> None:
        """Removes the session (unless `keep`); safe twice and after a failed start."""
        await self._remove(force=False)

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        # Harbor's timeout always (None: no limit), never the SDK's 60 s.
        r = await self.sandbox.commands.run(
            ["bash", "-c", command],
            cwd=cwd or self.task_env_config.workdir or None,
            envs=self._merge_env(env),
            user=self._resolve_user(user),
            timeout=timeout_sec,
        )
        if r.timed_out:
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds")
        code = r.exit_code if r.exit_code is not None else 128 + (r.signal or 0)
        return ExecResult(stdout=r.stdout, stderr=r.stderr, return_code=code)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        parent = str(PurePosixPath(target_path).parent)
        await self._run_checked(["mkdir", "-p", "--", parent])
        with open(source_path, "rb") as f:
            # Its mode kept, as `docker cp` keeps it.
            mode = stat.S_IMODE(os.fstat(f.fileno()).st_mode)
            await self.sandbox.files.write(target_path, f, mode=mode)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        """The directory's contents into `target_dir` (made if missing),
        merged over what is there; files as root, modes kept."""
        src = Path(source_dir)
        with tempfile.TemporaryFile() as tf:
            await asyncio.to_thread(_pack, src, tf)
            tf.seek(0)
            remote = self._remote_tmp()
            await self.sandbox.files.write(remote, tf, mode=0o600)
        try:
            await self._run_checked(["mkdir", "-p", "--", target_dir])
            await self._run_checked(["tar", "-xf", remote, "-C", target_dir])
        finally:
            await self._run_checked(["rm", "-f", "--", remote])

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        async with await self.sandbox.files.read(source_path, format="stream") as stream:
            with open(target, "wb") as f:
                async for chunk in stream:
                    f.write(chunk)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        """The directory's contents into `target_dir` (made if missing),
        overwriting; device nodes and FIFOs skipped, nothing outside it."""
        remote = self._remote_tmp()
        try:
            await self._run_checked(["tar", "-cf", remote, "-C", source_dir, "."])
            with tempfile.TemporaryFile() as tf:
                async with await self.sandbox.files.read(remote, format="stream") as stream:
                    async for chunk in stream:
                        tf.write(chunk)
                tf.seek(0)
                await asyncio.to_thread(_unpack, tf, Path(target_dir))
        finally:
            await self._run_checked(["rm", "-f", "--", remote])

    # ---- drums -------------------------------------------------------------------

    @property
    def sandbox(self) -> AsyncSandbox:
        """The SDK's session this environment runs in (once started)."""
        if self._sandbox is None:
            raise RuntimeError(f"drums: {self.session_id} is not started")
        return self._sandbox

    async def rollback(self, to: str | int | None = None) -> None:
        """The same session continues from its done version `to` (see
        `AsyncSandbox.rollback`; versions come from turns and checkpoints)."""
        await self.sandbox.rollback(to)

    async def fork(self, n: int = 1) -> list[AsyncSandbox]:
        """`n` siblings of the session as it is now (it keeps running): the
        caller's to use and to remove (`kill()`); `stop()` does not."""
        return await self.sandbox.fork(n)

    # ---- inside ----------------------------------------------------------------

    async def _prebuilt(self, ref: str) -> str:
        assert self._client is not None
        for img in await self._client.images.list():
            if ref in img.names or ref in (img.id, img.name):
                found: str = img.id or img.name
                return found
        try:
            pulled = await self._client.images.pull(ref, insecure=self.options.insecure)
        except Exception as e:
            raise RuntimeError(f"drums: could not pull the task's docker_image {ref}: {e}") from e
        if pulled.id is None:
            raise RuntimeError(f"drums: the pull of {ref} named no image")
        return pulled.id

    async def _build(self, force_build: bool) -> str:
        env_dir = Path(self.environment_dir)
        dockerfile = env_dir / DOCKERFILE_NAME
        if not dockerfile.is_file():
            raise SandboxBuildFailedError(f"drums: no {dockerfile} to build")
        o = self.options
        cli = o.drums or shutil.which("drums")
        if not cli:
            raise RuntimeError("drums: no drums CLI on PATH to build with (--ek drums=PATH)")
        tag = f"localhost/harbor-{self.environment_id}:latest"
        argv = [cli, "build", "--json", "-t", tag, "-f", str(dockerfile)]
        if o.socket:
            argv += ["--socket", o.socket]
        if o.state_dir:
            argv += ["--state-dir", o.state_dir]
        if o.insecure:
            argv.append("--insecure")
        if o.build_network:
            argv.append("--network")
        if force_build:
            argv.append("--no-cache")
        # DRUMS_NO_AUTOSTART as the SDK reads it, told to the CLI by its
        # flag (a CLI older than its 1/0 spelling took only true/false).
        env = dict(os.environ)
        if env.pop("DRUMS_NO_AUTOSTART", "").strip().lower() not in ("", "0", "false", "no", "off"):
            argv.append("--no-autostart")
        argv.append(str(env_dir))
        locks = self._build_locks.setdefault(asyncio.get_running_loop(), {})
        lock = locks.setdefault(self.environment_id, asyncio.Lock())
        async with lock:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            try:
                out, err = await proc.communicate()
            except BaseException:  # cancelled by the trial's build timeout
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
                raise
        log = err.decode(errors="replace")
        self.logger.debug("drums build of %s:\n%s", env_dir, log)
        if proc.returncode != 0:
            tail = "\n".join(log.splitlines()[-_BUILD_TAIL_LINES:])
            msg = f"drums build of {dockerfile} failed (exit {proc.returncode}):\n{tail}"
            # 2: a failed step or a bad argument, 3: no context or Dockerfile:
            # the task's definition, not to be retried. 5 (no buildah, no
            # drumsd) and the rest are the host's.
            if proc.returncode in (2, 3):
                raise SandboxBuildFailedError(msg)
            raise RuntimeError(msg)
        try:
            built = json.loads(out)
            image = built["id"]
            if not isinstance(image, str) or not image:
                raise ValueError(image)
            cached = bool(built.get("cached"))
        except (ValueError, KeyError, TypeError) as e:
            raise RuntimeError(f"drums build printed no image id: {out[:200]!r}") from e
        self.logger.debug("drums image %s (%s)%s", tag, image, " cached" if cached else "")
        return image

    async def _run_checked(self, argv: list[str]) -> None:
        r = await self.sandbox.commands.run(argv, user="root", cwd="/", timeout=600)
        if not r.ok:
            raise RuntimeError(
                f"drums: {' '.join(argv[:2])} failed in {self.session_id} "
                f"(exit {r.exit_code}): {r.stderr.strip()[-500:]}"
            )

    def _remote_tmp(self) -> str:
        return f"/tmp/.drums-harbor-{secrets.token_hex(8)}.tar"

    async def _remove(self, *, force: bool) -> None:
        sb, self._sandbox = self._sandbox, None
        client, self._client = self._client, None
        try:
            if sb is not None:
                if self.options.keep and not force:
                    self.logger.info("drums: keeping session %s (keep=true)", sb.name)
                else:
                    await sb.kill()
        finally:
            if client is not None:
                await client.close()


def _pack(src: Path, f: Any) -> None:
    """`src`'s contents as a tar archive into `f`: owned by root, modes kept."""

    def as_root(ti: tarfile.TarInfo) -> tarfile.TarInfo:
        ti.uid = ti.gid = 0
        ti.uname = ti.gname = "root"
        return ti

    if not src.is_dir():
        raise FileNotFoundError(f"drums: upload_dir: {src} is not a directory")
    with tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as t:
        for entry in sorted(os.listdir(src)):
            t.add(src / entry, arcname=entry, recursive=True, filter=as_root)


def _unpack(f: Any, target: Path) -> None:
    """The session's archive into `target`: nothing outside it, no devices."""
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=f, mode="r:") as t:
        t.extractall(target, filter=transfer_tar_filter)
