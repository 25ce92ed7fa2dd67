# GENERATED from src/drums/ray/_async/_sandbox.py by scripts/unasync.py: do not edit.
"""Handles on a cluster's sessions and checkpoints: each names its node and
works from any Ray worker or driver (it pickles; its calls go to the node's
actor), with the surface of `drums.Sandbox` and `drums.Checkpoint`."""

from __future__ import annotations

import builtins
import contextlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, overload

import ray

from drums._sync._commands import DEFAULT_COMMAND_TIMEOUT_S
from drums._sync._sandbox import Policy
from drums._errors import DaemonUnavailable, DrumsError, InvalidArgument
from drums._types import CommandResult
from drums.models import (
    AgentMarked,
    CoordinatedTurn,
    DirEntry,
    Session,
    SessionStats,
    SessionVersion,
    TurnBegun,
    TurnEffects,
    Written,
)
from drums.models import Checkpoint as CheckpointInfo
from drums.ray._errors import NodeLost
from drums.ray._guard import Placement
from drums.ray._node import Node, Received, Staged
from drums.ray._placement import existing_node
from drums.ray._refs import resolve


@dataclass(frozen=True)
class Transfer:
    """A checkpoint sent to a node: the copy there, the archive's bytes that
    moved (0 when the node had it in its cache), and the seconds the export
    (on the sending node), the import (on the receiving one) and the whole
    took."""

    checkpoint: ClusterCheckpoint
    moved_bytes: int
    export_seconds: float
    import_seconds: float
    seconds: float

    @property
    def cached(self) -> bool:
        """The node had the checkpoint already: nothing moved."""
        return self.moved_bytes == 0


# What changes a replicated session, logged with the guard to be done again
# after a resumption elsewhere.
LOGGED_OPS = frozenset({"commands.run", "commands.kill", "files.write", "files.remove"})
# How long a handle whose node failed waits for the guard to say whether it
# is lost (two missed probes, then the resumption).
FAILOVER_WAIT_S = 60.0


class ClusterCommands:
    """Commands in a cluster session (`sandbox.commands`)."""

    def __init__(self, sandbox: ClusterSandbox) -> None:
        self._sb = sandbox

    def run(
        self,
        cmd: str | Sequence[str],
        *,
        cwd: str | None = None,
        envs: Mapping[str, str] | None = None,
        user: str | int | None = None,
        timeout: float | None = DEFAULT_COMMAND_TIMEOUT_S,
        check: bool = False,
    ) -> CommandResult:
        """Run a command in the session and wait for its end
        (`drums.Commands.run`; its output comes back whole)."""
        kw: dict[str, Any] = {"cwd": cwd, "user": user, "timeout": timeout, "check": check}
        if envs is not None:
            kw["envs"] = dict(envs)
        argv: str | list[str] = cmd if isinstance(cmd, str) else list(cmd)
        result: CommandResult = self._sb._call("commands.run", argv, **kw)
        return result

    def kill(self, pid: int, *, signal: int = 9) -> bool:
        """Send `signal` to process `pid` of the session."""
        killed: bool = self._sb._call("commands.kill", pid, signal=signal)
        return killed


class ClusterFiles:
    """Files in a cluster session (`sandbox.files`)."""

    def __init__(self, sandbox: ClusterSandbox) -> None:
        self._sb = sandbox

    @overload
    def read(self, path: str, format: Literal["text"] = "text") -> str: ...
    @overload
    def read(self, path: str, format: Literal["bytes"]) -> bytes: ...
    def read(self, path: str, format: Literal["text", "bytes"] = "text") -> str | bytes:
        """A file's contents, whole: text (UTF-8) or bytes."""
        if format not in ("text", "bytes"):
            raise ValueError(f"format must be 'text' or 'bytes', not {format!r}")
        data: str | bytes = self._sb._call("files.read", path, format)
        return data

    def write(
        self, path: str, data: str | bytes, *, mode: int | str | None = None
    ) -> Written:
        """Write a file atomically."""
        written: Written = self._sb._call("files.write", path, data, mode=mode)
        return written

    def list(self, path: str) -> builtins.list[DirEntry]:
        """A directory's entries."""
        entries: builtins.list[DirEntry] = self._sb._call("files.list", path)
        return entries

    def exists(self, path: str) -> bool:
        """Whether the path exists in the session."""
        found: bool = self._sb._call("files.exists", path)
        return found

    def remove(self, path: str) -> None:
        """Remove a file or directory tree."""
        self._sb._call("files.remove", path)


