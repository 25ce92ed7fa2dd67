"""A mini-swe-agent environment whose commands run in a drums sandbox.

Select it by its dotted path, in a mini-swe-agent YAML config:

    environment:
      environment_class: drums.integrations.minisweagent.DrumsEnvironment
      image: default            # every field of DrumsEnvironmentConfig
      cwd: /repo

or from Python: `DrumsEnvironment(image="default", cwd="/repo")`; with no
arguments it creates a session of drumsd's defaults. The session is the
environment's: `cleanup()` removes it, and so does a weakref finalizer when
the environment is collected or the interpreter exits.

It speaks both calls mini-swe-agent has had, told apart by the argument's
type: 2.x's `execute(action: dict, cwd="", *, timeout=None)`, which returns
`{"output", "returncode", "exception_info"}` and raises
`minisweagent.exceptions.Submitted` on the submission marker, and 1.x's
`execute(command: str, cwd="", *, timeout=None)`, which returns
`{"output", "returncode"}` and leaves the marker to the 1.x agent, as 1.x's
own environments did.

Importing this module does not import mini-swe-agent: only raising
`Submitted` needs it, and imports it then.
"""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import drums

__all__ = ["SUBMIT_MARKER", "DrumsEnvironment", "DrumsEnvironmentConfig"]

SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
"""The first line of a command's output that ends the task (mini-swe-agent's)."""

DEFAULT_LLM_PROXY = "http://127.0.0.1:7080"
"""drumsd's LLM proxy for agents on the host (its `--llm-proxy-local` default)."""

_log = logging.getLogger("drums.integrations.minisweagent")

# The command's stderr joins its stdout in one pipe, in the order written, as
# the reference environments' `stderr=STDOUT` does. `exec "$@"` keeps every
# word an argv element: no shell string is built from the command.
_MERGE = 'exec "$@" 2>&1'

# The session's uname, for the templates' {{system}} {{release}} ...: a
# constant script, nothing of the caller's in it.
_UNAME = "uname -s; uname -n; uname -r; uname -v; uname -m"
_UNAME_KEYS = ("system", "node", "release", "version", "machine")

# The coordinator's watch looks at a session ten times a second.
_RECOVERY_POLL_S = 0.1


@dataclass
class DrumsEnvironmentConfig:
    """What a `DrumsEnvironment` makes and how it runs commands.

    The first group makes the session (unused when a `sandbox` is passed);
    the second is read on every `execute`.
    """

    image: str = ""
    """A drums image or an OCI reference (default: drumsd's, `default`)."""
    profile: str = ""
    """`headless` (default) or `desktop`."""
    name: str = ""
    """The session's name (default: drumsd picks one). Naming it lets a
    model's config write the proxy's URL in advance (see `model_base_url`)."""
    from_checkpoint: str = ""
    """Start from this checkpoint (id or name) instead of an image, restored
    warm; or `pool=NAME`: take a ready member of warm pool NAME."""
    sandbox_kwargs: dict[str, Any] = field(default_factory=dict)
    """More arguments of `drums.Sandbox.create` (`memory`, `cpus`, `disk`,
    `egress`, ...)."""
    socket: str = ""
    """drumsd's socket (default: as the SDK finds it, `DRUMS_SOCKET` ...)."""

    cwd: str = ""
    """Where commands run (default: the session's, root's home)."""
    env: dict[str, str] = field(default_factory=dict)
    """Variables added to every command's environment."""
    timeout: int | float = 30
    """Seconds a command may run before the session kills it."""
    interpreter: list[str] = field(default_factory=lambda: ["bash", "-lc"])
    """What runs a command: the command is its last argument."""
    coordinated: bool = False
    """The agent's model calls go through drumsd's LLM proxy, so that each
    step is a versioned turn: see `DrumsEnvironment.model_base_url`."""
    llm_proxy: str = DEFAULT_LLM_PROXY
    """Where drumsd's LLM proxy listens for agents on the host."""
    recovery_timeout: int | float = 120
    """Coordinated only: how long a command refused because the session is
    down (its processes were killed) waits for the coordinator to recover
    it before it is sent again."""

    def __post_init__(self) -> None:
        # YAML hands over whatever it parsed: refuse a wrong type here, not
        # at the first command.
        for f in dataclasses.fields(self):
            val = getattr(self, f.name)
            if f.name in ("image", "profile", "name", "from_checkpoint", "socket", "cwd"):
                ok = isinstance(val, str)
            elif f.name == "llm_proxy":
                ok = isinstance(val, str) and val.startswith(("http://", "https://"))
            elif f.name == "env":
                ok = isinstance(val, dict) and all(
                    isinstance(k, str) and isinstance(v, str) for k, v in val.items()
                )
            elif f.name == "sandbox_kwargs":
                ok = isinstance(val, dict) and all(isinstance(k, str) for k in val)
            elif f.name in ("timeout", "recovery_timeout"):
                ok = isinstance(val, int | float) and not isinstance(val, bool) and val > 0
            elif f.name == "interpreter":
                ok = isinstance(val, list) and bool(val) and all(isinstance(a, str) for a in val)
            else:  # coordinated
                ok = isinstance(val, bool)
            if not ok:
                raise ValueError(f"DrumsEnvironmentConfig.{f.name}: invalid value {val!r}")
        if self.from_checkpoint and (self.image or self.profile or self.sandbox_kwargs):
            raise ValueError(
                "DrumsEnvironmentConfig: from_checkpoint restores the checkpoint's own image "
                "and limits; image, profile and sandbox_kwargs cannot be given with it"
            )
        if self.from_checkpoint.startswith("pool=") and self.name:
            raise ValueError("DrumsEnvironmentConfig: a pool's member cannot be given a name")

    def model_dump(self, mode: str = "python") -> dict[str, Any]:
        """The fields as a dict (the name pydantic gives it, which the
        reference environments' callers use)."""
        return dataclasses.asdict(self)


