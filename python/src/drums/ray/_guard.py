"""`ClusterGuard`: the sessions that survive the loss of their node.

One detached actor for the cluster, named `drums-guard`, on the head node (a
cluster that loses its head loses Ray itself). For every session made with
`replicate=True` it keeps:
- where the session runs (its primary node) and where its replicas go;
- the newest version of it that is on the replica node;
- the log of what the session's handles did since that version (commands
  run, files written or removed), in order, each marked done once its
  caller had its answer.

It watches the primary nodes (their actor and drumsd, every 0.25 s). A node
that misses two probes in a row is lost, and each of its replicated sessions
is resumed on its replica node:
1. the newest replicated version is restored there, under the session's name;
2. what the log says was done since is done again, in order, its output
   dropped (as drumsd re-issues an agent's commands on one host);
3. its versions are copied on to another node, if there is one;
4. its handles, waiting on the guard, go on there: the call that was in
   flight is sent again, once.

A session that had no replicated version yet, or no node left to resume on,
is lost: its handles raise `NodeLost` saying so, never a silent success.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import ray

from drums._errors import DrumsError
from drums.models import Checkpoint as CheckpointInfo
from drums.models import Session
from drums.ray._errors import NodeLost
from drums.ray._node import NAMESPACE, Node
from drums.ray._refs import async_resolve

GUARD_NAME = "drums-guard"
"""The guard actor's name, in the `drums` namespace."""

PROBE_EVERY_S = 0.25
PROBE_TIMEOUT_S = 1.0
MISSES_TO_LOSE = 2

log = logging.getLogger("drums.ray.guard")


@dataclass
class Op:
    """One thing a handle did to a replicated session."""

    seq: int
    op: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    done: bool = False


@dataclass(frozen=True)
class Placement:
    """Where a replicated session is now, as its handles see it."""

    key: str
    node: Node
    session: Session
    epoch: int


@dataclass(frozen=True)
class Failover:
    """One session resumed after its node was lost (`ClusterGuard.failovers`)."""

    key: str
    name: str
    lost_node: str
    to_node: str | None
    version: str | None
    replayed: int
    missed_at: float
    """When the node first missed a probe (Unix time, on the guard's host)."""
    noticed_at: float
    """When the guard took it for lost (`MISSES_TO_LOSE` probes missed)."""
    resumed_at: float
    """When the session ran on `to_node` again (or was given up on)."""
    error: str | None


@dataclass
class Replicated:
    key: str
    name: str
    primary: Node
    session: Session
    replica: Node | None
    timeout: float
    latest: CheckpointInfo | None = None
    latest_version: str | None = None
    ops: list[Op] = field(default_factory=list)
    seq: int = 0
    epoch: int = 0
    lost: str | None = None
    moved: asyncio.Event = field(default_factory=asyncio.Event)