class ClusterTurn:
    """Agent turns of a cluster session (`sandbox.turn`)."""

    def __init__(self, sandbox: ClusterSandbox) -> None:
        self._sb = sandbox

    def begin(self) -> TurnBegun:
        """A turn begins."""
        begun: TurnBegun = self._sb._call("turn.begin")
        return begun

    def end(
        self,
        *,
        checkpoint: bool | None = None,
        policy: Policy | None = None,
        wait: bool | None = None,
    ) -> TurnEffects:
        """The open turn ends (`drums.Turn.end`)."""
        fx: TurnEffects = self._sb._call(
            "turn.end", checkpoint=checkpoint, policy=policy, wait=wait
        )
        return fx


class ClusterSandbox:
    """A session on one node of a drums cluster.

    The same surface as `drums.Sandbox` where a call makes sense across
    processes (a command's output comes back whole, not streamed). `node`
    says where it lives. It pickles: hand it to any Ray task or actor.
    `with` removes it on exit.
    """

    def __init__(
        self,
        info: Session,
        node: Node,
        *,
        guard: Any = None,
        key: str | None = None,
        epoch: int = 0,
    ) -> None:
        self._info = info
        self.node = node
        """The node the session lives on (another after its node was lost,
        for a replicated session)."""
        self._guard = guard
        self._key = key
        self._epoch = epoch
        self.commands = ClusterCommands(self)
        """Run commands in the session."""
        self.files = ClusterFiles(self)
        """Read and write the session's files."""
        self.turn = ClusterTurn(self)
        """Begin and end agent turns."""

    def __repr__(self) -> str:
        return f"<ClusterSandbox id={self.id} name={self.name!r} node={self.node.id[:12]}>"

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_sandbox,
            (type(self), self._info, self.node, self._guard, self._key, self._epoch),
        )

    @property
    def replicated(self) -> bool:
        """Its versions go to a second node, and it survives the loss of its own."""
        return self._key is not None

    def _adopt(self, p: Placement) -> None:
        self._info, self.node, self._epoch = p.session, p.node, p.epoch

    def _call(self, op: str, *args: Any, **kwargs: Any) -> Any:
        if self._key is None:
            return resolve(self.node.actor.call.remote(self._info, op, args, kwargs))
        # A replicated session: what changes it is logged with the guard
        # first, so that a resumption elsewhere can do it again; a call its
        # lost node never answered is sent once more where it went on.
        seq: int | None = None
        if op in LOGGED_OPS:
            seq, p = resolve(self._guard.begin.remote(self._key, op, args, kwargs))
        else:
            p = resolve(self._guard.where.remote(self._key))
        self._adopt(p)
        try:
            result = resolve(self.node.actor.call.remote(self._info, op, args, kwargs))
        except (NodeLost, DaemonUnavailable, ray.exceptions.RayError):
            moved: Placement = resolve(
                self._guard.failed.remote(self._key, p.epoch, FAILOVER_WAIT_S)
            )
            if moved.epoch == p.epoch:
                raise
            self._adopt(moved)
            result = resolve(self.node.actor.call.remote(self._info, op, args, kwargs))
        if seq is not None:
            resolve(self._guard.end.remote(self._key, seq))
        return result

    def llm_base_url(self) -> str:
        """Where an agent outside the session sends its model calls
        (OpenAI-style; the node's LLM proxy, `/s/NAME/v1`). It changes when a
        replicated session moves: ask again after a call fails."""
        if self._key is not None:
            self._adopt(resolve(self._guard.where.remote(self._key)))
        url: str = resolve(self.node.actor.llm_base_url.remote(self._info))
        return url

    @property
    def id(self) -> str:
        """The session's id (on its node)."""
        return self._info.id

    @property
    def name(self) -> str:
        """The session's name (on its node)."""
        return self._info.name

    @property
    def info(self) -> Session:
        """The session as its drumsd last described it."""
        return self._info

    def refresh(self) -> Session:
        """Ask the node's drumsd again; updates and returns `info`."""
        self._info = self._call("refresh")
        return self._info

    def stats(self) -> SessionStats:
        """What the session's cgroup accounts now."""
        stats: SessionStats = self._call("stats")
        return stats

    def kill(self) -> bool:
        """Remove the session; False if it was already gone (a replicated
        one also leaves the guard, and its replica goes)."""
        if self._key is not None:
            with contextlib.suppress(NodeLost):
                self._adopt(resolve(self._guard.where.remote(self._key)))
            resolve(self._guard.unregister.remote(self._key))
        killed: bool = resolve(self.node.actor.call.remote(self._info, "kill", (), {}))
        return killed

    def __enter__(self) -> ClusterSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()

    def checkpoint(
        self, *, name: str | None = None, clean: bool = False, leave_running: bool = True
    ) -> ClusterCheckpoint:
        """Checkpoint the session on its node (`drums.Sandbox.checkpoint`)."""
        info: CheckpointInfo = self._call(
            "checkpoint", name=name, clean=clean, leave_running=leave_running
        )
        return ClusterCheckpoint(info, self.node)

    def fork(
        self,
        n: int = 1,
        *,
        at: str | int | None = None,
        keep: bool = False,
        name: str | None = None,
    ) -> builtins.list[ClusterSandbox]:
        """`n` hygienic siblings on the session's node (`drums.Sandbox.fork`);
        `drums.ray.Cluster.fork` spreads them over nodes."""
        infos: builtins.list[Session] = self._call("fork", n, at=at, keep=keep, name=name)
        return [ClusterSandbox(i, self.node) for i in infos]

    def migrate(self, to: str | Node) -> Transfer:
        """Move the session to node `to` under this same handle: it is
        checkpointed (processes and files, left running), the checkpoint is
        sent to `to` and restored there under the session's name, and only
        then is the original removed. Returns the checkpoint's transfer.

        What the session does between the checkpoint and its removal is not
        carried over: migrate between turns. If anything fails before the
        restore is done, the original stays, untouched, and the error is
        raised; the checkpoint goes either way. The session's id, address
        and hostname are the new node's (its name stays).
        """
        dst = to if isinstance(to, Node) else existing_node(to)
        if dst.id == self.node.id:
            raise InvalidArgument(
                f"session {self.name} is on node {dst.id[:12]} already", kind="bad_request"
            )
        ck = self.checkpoint(leave_running=True)
        try:
            t = ck.send(dst)
            try:
                (moved,) = t.checkpoint.restore(name=self.name)
            finally:
                t.checkpoint.remove()
        finally:
            ck.remove()
        self.kill()
        self._info, self.node = moved.info, moved.node
        return t

    def versions(self) -> builtins.list[SessionVersion]:
        """The session's versions, oldest first."""
        vs: builtins.list[SessionVersion] = self._call("versions")
        return vs

    def rollback(self, to: str | int | None = None) -> Session:
        """Continue from one of its done versions (`drums.Sandbox.rollback`)."""
        self._info = self._call("rollback", to)
        return self._info

    def recover(self) -> Session:
        """Bring the session back from its newest done version."""
        self._info = self._call("recover")
        return self._info

    def turns(self) -> builtins.list[CoordinatedTurn]:
        """What the node's LLM proxy saw of the session."""
        ts: builtins.list[CoordinatedTurn] = self._call("turns")
        return ts

    def mark_agent(self, pid: int) -> AgentMarked:
        """Process `pid` of the session is an agent (`drums.Sandbox.mark_agent`)."""
        marked: AgentMarked = self._call("mark_agent", pid)
        return marked

    def screenshot(self, *, timeout: float = 30.0) -> bytes:
        """A PNG of a desktop session's screen, taken on its node."""
        png: bytes = self._call("screenshot", timeout=timeout)
        return png


