"""`AsyncClusterPool`: warm siblings of one checkpoint on every node."""

from __future__ import annotations

import builtins
import contextlib
from collections.abc import Sequence

import ray

from drums._errors import DrumsError, Unavailable
from drums.models import Pool, Session
from drums.ray._async._sandbox import AsyncClusterCheckpoint, AsyncClusterSandbox
from drums.ray._node import Node
from drums.ray._refs import async_resolve


class AsyncClusterPool:
    """A warm pool on each of `nodes`: `size` hygienic siblings of the
    checkpoint kept ready by every node's drumsd (`drums.AsyncPool`, per
    node), so that a reset anywhere in the cluster is a take.

    `take()` prefers the caller's node (the driver's, or the Ray worker's it
    runs in): a session there is one the caller reaches without a hop.
    `async with` creates the pools on enter (sending the checkpoint to each
    node first: a cache hit after the first time) and removes them on exit,
    with their members not taken. Make one with `AsyncCluster.pool`.
    """

    def __init__(
        self,
        checkpoint: AsyncClusterCheckpoint,
        nodes: Sequence[Node],
        *,
        size: int,
        name: str | None = None,
    ) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise TypeError(f"size must be a positive int, not {size!r}")
        self._checkpoint = checkpoint
        self._nodes = builtins.list(nodes)
        self._size = size
        self._name = name
        self._pools: dict[str, tuple[Node, Pool]] = {}

    def __repr__(self) -> str:
        return f"<AsyncClusterPool of {self._checkpoint.name} on {len(self._nodes)} nodes>"

    @property
    def pools(self) -> dict[str, Pool]:
        """Each node's pool as it was made, by node id."""
        return {nid: p for nid, (_, p) in self._pools.items()}

    async def create(self) -> dict[str, Pool]:
        """Send the checkpoint to every node and make each node's pool (once).
        All or nothing: a node that fails leaves no pool anywhere."""
        if self._pools:
            return self.pools
        copies = await self._checkpoint.send_many(self._nodes)
        refs = [
            (
                t.checkpoint.node,
                t.checkpoint.node.actor.pool_create.remote(
                    t.checkpoint.info, self._size, self._name
                ),
            )
            for t in copies
        ]
        failure: BaseException | None = None
        for node, ref in refs:
            try:
                self._pools[node.id] = (node, await async_resolve(ref))
            except (DrumsError, ray.exceptions.RayError) as e:
                failure = failure or e
        if failure is not None:
            await self.remove()
            raise failure
        return self.pools

    async def take(self, timeout: float = 30.0) -> AsyncClusterSandbox:
        """One ready member, yours now (kill it when done): from the
        caller's node if it has one ready, else from any node that has, else
        the first to become ready on the caller's node (or the first node)
        within `timeout` seconds; then `drums.Unavailable` with drumsd's
        reason."""
        if not self._pools:
            await self.create()
        here = ray.get_runtime_context().get_node_id()
        order = sorted(self._pools.values(), key=lambda np: np[0].id != here)
        for node, pool in order:
            try:
                info: Session = await async_resolve(node.actor.pool_take.remote(pool, 0))
            except Unavailable:
                continue
            return AsyncClusterSandbox(info, node)
        node, pool = order[0]
        info = await async_resolve(node.actor.pool_take.remote(pool, timeout))
        return AsyncClusterSandbox(info, node)

    async def info(self) -> dict[str, Pool]:
        """How each node's pool stands now, by node id."""
        refs = [
            (nid, node.actor.pool_info.remote(pool)) for nid, (node, pool) in self._pools.items()
        ]
        return {nid: await async_resolve(ref) for nid, ref in refs}

    async def remove(self) -> None:
        """Remove every node's pool and its members not taken."""
        pools, self._pools = self._pools, {}
        refs = [node.actor.pool_remove.remote(pool) for node, pool in pools.values()]
        for ref in refs:
            with contextlib.suppress(DrumsError, ray.exceptions.RayError):
                await async_resolve(ref)

    async def __aenter__(self) -> AsyncClusterPool:
        await self.create()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.remove()