class ClusterGuard:
    """The guard actor (see the module's doc). Made by `drums.ray.Cluster`
    on first `create(replicate=True)`, never by hand."""

    def __init__(self) -> None:
        self._sessions: dict[str, Replicated] = {}
        self._misses: dict[str, int] = {}
        self._first_miss: dict[str, float] = {}
        self._watch: asyncio.Task[None] | None = None
        self._failovers: list[Failover] = []
        self._failing: set[str] = set()

    # ---- registration -----------------------------------------------------------

    async def register(
        self, session: Session, primary: Node, replica: Node | None, timeout: float
    ) -> str:
        """Guard a session; its versions start going to `replica`."""
        key = uuid.uuid4().hex
        r = Replicated(key, session.name, primary, session, replica, timeout)
        self._sessions[key] = r
        if replica is not None:
            await async_resolve(
                primary.actor.replicate.remote(session, replica, self._me(), key, timeout)
            )
        if self._watch is None:
            self._watch = asyncio.get_running_loop().create_task(self._watch_nodes())
        return key

    async def unregister(self, key: str) -> None:
        """The session was removed on purpose: forget it and its replica."""
        r = self._sessions.pop(key, None)
        if r is not None and r.latest is not None and r.replica is not None:
            with contextlib.suppress(DrumsError, ray.exceptions.RayError):
                await async_resolve(r.replica.actor.remove_checkpoint.remote(r.latest))

    def _me(self) -> Any:
        return ray.get_runtime_context().current_actor

    # ---- the handles' calls -----------------------------------------------------

    async def where(self, key: str) -> Placement:
        """Where the session is; waits while it is being resumed elsewhere."""
        r = self._get(key)
        while key in self._failing:
            await r.moved.wait()
        if r.lost is not None:
            raise NodeLost(r.lost, kind="node_lost")
        return Placement(key, r.primary, r.session, r.epoch)

    async def begin(
        self, key: str, op: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[int, Placement]:
        """A handle is about to do `op`: logged first, then where to do it."""
        placement = await self.where(key)
        r = self._get(key)
        r.seq += 1
        r.ops.append(Op(r.seq, op, args, kwargs))
        return r.seq, placement

    async def end(self, key: str, seq: int) -> None:
        """The handle had the answer of its `op`."""
        r = self._sessions.get(key)
        if r is None:
            return
        for o in r.ops:
            if o.seq == seq:
                o.done = True

    async def failed(self, key: str, epoch: int, timeout: float) -> Placement:
        """A handle's call to the session's node failed: once the guard knows
        whether the node is lost (within `timeout` s), where to send it again."""
        r = self._get(key)
        deadline = time.monotonic() + timeout
        while r.epoch == epoch and r.lost is None and time.monotonic() < deadline:
            if key in self._failing:
                await r.moved.wait()
                break
            await asyncio.sleep(PROBE_EVERY_S / 2)
        return await self.where(key)

    # ---- the copier's calls -----------------------------------------------------

    async def replicated(
        self, key: str, version: str, copy: CheckpointInfo, epoch: int | None = None
    ) -> None:
        """The copier put `version` on the replica node as `copy`: what the
        log holds up to now is in it, and the replica before it can go."""
        r = self._sessions.get(key)
        if r is None or r.replica is None:
            return
        old = r.latest
        r.latest, r.latest_version = copy, version
        # The agent waits for this turn's answer, which waits for this ack:
        # everything it did so far is in the version.
        r.ops = [o for o in r.ops if not o.done]
        if old is not None and old.id != copy.id:
            with contextlib.suppress(DrumsError, ray.exceptions.RayError):
                await async_resolve(r.replica.actor.remove_checkpoint.remote(old))

    # ---- what happened ------------------------------------------------------------

    async def failovers(self) -> list[Failover]:
        """Every resumption since the guard started, oldest first."""
        return list(self._failovers)

    async def sessions(self) -> dict[str, tuple[str, str, str | None, str | None]]:
        """Each guarded session: name, primary node, replica node, newest replicated version."""
        return {
            k: (r.name, r.primary.id, r.replica.id if r.replica else None, r.latest_version)
            for k, r in self._sessions.items()
        }

    # ---- watching ---------------------------------------------------------------

    def _get(self, key: str) -> Replicated:
        try:
            return self._sessions[key]
        except KeyError:
            raise NodeLost(f"no replicated session {key} (removed?)", kind="node_lost") from None

    async def _probe(self, node: Node) -> bool:
        try:
            await async_resolve(node.actor.ping.remote(), timeout=PROBE_TIMEOUT_S)
        except (DrumsError, ray.exceptions.RayError, TimeoutError):
            return False
        return True

    async def _watch_nodes(self) -> None:
        while True:
            await asyncio.sleep(PROBE_EVERY_S)
            primaries = {r.primary.id: r.primary for r in self._sessions.values() if not r.lost}
            probed = time.time()
            results = await asyncio.gather(*(self._probe(n) for n in primaries.values()))
            for (nid, node), ok in zip(primaries.items(), results, strict=True):
                if ok:
                    self._misses.pop(nid, None)
                    self._first_miss.pop(nid, None)
                    continue
                self._misses[nid] = self._misses.get(nid, 0) + 1
                self._first_miss.setdefault(nid, probed)
                if self._misses[nid] >= MISSES_TO_LOSE:
                    self._misses.pop(nid, None)
                    missed = self._first_miss.pop(nid, probed)
                    noticed = time.time()
                    keys = [
                        k for k, r in self._sessions.items() if r.primary.id == nid and not r.lost
                    ]
                    self._failing.update(keys)
                    log.warning("node %s lost: resuming %d sessions", nid[:12], len(keys))
                    await asyncio.gather(*(self._resume(k, node, missed, noticed) for k in keys))

    async def _resume(self, key: str, lost: Node, missed: float, noticed: float) -> None:
        r = self._sessions[key]
        replayed = 0
        to: Node | None = None
        try:
            if r.latest is None or r.replica is None:
                raise NodeLost(
                    f"session {r.name} was on node {lost.id[:12]}, which was lost, and no "
                    "version of it had reached another node yet: it is lost with the node",
                    kind="node_lost",
                )
            to = r.replica
            (info,) = await async_resolve(to.actor.restore.remote(r.latest, 1, r.name))
            for o in [o for o in r.ops if o.done]:
                with contextlib.suppress(DrumsError):
                    await async_resolve(to.actor.call.remote(info, o.op, o.args, o.kwargs))
                replayed += 1
            r.ops = [o for o in r.ops if not o.done]
            old_latest = r.latest
            r.primary, r.session = to, info
            r.latest = None
            r.replica = await self._another_node(exclude={lost.id, to.id})
            if r.replica is not None:
                await async_resolve(
                    to.actor.replicate.remote(info, r.replica, self._me(), key, r.timeout)
                )
            # The copy it resumed from is the session's own now: drop it.
            with contextlib.suppress(DrumsError, ray.exceptions.RayError):
                await async_resolve(to.actor.remove_checkpoint.remote(old_latest))
            r.epoch += 1
            err = None
        except (DrumsError, ray.exceptions.RayError) as e:
            r.lost = (
                str(e)
                if isinstance(e, NodeLost)
                else (
                    f"session {r.name} was on node {lost.id[:12]}, which was lost, and could not "
                    f"be resumed on node {to.id[:12] if to else '?'}: {e}"
                )
            )
            err = r.lost
            log.error("%s", r.lost)
        finally:
            self._failing.discard(key)
            r.moved.set()
            r.moved = asyncio.Event()
        self._failovers.append(
            Failover(
                key,
                r.name,
                lost.id,
                to.id if to and err is None else None,
                r.latest_version,
                replayed,
                missed,
                noticed,
                time.time(),
                err,
            )
        )

    async def _another_node(self, exclude: set[str]) -> Node | None:
        from drums.ray._placement import existing_node

        for n in ray.nodes():  # type: ignore[no-untyped-call]
            nid = n["NodeID"]
            if n.get("Alive") and nid not in exclude:
                with contextlib.suppress(NodeLost):
                    node = existing_node(nid)
                    if await self._probe(node):
                        return node
        return None


def guard() -> Any:
    """The cluster's guard actor, made on the head node if it is not there."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    head = next(
        n["NodeID"]
        for n in ray.nodes()  # type: ignore[no-untyped-call]
        if n.get("Alive") and "node:__internal_head__" in n.get("Resources", {})
    )
    return (
        ray.remote(ClusterGuard)
        .options(
            name=GUARD_NAME,
            namespace=NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            num_cpus=0,
            max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=False),
        )
        .remote()
    )
