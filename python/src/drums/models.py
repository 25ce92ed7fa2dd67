"""The API's data, one frozen dataclass per schema of `api/openapi.yaml`.

Each class is named after its schema (an inline object after its parent and
field: `DirEntry` is an entry of `DirListing.entries`). A field is required in
the spec exactly when it has no default here, and nullable exactly when its
type admits None; `tests/test_spec.py` checks both, so the spec, drumsd and
the SDK cannot drift apart. A field named like a Python keyword carries a
trailing underscore (`class_` for the JSON `class`).

Unknown fields in an answer are ignored, so a newer drumsd that adds one
does not break an older SDK.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "AgentMarked",
    "ArtifactCost",
    "AuditCheck",
    "AuditReport",
    "Capacity",
    "Checkpoint",
    "CheckpointList",
    "CoordinatedTurn",
    "CoordinatedTurns",
    "DirEntry",
    "DirListing",
    "Dirtied",
    "ExitStatus",
    "FileEffect",
    "HostKey",
    "Image",
    "ImageList",
    "ImageRef",
    "Job",
    "Limits",
    "Pool",
    "PoolList",
    "ProcessEffect",
    "ReplicaVersion",
    "Replication",
    "RestoreResult",
    "Session",
    "SessionList",
    "SessionStats",
    "SessionVersion",
    "SessionVersions",
    "TurnBegun",
    "TurnCheckpoint",
    "TurnEffects",
    "Version",
    "Written",
]


@dataclass(frozen=True)
class Version:
    """What `GET /v1/version` answers: the daemon's version and where it keeps its state."""

    version: str
    api: str
    pid: int
    state_dir: str
    llm_proxy_local: str | None


@dataclass(frozen=True)
class HostKey:
    """The public key this host signs checkpoint archives with."""

    key: str
    trusted_keys_line: str


@dataclass(frozen=True)
class Replication:
    """A session's replication gate (`sandbox.replication`): model answers
    are held until the replica of their version on another host is
    acknowledged."""

    session: str
    timeout_ms: int
    pending: tuple[str, ...]
    last_acked: str | None


@dataclass(frozen=True)
class ReplicaVersion:
    """A version waiting for its replica, or one whose replica is made."""

    version: str


@dataclass(frozen=True)
class Capacity:
    """What a host holds and may still take (`GET /v1/capacity`)."""

    sessions: int
    max_sessions: int | None
    sessions_memory_bytes: int | None
    memory_committed_bytes: int
    default_memory_bytes: int | None
    memory_available_bytes: int
    cpus: int


@dataclass(frozen=True)
class Limits:
    """A session's effective limits (None: unlimited)."""

    memory_bytes: int | None = None
    pids_max: int | None = None
    cpus: float | None = None
    disk_bytes: int | None = None


@dataclass(frozen=True)
class Session:
    """A session as drumsd describes it (`Sandbox.info`)."""

    id: str
    name: str
    profile: str
    image: str
    state: str
    hostname: str
    network: str
    egress: str
    ip: str | None
    mac: str | None
    limits: Limits
    init_pid: int | None
    created_at_ms: int
    generation: int
    origin: str | None
    privileged: bool
    ports: tuple[str, ...] = ()
    pool: str | None = None


@dataclass(frozen=True)
class SessionStats:
    """What the session's cgroup accounts."""

    memory_bytes: int | None
    pids: int


@dataclass(frozen=True)
class SessionList:
    """`GET /v1/sessions`."""

    sessions: tuple[Session, ...]


@dataclass(frozen=True)
class Image:
    """An image in drumsd's store (a drums image or an OCI one)."""

    name: str
    kind: str
    suite: str
    variant: str
    packages: tuple[str, ...]
    size_bytes: int
    shared_bytes: int
    layers: int
    created_at: int
    id: str | None = field(default=None, metadata={"nullable": False})
    names: tuple[str, ...] = ()


@dataclass(frozen=True)
class ImageRef:
    """An image pulled, imported or removed: its id and references."""

    id: str | None = field(default=None, metadata={"nullable": False})
    names: tuple[str, ...] = ()


@dataclass(frozen=True)
class ImageList:
    """`GET /v1/images`."""

    images: tuple[Image, ...]


@dataclass(frozen=True)
class TurnBegun:
    """An agent turn began."""

    session: str
    turn: int


@dataclass(frozen=True)
class FileEffect:
    """A file a turn changed (an entry of `TurnEffects.files`)."""

    path: str
    change: str
    ops: tuple[str, ...]
    by: tuple[str, ...]


@dataclass(frozen=True)
class ProcessEffect:
    """A process a turn changed (an entry of `TurnEffects.processes`)."""

    pid: int
    comm: str
    change: str
    exe: str | None = field(default=None, metadata={"nullable": False})


@dataclass(frozen=True)
class Dirtied:
    """A process that dirtied memory during a turn (an entry of `TurnEffects.dirtied`)."""

    pid: int
    comm: str
    cpu_us: int
    faults: int
    reason: str


