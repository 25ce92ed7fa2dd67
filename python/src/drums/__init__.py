"""Python SDK for drums: AI-agent sandboxes on Linux, with checkpoints restored
as hygienic siblings, forks, rollbacks, warm pools and an eBPF turn inspector.

    import drums

    with drums.Sandbox.create() as sb:
        r = sb.commands.run("echo hello")
        print(r.stdout)

The SDK talks to drumsd over its unix socket (`DRUMS_SOCKET`, else
`$DRUMS_STATE_DIR/drumsd.sock`, else `/var/lib/drums/drumsd.sock`) and starts
one when none answers, as the `drums` CLI does (unless `DRUMS_NO_AUTOSTART`).

Everything here has an async twin of the same shape: `AsyncSandbox`,
`AsyncClient`, `AsyncPool`, and `drums.aio` for the module-level helpers.
The module-level helpers (`drums.checkpoints`, `drums.images`, `drums.jobs`,
`drums.pools`, `drums.debug`, `drums.version()`, ...) use a default `Client`
made from the environment; every class also takes `client=`.

Agent harnesses (mini-swe-agent, SWE-ReX) have adapters in
`drums.integrations`, which `import drums` does not import.
"""

from __future__ import annotations

from drums import models
from drums._async import (
    AsyncCheckpoint,
    AsyncCheckpoints,
    AsyncClient,
    AsyncCommandHandle,
    AsyncCommands,
    AsyncDebug,
    AsyncFiles,
    AsyncFileStream,
    AsyncImages,
    AsyncJobs,
    AsyncPool,
    AsyncPools,
    AsyncReplicas,
    AsyncSandbox,
    AsyncSandboxes,
    AsyncTurn,
    AsyncTurnStream,
)
from drums._default import default_client, set_default_client
from drums._errors import (
    CommandExitError,
    CommandNotFound,
    CommandTimeout,
    Conflict,
    DaemonUnavailable,
    DrumsError,
    InternalError,
    InvalidArgument,
    NotFound,
    PathEscapesRoot,
    PermissionDenied,
    Unavailable,
    Untrusted,
)
from drums._sync import (
    Checkpoint,
    Checkpoints,
    Client,
    CommandHandle,
    Commands,
    Debug,
    Files,
    FileStream,
    Images,
    Jobs,
    Pool,
    Pools,
    Replicas,
    Sandbox,
    Sandboxes,
    Turn,
    TurnStream,
)
from drums._types import CommandResult
from drums.models import AuditReport, Capacity, HostKey, Version

__version__ = "0.1.0"

checkpoints: Checkpoints = Checkpoints()
"""Checkpoints of the default daemon: `list()`, `get()`, `import_()`."""
images: Images = Images()
"""Images of the default daemon: `list()`, `pull()`, `remove()`, `import_()`."""
jobs: Jobs = Jobs()
"""Checkpoint jobs of the default daemon: `get()`, `promote()`."""
pools: Pools = Pools()
"""Warm pools of the default daemon: `list()`, `get()`."""
debug: Debug = Debug()
"""Test-only calls of the default daemon: `set_fault()`."""


def version() -> Version:
    """The default daemon's version, API version, pid and state directory."""
    return default_client().version()


def host_key() -> HostKey:
    """The public key the default daemon's host signs checkpoint archives with."""
    return default_client().host_key()


def capacity() -> Capacity:
    """What the default daemon's host holds and may still take (sessions,
    memory, CPUs)."""
    return default_client().capacity()


def audit(a: str | Sandbox, b: str | Sandbox) -> AuditReport:
    """Isolation and clone checks between two sessions (sandboxes, ids or names)."""
    return default_client().audit(
        a.id if isinstance(a, Sandbox) else a, b.id if isinstance(b, Sandbox) else b
    )


def openapi() -> str:
    """The API document the default daemon serves (YAML text)."""
    return default_client().openapi()


from drums import aio  # noqa: E402 - it imports the names above

__all__ = [
    "AsyncCheckpoint",
    "AsyncCheckpoints",
    "AsyncClient",
    "AsyncCommandHandle",
    "AsyncCommands",
    "AsyncDebug",
    "AsyncFileStream",
    "AsyncFiles",
    "AsyncImages",
    "AsyncJobs",
    "AsyncPool",
    "AsyncPools",
    "AsyncReplicas",
    "AsyncSandbox",
    "AsyncSandboxes",
    "AsyncTurn",
    "AsyncTurnStream",
    "Checkpoint",
    "Checkpoints",
    "Client",
    "CommandExitError",
    "CommandHandle",
    "CommandNotFound",
    "CommandResult",
    "CommandTimeout",
    "Commands",
    "Conflict",
    "DaemonUnavailable",
    "Debug",
    "DrumsError",
    "FileStream",
    "Files",
    "Images",
    "InternalError",
    "InvalidArgument",
    "Jobs",
    "NotFound",
    "PathEscapesRoot",
    "PermissionDenied",
    "Pool",
    "Pools",
    "Replicas",
    "Sandbox",
    "Sandboxes",
    "Turn",
    "TurnStream",
    "Unavailable",
    "Untrusted",
    "aio",
    "audit",
    "capacity",
    "checkpoints",
    "debug",
    "default_client",
    "host_key",
    "images",
    "jobs",
    "models",
    "openapi",
    "pools",
    "set_default_client",
    "version",
]
