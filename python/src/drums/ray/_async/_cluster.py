"""`AsyncCluster`: drums over the nodes of a Ray cluster.

Each node that runs a drumsd gets a `DrumsNode` actor (detached, named after
the node, pinned there by node affinity); the cluster finds them, places
sessions by what each node can still take, moves checkpoints between them
through Ray's object store, and spreads forks and warm pools over them.
docs/cluster.md says why each piece is as it is.
"""

from __future__ import annotations

import builtins
import contextlib
import threading
import time
from collections.abc import Sequence
from typing import Any, Literal

import ray

from drums._backends import AsyncLock
from drums._errors import DaemonUnavailable, DrumsError
from drums.models import Capacity, Session
from drums.ray._async._pool import AsyncClusterPool
from drums.ray._async._sandbox import AsyncClusterCheckpoint, AsyncClusterSandbox, AsyncTransfer
from drums.ray._errors import NoCapacity, NodeLost
from drums.ray._guard import Failover, guard
from drums.ray._node import Node, NodeInfo
from drums.ray._placement import (
    INFO_TIMEOUT_S,
    SNAPSHOT_TTL_S,
    Placements,
    Snapshot,
    memory_needed,
    node_actor,
)
from drums.ray._refs import async_resolve


class AsyncCluster:
    """The drums nodes of a Ray cluster, as one.

    Connects to Ray if this process has not (`ray.init(address=...)`, default
    `"auto"`: the cluster `ray start` made on this machine). Every method
    works from the driver or from any Ray task or actor.
    """

    def __init__(self, *, address: str | None = None) -> None:
        if not ray.is_initialized():
            ray.init(address=address or "auto", log_to_driver=False)
        self._nodes: dict[str, Node] = {}
        self._placements = Placements()
        self._snapshot: Snapshot[Node] | None = None
        self._reading = AsyncLock()
        self._lock = threading.Lock()
        self.unavailable: dict[str, str] = {}
        """Ray nodes left out by the last discovery, and why (no drumsd answering)."""

    # ---- nodes ------------------------------------------------------------------

    async def nodes(self) -> builtins.list[NodeInfo]:
        """Find the cluster's drums nodes now: every alive Ray node whose
        drumsd answers its node actor. Each comes with its capacity."""
        alive = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]
        asked = [(nid, node_actor(nid)) for nid in alive]
        refs = [(nid, actor, actor.info.remote()) for nid, actor in asked]
        found: builtins.list[NodeInfo] = []
        nodes: dict[str, Node] = {}
        unavailable: dict[str, str] = {}
        for nid, actor, ref in refs:
            try:
                info: NodeInfo = await async_resolve(ref, timeout=INFO_TIMEOUT_S)
            except (DrumsError, ray.exceptions.RayError) as e:
                unavailable[nid] = str(e)
                if isinstance(e, DaemonUnavailable):
                    # No drumsd there: no drums node, and no actor left behind.
                    ray.kill(actor)
                continue
            found.append(info)
            nodes[nid] = Node(nid, actor)
        with self._lock:
            self._nodes = nodes
        self.unavailable = unavailable
        return found

    async def node(self, node: str | Node) -> Node:
        """The drums node `node` (its Ray node id), found if need be."""
        nid = node.id if isinstance(node, Node) else node
        if nid not in self._nodes:
            await self.nodes()
        try:
            return self._nodes[nid]
        except KeyError:
            why = self.unavailable.get(nid, "no such alive Ray node")
            raise NodeLost(f"no drums node {nid}: {why}", kind="node_lost") from None

    async def _known(self) -> builtins.list[Node]:
        if not self._nodes:
            await self.nodes()
        if not self._nodes:
            raise NoCapacity(
                f"no drums node in the Ray cluster: {self.unavailable or 'no alive node'}",
                kind="no_capacity",
            )
        return builtins.list(self._nodes.values())

    async def _capacities(self, nodes: Sequence[Node]) -> builtins.list[tuple[Node, str, Capacity]]:
        """Each node's capacity now; a node that does not answer is left out
        (and forgotten until the next discovery)."""
        refs = [(n, n.actor.capacity.remote()) for n in nodes]
        out: builtins.list[tuple[Node, str, Capacity]] = []
        for n, ref in refs:
            try:
                out.append((n, n.id, await async_resolve(ref, timeout=INFO_TIMEOUT_S)))
            except (DrumsError, ray.exceptions.RayError) as e:
                self.unavailable[n.id] = str(e)
                with self._lock:
                    self._nodes.pop(n.id, None)
        return out

    async def _place(
        self, memory: int | str | None, among: Sequence[Node] | None = None
    ) -> tuple[Node, int]:
        """The node with the most room for one more session, and the token
        the caller hands `_placements.ended` once the session is made."""
        nodes = await self._known()
        async with self._reading:
            snap = self._snapshot
            if (
                snap is None
                or time.monotonic() - snap.taken > SNAPSHOT_TTL_S
                or {nid for _, nid, _ in snap.caps} != {n.id for n in nodes}
            ):
                gen = self._placements.begin_reading()
                caps = await self._capacities(nodes)
                snap = self._snapshot = Snapshot(gen, tuple(caps), time.monotonic())
            ids = {n.id for n in among} if among is not None else None
            return self._placements.choose(snap, lambda cap: memory_needed(memory, cap), ids)

    # ---- sessions ---------------------------------------------------------------

    async def create(
        self,
        *,
        node: str | Node | None = None,
        image: str | None = None,
        profile: Literal["headless", "desktop"] | None = None,
        memory: int | str | None = None,
        cpus: float | None = None,
        pids: int | None = None,
        disk: int | str | None = None,
        egress: Literal["none", "nat"] | None = None,
        network: Literal["bridge", "none"] | None = None,
        name: str | None = None,
        desktop_url: str | None = None,
        screen: str | None = None,
        run: bool | None = None,
        replicate: bool = False,
        replica: str | Node | None = None,
        replica_timeout: float = 30.0,
    ) -> AsyncClusterSandbox:
        """Create a session on `node`, or on the node with the most room for
        it (`drums.AsyncSandbox.create`'s arguments). Raises `NoCapacity`
        when no node can take it.

        With `replicate`, it survives the loss of its node: each durable
        version of it (an agent's turn through the node's LLM proxy) is
        copied to a second node before the turn's answer is released (held
        at most `replica_timeout` seconds), and when its node is lost it
        resumes there, its handles with it (docs/cluster.md). The second
        node is `replica`, or the one with the most room."""
        kwargs: dict[str, Any] = {
            k: v
            for k, v in (
                ("image", image),
                ("profile", profile),
                ("memory", memory),
                ("cpus", cpus),
                ("pids", pids),
                ("disk", disk),
                ("egress", egress),
                ("network", network),
                ("name", name),
                ("desktop_url", desktop_url),
                ("screen", screen),
                ("run", run),
            )
            if v is not None
        }
        if node is not None:
            target = await self.node(node)
            token = self._placements.add(target.id)
        else:
            target, token = await self._place(memory)
        try:
            info: Session = await async_resolve(target.actor.create.remote(kwargs))
        finally:
            self._placements.ended(token)
        if not replicate:
            return AsyncClusterSandbox(info, target)
        try:
            if replica is not None:
                second = await self.node(replica)
            else:
                others = [n for n in await self._known() if n.id != target.id]
                if not others:
                    raise NoCapacity(
                        "replicate=True needs a second drums node for the replicas",
                        kind="no_capacity",
                    )
                second, rtoken = await self._place(None, others)
                self._placements.ended(rtoken)
            g = guard()
            key: str = await async_resolve(g.register.remote(info, target, second, replica_timeout))
        except BaseException:
            await async_resolve(target.actor.call.remote(info, "kill", (), {}))
            raise
        return AsyncClusterSandbox(info, target, guard=g, key=key)

    async def failovers(self) -> builtins.list[Failover]:
        """Every resumption of a replicated session after its node was lost,
        oldest first: which node, where to, from which version, how many of
        its handles' operations were done again, and when."""
        found: builtins.list[Failover] = await async_resolve(guard().failovers.remote())
        return found

    async def sandboxes(self) -> builtins.list[AsyncClusterSandbox]:
        """Every session on every drums node."""
        nodes = await self._known()
        refs = [(n, n.actor.sessions.remote()) for n in nodes]
        out: builtins.list[AsyncClusterSandbox] = []
        for n, ref in refs:
            infos: builtins.list[Session] = await async_resolve(ref)
            out.extend(AsyncClusterSandbox(i, n) for i in infos)
        return out

    async def connect(self, session: str, *, node: str | Node) -> AsyncClusterSandbox:
        """The session `session` (id or name) of node `node`."""
        n = await self.node(node)
        info: Session = await async_resolve(n.actor.session.remote(session))
        return AsyncClusterSandbox(info, n)

    async def checkpoint(self, checkpoint: str, *, node: str | Node) -> AsyncClusterCheckpoint:
        """The checkpoint `checkpoint` (id or name) of node `node`."""
        n = await self.node(node)
        return AsyncClusterCheckpoint(await async_resolve(n.actor.checkpoint.remote(checkpoint)), n)

    # ---- checkpoints that travel -----------------------------------------------------

    async def send(self, checkpoint: AsyncClusterCheckpoint, to: str | Node) -> AsyncTransfer:
        """Copy a checkpoint to node `to`, through Ray's object store in
        chunks; the node restores it from its own store afterwards. Nothing
        moves when `to` has it already (its cache, by the archive's digest).

        Raises `drums.Untrusted` when `to` does not trust the sending node's
        key, `drums.InvalidArgument` when it cannot restore what it is sent
        (another kernel, CPU or CRIU; an image it lacks), `TransferError`
        when the bytes stop coming; each time `to` keeps nothing.
        """
        (t,) = await self.send_many(checkpoint, [to])
        return t

    async def send_many(
        self, checkpoint: AsyncClusterCheckpoint, to: Sequence[str | Node]
    ) -> builtins.list[AsyncTransfer]:
        """`send` to several nodes, exporting the archive once."""
        return await checkpoint.send_many([await self.node(n) for n in to])

    # ---- warm pools over the cluster ---------------------------------------------------

    async def pool(
        self,
        checkpoint: AsyncClusterCheckpoint,
        *,
        size: int,
        nodes: Sequence[str | Node] | None = None,
        name: str | None = None,
    ) -> AsyncClusterPool:
        """Warm siblings of `checkpoint`, `size` on each of `nodes` (default:
        every drums node); `async with` makes and removes them, and `take()`
        prefers the caller's node (`AsyncClusterPool`)."""
        among = [await self.node(n) for n in nodes] if nodes is not None else await self._known()
        return AsyncClusterPool(checkpoint, among, size=size, name=name)

    # ---- forks over the cluster ------------------------------------------------------

    async def fork(
        self,
        checkpoint: AsyncClusterCheckpoint,
        count: int,
        *,
        nodes: Sequence[str | Node] | None = None,
    ) -> builtins.list[AsyncClusterSandbox]:
        """`count` hygienic siblings of a checkpoint, spread over `nodes`
        (default: every drums node) by room: the checkpoint is sent to each
        node that gets one (a cache hit after the first time), then each node
        restores its share concurrently. All or nothing: if any sibling
        fails, the others are removed and the error is raised."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise TypeError(f"count must be a positive int, not {count!r}")
        among = [await self.node(n) for n in nodes] if nodes is not None else await self._known()
        share: dict[str, int] = {}
        tokens: builtins.list[int] = []
        try:
            for _ in range(count):
                n, token = await self._place(None, among)
                tokens.append(token)
                share[n.id] = share.get(n.id, 0) + 1
            targets = [n for n in among if n.id in share]
            copies = {
                t.checkpoint.node.id: t.checkpoint
                for t in await self.send_many(checkpoint, targets)
            }
            refs = [
                (copies[nid], copies[nid].node.actor.restore.remote(copies[nid].info, k))
                for nid, k in share.items()
            ]
            made: builtins.list[AsyncClusterSandbox] = []
            failure: BaseException | None = None
            for ck, ref in refs:
                try:
                    infos: builtins.list[Session] = await async_resolve(ref)
                except (DrumsError, ray.exceptions.RayError) as e:
                    failure = failure or e
                    continue
                made.extend(AsyncClusterSandbox(i, ck.node) for i in infos)
            if failure is not None:
                for sb in made:
                    with contextlib.suppress(DrumsError, ray.exceptions.RayError):
                        await sb.kill()
                raise failure
            return made
        finally:
            for token in tokens:
                self._placements.ended(token)


__all__ = ["AsyncCluster", "AsyncTransfer"]