@dataclass(frozen=True)
class ArtifactCost:
    """What one part of a version cost."""

    bytes: int
    """Bytes it wrote."""
    shared_bytes: int
    """Bytes it holds without writing them: process images' pages an earlier
    version's images hold too, shared on disk."""
    frozen_ms: float
    total_ms: float


@dataclass(frozen=True)
class SessionVersion:
    """One version of a session (docs/engine.md)."""

    id: str
    session_id: str
    number: int
    state: str
    pinned: bool
    name: str
    parent: str | None
    turn: int | None
    class_: str
    policy: str
    took: str
    reason: str | None
    files_of: str | None
    process_of: str | None
    files: ArtifactCost | None
    process: ArtifactCost | None
    created_at_ms: int


@dataclass(frozen=True)
class SessionVersions:
    """`GET /v1/sessions/{s}/versions`."""

    versions: tuple[SessionVersion, ...]


@dataclass(frozen=True)
class TurnCheckpoint:
    """What a turn's end took as a version."""

    decision: str
    job: str | None
    version: SessionVersion | None = field(default=None, metadata={"nullable": False})


@dataclass(frozen=True)
class TurnEffects:
    """A turn's net effects, as the eBPF inspector saw them."""

    session: str
    turn: int
    class_: str
    files: tuple[FileEffect, ...]
    processes: tuple[ProcessEffect, ...]
    dirtied: tuple[Dirtied, ...]
    latency_us: int
    checkpoint: TurnCheckpoint | None = field(default=None, metadata={"nullable": False})


@dataclass(frozen=True)
class CoordinatedTurn:
    """One model request the coordinator's LLM proxy saw (docs/coordinator.md)."""

    session: str
    turn: int | None
    seq: int | None
    log: str
    style: str
    path: str
    status: int
    stream: bool
    decision: str
    class_: str | None
    job: str | None
    version: str | None
    version_bytes: int | None
    version_shared_bytes: int | None
    upstream_ms: float
    held_ms: float
    release_ms: float
    replica_ms: float
    replica: str | None
    request_bytes: int
    response_bytes: int
    client_gone: bool
    error: str | None
    started_at_ms: int


@dataclass(frozen=True)
class CoordinatedTurns:
    """`GET /v1/sessions/{s}/coordinator`."""

    turns: tuple[CoordinatedTurn, ...]


@dataclass(frozen=True)
class Job:
    """A checkpoint job of the engine."""

    id: str
    state: str
    priority: str
    version: str | None = field(default=None, metadata={"nullable": False})
    error: str | None = field(default=None, metadata={"nullable": False})
    queued_ms: float | None = field(default=None, metadata={"nullable": False})
    ran_ms: float | None = field(default=None, metadata={"nullable": False})
    started_as: str | None = field(default=None, metadata={"nullable": False})


@dataclass(frozen=True)
class AgentMarked:
    """The processes excluded from tracking by `mark_agent`."""

    session: str
    pids: tuple[int, ...]


@dataclass(frozen=True)
class ExitStatus:
    """How a command ended (an exec stream's last frame, `ExecFrame.exit`)."""

    code: int | None
    signal: int | None
    timed_out: bool


@dataclass(frozen=True)
class Written:
    """A file written by `files.write`."""

    path: str
    size: int


@dataclass(frozen=True)
class DirEntry:
    """An entry of a directory listing (`lstat`ed: a symlink is a `symlink`)."""

    name: str
    kind: str
    size: int
    mode: str


@dataclass(frozen=True)
class DirListing:
    """`GET /v1/sessions/{s}/dir`."""

    path: str
    entries: tuple[DirEntry, ...]


@dataclass(frozen=True)
class Checkpoint:
    """A published checkpoint."""

    id: str
    name: str
    session_id: str
    created_at_ms: int
    clean: bool
    profile: str
    image: str
    format_version: int
    images_bytes: int
    dump_ms: float
    frozen_ms: float


@dataclass(frozen=True)
class CheckpointList:
    """`GET /v1/checkpoints`."""

    checkpoints: tuple[Checkpoint, ...]


@dataclass(frozen=True)
class RestoreResult:
    """Siblings restored from a checkpoint (or forked)."""

    checkpoint: str
    sessions: tuple[Session, ...]
    checkpoint_kept: bool


@dataclass(frozen=True)
class AuditCheck:
    """One check of an audit."""

    what: str
    a: str
    b: str
    ok: bool
    note: str


@dataclass(frozen=True)
class AuditReport:
    """Isolation and clone checks between two sessions (`drums.audit`)."""

    a: str
    b: str
    passed: bool
    isolation: tuple[AuditCheck, ...]
    clone: tuple[AuditCheck, ...]
    identical_by_design: tuple[str, ...]


@dataclass(frozen=True)
class Pool:
    """A warm pool: `size` restored siblings of a checkpoint kept ready."""

    id: str
    name: str
    checkpoint: str
    size: int
    ready: int
    restoring: int
    taken: int
    created_at_ms: int
    waiting_on: str | None


@dataclass(frozen=True)
class PoolList:
    """`GET /v1/pools`."""

    pools: tuple[Pool, ...]