class DrumsEnvironment:
    """A mini-swe-agent environment over one drums sandbox.

    Args:
        config_class: the config's class (mini-swe-agent's convention).
        sandbox: run in this sandbox instead of making one; the environment
            then owns it (`cleanup()` removes it) and the config's fields
            that make a session are not used.
        logger: where to log (default `drums.integrations.minisweagent`).
        **kwargs: the fields of `DrumsEnvironmentConfig`.

    Raises:
        drums.DrumsError: the session could not be made (e.g. `NotFound`
            for an image or checkpoint that does not exist); nothing is
            left behind then.
    """

    def __init__(
        self,
        *,
        config_class: type[DrumsEnvironmentConfig] = DrumsEnvironmentConfig,
        sandbox: drums.Sandbox | None = None,
        logger: logging.Logger | None = None,
        **kwargs: Any,
    ) -> None:
        self.logger = logger or _log
        self.config = config_class(**kwargs)
        owned: drums.Client | None = None
        if sandbox is None:
            if self.config.socket:
                owned = drums.Client(self.config.socket)
            client = owned or drums.default_client()
            try:
                sandbox = self._make(client)
            except BaseException:
                if owned is not None:
                    owned.close()
                raise
        self.sandbox: drums.Sandbox = sandbox
        """The SDK's sandbox the commands run in."""
        self._uname: dict[str, str] | None = None
        self._finalizer = weakref.finalize(self, _remove, sandbox, owned, self.logger)
        self.logger.info("drums session %s (%s) ready", sandbox.name, sandbox.id)

    def _make(self, client: drums.Client) -> drums.Sandbox:
        c = self.config
        if c.from_checkpoint.startswith("pool="):
            return drums.Pool.connect(c.from_checkpoint.removeprefix("pool="), client=client).take()
        if c.from_checkpoint:
            ck = client.checkpoints.get(c.from_checkpoint)
            return ck.restore(1, name=c.name or None)[0]
        return drums.Sandbox.create(
            image=c.image or None,
            profile=c.profile or None,  # type: ignore[arg-type]  # drumsd checks it
            name=c.name or None,
            client=client,
            **c.sandbox_kwargs,
        )

    # ---- mini-swe-agent's protocol -------------------------------------------

    def execute(
        self,
        action: Mapping[str, Any] | str,
        cwd: str = "",
        *,
        timeout: int | float | None = None,
    ) -> dict[str, Any]:
        """Run one command in the sandbox.

        `action` is 2.x's action dict (its `command` is run) or, as in 1.x, the
        command itself. `cwd` and `timeout` override the config's for this
        call. See the module's docstring for what each form returns and raises.
        """
        if isinstance(action, str):
            return self._execute_v1(action, cwd, timeout)
        if not isinstance(action, Mapping):
            raise TypeError(f"action must be a dict or a str, not {type(action).__name__}")
        command = action.get("command", "")
        limit = timeout or self.config.timeout
        output: dict[str, Any]
        try:
            r = self._run(command, cwd, limit)
            if r.timed_out:
                # The reference environments' timeout, to the letter: the
                # command's partial output, returncode -1 and the exception.
                raise subprocess.TimeoutExpired(command, limit, output=r.stdout)
            output = {"output": r.stdout, "returncode": _returncode(r), "exception_info": ""}
        except Exception as e:
            raw = getattr(e, "output", None)
            text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else (raw or "")
            output = {
                "output": text,
                "returncode": -1,
                "exception_info": f"An error occurred while executing the command: {e}",
                "extra": {"exception_type": type(e).__name__, "exception": str(e)},
            }
        self._check_finished(output)
        return output

    def _execute_v1(self, command: str, cwd: str, timeout: int | float | None) -> dict[str, Any]:
        # 1.x's LocalEnvironment: errors propagate, a timeout raises
        # TimeoutExpired carrying the output as bytes (what 1.x's agent
        # decodes), and the submission marker is the agent's to see.
        limit = timeout or self.config.timeout
        r = self._run(command, cwd, limit)
        if r.timed_out:
            raise subprocess.TimeoutExpired(command, limit, output=r.stdout.encode())
        return {"output": r.stdout, "returncode": _returncode(r)}

    def _run(self, command: object, cwd: str, limit: int | float) -> drums.CommandResult:
        if not isinstance(command, str):
            raise TypeError(f"the action's command must be a str, not {type(command).__name__}")
        argv = ["/bin/sh", "-c", _MERGE, "sh", *self.config.interpreter, command]
        deadline: float | None = None
        while True:
            try:
                return self.sandbox.commands.run(
                    argv,
                    cwd=cwd or self.config.cwd or None,
                    envs=self.config.env or None,
                    timeout=limit,
                )
            except (drums.Unavailable, drums.Conflict) as e:
                # A coordinated session whose processes died is recovered by
                # drumsd's coordinator (docs/coordinator.md, "Failures"); a
                # command that reached it meanwhile was refused before it
                # started (its guest gone: 502 guest_unavailable; the session
                # being restored: 409), so it is sent again once the session
                # is back. A command the failure broke while it ran is
                # drumsd's to re-issue, never the environment's.
                refused = isinstance(e, drums.Conflict) or e.kind == "guest_unavailable"
                if not (self.config.coordinated and refused):
                    raise
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.config.recovery_timeout
                    self.logger.warning(
                        "session %s is down (%s): waiting for its recovery", self.sandbox.name, e
                    )
                if now > deadline:
                    raise
                time.sleep(_RECOVERY_POLL_S)

    def _check_finished(self, output: dict[str, Any]) -> None:
        """Raises `Submitted` when the output's first line is the marker and
        the command exited 0 (the reference environments' rule and message)."""
        lines = str(output.get("output", "")).lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_MARKER and output["returncode"] == 0:
            from minisweagent.exceptions import Submitted

            submission = "".join(lines[1:])
            raise Submitted(
                {
                    "role": "exit",
                    "content": submission,
                    "extra": {"exit_status": "Submitted", "submission": submission},
                }
            )

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        """The config's fields, the session's uname (`system`, `node`,
        `release`, `version`, `machine`: the sandbox's, not the host's),
        `session`, `model_base_url` when coordinated, then `kwargs`."""
        extra: dict[str, Any] = {"session": self.sandbox.name}
        if self.config.coordinated:
            extra["model_base_url"] = self.model_base_url
        return _merge(self.config.model_dump(), self._session_uname(), extra, kwargs)

    def serialize(self) -> dict[str, Any]:
        """The environment's part of a trajectory file."""
        return {
            "info": {
                "config": {
                    "environment": self.config.model_dump(mode="json"),
                    "environment_type": f"{type(self).__module__}.{type(self).__name__}",
                }
            }
        }

    # ---- drums ---------------------------------------------------------------------

    @property
    def model_base_url(self) -> str:
        """The OpenAI-style base URL the agent's model must use so that its
        calls go through drumsd's LLM proxy as this session's turns:
        `LLM_PROXY/s/SESSION/v1`. Give it to the model as its `api_base`
        (a `LitellmModel`'s `model_kwargs: {api_base: ...}`). Only with
        `coordinated`."""
        if not self.config.coordinated:
            raise ValueError(
                "model_base_url: the environment is not coordinated (coordinated=True)"
            )
        return f"{self.config.llm_proxy.rstrip('/')}/s/{self.sandbox.name}/v1"

    def cleanup(self) -> None:
        """Remove the session (once; later calls do nothing)."""
        self._finalizer()

    def __enter__(self) -> DrumsEnvironment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    def _session_uname(self) -> dict[str, str]:
        if self._uname is None:
            r = self.sandbox.commands.run(["/bin/sh", "-c", _UNAME], cwd="/", timeout=30)
            lines = r.stdout.splitlines()
            self._uname = {
                k: (lines[i].strip() if i < len(lines) and r.ok else "")
                for i, k in enumerate(_UNAME_KEYS)
            }
        return self._uname


def _returncode(r: drums.CommandResult) -> int:
    """The exit status; a signal as subprocess reports it (-N)."""
    if r.exit_code is not None:
        return r.exit_code
    return -(r.signal or 0) or -1


def _merge(*dicts: Mapping[str, Any]) -> dict[str, Any]:
    """Later keys win; dicts under one key merge (mini-swe-agent's rule)."""
    out: dict[str, Any] = {}
    for d in dicts:
        for k, v in d.items():
            if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
                out[k] = _merge(out[k], v)
            else:
                out[k] = v
    return out


def _remove(sandbox: drums.Sandbox, client: drums.Client | None, logger: logging.Logger) -> None:
    """The finalizer: runs once, from `cleanup()`, collection or exit."""
    try:
        sandbox.kill()
    except Exception as e:  # drumsd gone at exit: say so, never raise from a finalizer
        logger.warning("could not remove drums session %s: %s", sandbox.name, e)
    finally:
        if client is not None:
            client.close()