def _rebuild_sandbox(
    cls: type[ClusterSandbox],
    info: Session,
    node: Node,
    guard: Any,
    key: str | None,
    epoch: int,
) -> ClusterSandbox:
    return cls(info, node, guard=guard, key=key, epoch=epoch)


class ClusterCheckpoint:
    """A published checkpoint on one node of a drums cluster. It pickles.

    `drums.ray.Cluster.send` copies it to another node;
    `Cluster.fork` spreads its siblings over nodes."""

    def __init__(self, info: CheckpointInfo, node: Node) -> None:
        self._info = info
        self.node = node
        """The node it is on."""

    def __repr__(self) -> str:
        return f"<ClusterCheckpoint id={self.id} name={self.name!r} node={self.node.id[:12]}>"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self._info, self.node))

    @property
    def id(self) -> str:
        """The checkpoint's id (on its node)."""
        return self._info.id

    @property
    def name(self) -> str:
        """The checkpoint's name (on its node)."""
        return self._info.name

    @property
    def info(self) -> CheckpointInfo:
        """What its drumsd says of it."""
        return self._info

    def restore(
        self, count: int = 1, *, name: str | None = None
    ) -> builtins.list[ClusterSandbox]:
        """`count` hygienic siblings on the checkpoint's node (`name` only
        for `count == 1`)."""
        if isinstance(count, bool) or not isinstance(count, int):
            raise TypeError(f"count must be an int, not {count!r}")
        infos: builtins.list[Session] = resolve(
            self.node.actor.restore.remote(self._info, count, name)
        )
        return [ClusterSandbox(i, self.node) for i in infos]

    def send(self, to: str | Node) -> Transfer:
        """Copy it to node `to` (its Ray node id), through Ray's object store
        in chunks; the node restores it from its own store afterwards.
        Nothing moves when `to` has it already (its cache, by the archive's
        digest), or is its own node.

        Raises `drums.Untrusted` when `to` does not trust this node's key,
        `drums.InvalidArgument` when it cannot restore what it is sent
        (another kernel, CPU or CRIU; limits or an image it lacks),
        `TransferError` when the bytes stop coming; `to` then keeps nothing.
        """
        (t,) = self.send_many([to])
        return t

    def send_many(self, to: Sequence[str | Node]) -> builtins.list[Transfer]:
        """`send` to several nodes, exporting the archive once."""
        t0 = time.monotonic()
        src = self.node
        dsts = [n if isinstance(n, Node) else existing_node(n) for n in to]
        done: dict[str, Transfer] = {}
        for d in dsts:
            if d.id == src.id:
                done[d.id] = Transfer(self, 0, 0.0, 0.0, 0.0)
        digest: str | None = resolve(src.actor.digest_of.remote(self.id))
        if digest is not None:
            lookups = [(d, d.actor.lookup.remote(digest)) for d in dsts if d.id not in done]
            for d, ref in lookups:
                hit: CheckpointInfo | None = resolve(ref)
                if hit is not None:
                    done[d.id] = Transfer(
                        ClusterCheckpoint(hit, d), 0, 0.0, 0.0, time.monotonic() - t0
                    )
        todo = [d for d in dsts if d.id not in done]
        if todo:
            staged: Staged = resolve(src.actor.stage.remote(self.id))
            refs = [(d, d.actor.receive.remote(staged)) for d in todo]
            errors: builtins.list[BaseException] = []
            for d, ref in refs:
                try:
                    rx: Received = resolve(ref)
                except (DrumsError, ray.exceptions.RayError) as e:
                    errors.append(e)
                    continue
                done[d.id] = Transfer(
                    ClusterCheckpoint(rx.checkpoint, d),
                    rx.moved_bytes,
                    staged.seconds,
                    rx.seconds,
                    time.monotonic() - t0,
                )
            # The archive's objects go once no receiver holds them.
            del staged, refs
            if errors:
                raise errors[0]
        return [done[d.id] for d in dsts]

    def remove(self) -> bool:
        """Remove it from its node; False if it was gone."""
        removed: bool = resolve(self.node.actor.remove_checkpoint.remote(self._info))
        return removed
