"""`DrumsNode`: the Ray actor in front of one node's drumsd.

One per node, named after the node's Ray id, detached and pinned there by
node affinity (ROCK's shape: one local runtime per node, reached through an
actor). It talks to its drumsd on the node's unix socket (`DRUMS_SOCKET` in
the environment `ray start` ran in, else drumsd's default); nothing of drums
listens on a network port for the cluster. It never starts a drumsd: a node
without one answering is no drums node.

Everything the cluster layer asks of a node goes through here: sessions and
their calls, capacity, and the two ends of a checkpoint's transfer
(`stage`, which exports into Ray's object store a chunk at a time, and
`receive`, which imports from it while checking the bytes against their
digest).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import ray

from drums._async._checkpoints import AsyncCheckpoint
from drums._async._client import AsyncClient
from drums._async._pools import AsyncPool
from drums._async._sandbox import AsyncSandbox
from drums._errors import DrumsError, NotFound
from drums.models import Capacity, Pool, Session
from drums.models import Checkpoint as CheckpointInfo
from drums.ray._errors import TransferError

NAMESPACE = "drums"
"""The Ray namespace the node actors are named in."""

log = logging.getLogger("drums.ray")

CHUNK = 8 << 20
"""Bytes of a checkpoint archive per object in Ray's object store: a
transfer holds one chunk at a time in a process's memory."""

CACHE_PREFIX = "ray-"
"""A checkpoint a node received is named `ray-` and its digest's first 48
hex digits (192 bits): the node's cache, kept in its drumsd's catalog, so it
outlives the actor and drumsd's restarts."""


def actor_name(node_id: str) -> str:
    """The name of the node actor of Ray node `node_id`."""
    return f"drums-node-{node_id}"


def cache_name(digest: str) -> str:
    """The name a node gives the checkpoint whose archive has `digest`."""
    return CACHE_PREFIX + digest[:48]


@dataclass(frozen=True)
class NodeInfo:
    """What a drums node is: its Ray node id and address, its drumsd, its
    signing key (the line another node's trusted-keys takes) and its
    capacity now."""

    node_id: str
    address: str
    socket: str
    drumsd_version: str
    trusted_keys_line: str
    capacity: Capacity


@dataclass(frozen=True)
class Node:
    """A drums node of the cluster, as a handle: its Ray node id and its
    actor (which pickles, so a handle works from any worker)."""

    id: str
    actor: Any

    def __repr__(self) -> str:
        return f"<Node {self.id[:12]}>"


@dataclass(frozen=True)
class Staged:
    """A checkpoint's signed archive, exported into Ray's object store.

    `chunks` are the archive's bytes in order, one object each; `digest` is
    the sha256 of all of them. The objects live while someone holds this.
    """

    source: str
    checkpoint: str
    name: str
    digest: str
    size: int
    chunks: tuple[ray.ObjectRef[bytes], ...]
    seconds: float


@dataclass(frozen=True)
class Received:
    """The receiving end of a transfer: the checkpoint on this node, the
    archive's bytes that moved (0: it was in the node's cache) and how long
    the import took."""

    checkpoint: CheckpointInfo
    moved_bytes: int
    seconds: float


# What a cluster handle may ask of a session, by name: nothing else of the
# SDK's objects is reachable through the actor.
_SessionOp = Callable[..., Awaitable[Any]]
SESSION_OPS: dict[str, Callable[[AsyncSandbox], _SessionOp]] = {
    "refresh": lambda sb: sb.refresh,
    "stats": lambda sb: sb.stats,
    "kill": lambda sb: sb.kill,
    "checkpoint": lambda sb: sb.checkpoint,
    "fork": lambda sb: sb.fork,
    "versions": lambda sb: sb.versions,
    "rollback": lambda sb: sb.rollback,
    "recover": lambda sb: sb.recover,
    "turns": lambda sb: sb.turns,
    "mark_agent": lambda sb: sb.mark_agent,
    "screenshot": lambda sb: sb.screenshot,
    "turn.begin": lambda sb: sb.turn.begin,
    "turn.end": lambda sb: sb.turn.end,
    "commands.run": lambda sb: sb.commands.run,
    "commands.kill": lambda sb: sb.commands.kill,
    "files.read": lambda sb: sb.files.read,
    "files.write": lambda sb: sb.files.write,
    "files.list": lambda sb: sb.files.list,
    "files.exists": lambda sb: sb.files.exists,
    "files.remove": lambda sb: sb.files.remove,
}


def _plain(value: Any) -> Any:
    """An answer as data that crosses processes: a sandbox as its `Session`,
    a checkpoint as its `Checkpoint` (the cluster handles wrap them again
    with their node)."""
    if isinstance(value, AsyncSandbox):
        return value.info
    if isinstance(value, AsyncCheckpoint):
        return value.info
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


class DrumsNode:
    """The actor of one node (see the module's doc). Made by
    `drums.ray.Cluster`, never by hand: `ray.remote(DrumsNode)` with node
    affinity, `lifetime="detached"` and the name `actor_name(node_id)`."""

    def __init__(self) -> None:
        # A node actor never starts a drumsd: the node's operator runs it.
        self._client = AsyncClient(autostart=False)
        self._node_id = ray.get_runtime_context().get_node_id()
        # Digests of what this node exported, by checkpoint id: a published
        # checkpoint never changes, so its archive's digest is known after
        # the first export and a second transfer can be a cache hit.
        self._digests: dict[str, str] = {}
        self._receiving: dict[str, asyncio.Lock] = {}
        # The copier of each replicated session of this node, by session id.
        self._copiers: dict[str, asyncio.Task[None]] = {}
        self._replicated: list[tuple[str, int, float]] = []

    # ---- the node -------------------------------------------------------------

    async def info(self) -> NodeInfo:
        """The node's drumsd, key and capacity; raises `DaemonUnavailable`
        when no drumsd answers on the node's socket."""
        version = await self._client.version()
        key = await self._client.host_key()
        return NodeInfo(
            node_id=self._node_id,
            address=ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]
            socket=str(self._client.socket),
            drumsd_version=version.version,
            trusted_keys_line=key.trusted_keys_line,
            capacity=await self._client.capacity(),
        )

    async def capacity(self) -> Capacity:
        """The node's capacity now."""
        return await self._client.capacity()

    async def pid(self) -> int:
        """The actor's process id (tests kill nodes by it)."""
        return os.getpid()

    # ---- sessions ---------------------------------------------------------------

    async def create(self, kwargs: dict[str, Any]) -> Session:
        """A new session on this node (`AsyncSandbox.create`'s arguments)."""
        sb = await self._client.sandboxes.create(**kwargs)
        return sb.info

    async def sessions(self) -> list[Session]:
        """Every session of this node's drumsd."""
        return [s.info for s in await self._client.sandboxes.list()]

    async def session(self, id_or_name: str) -> Session:
        """One session of this node."""
        return (await self._client.sandboxes.connect(id_or_name)).info

    async def call(
        self, session: Session, op: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """`op` (a key of `SESSION_OPS`) on the session; an answer with a
        sandbox or a checkpoint in it comes back as its data."""
        get = SESSION_OPS.get(op)
        if get is None:
            raise DrumsError(f"no session operation {op!r} on a drums node", kind="bad_request")
        sb = AsyncSandbox(session, client=self._client)
        return _plain(await get(sb)(*args, **kwargs))

    async def llm_base_url(self, session: Session) -> str:
        """The OpenAI-style base URL of the session on this node's LLM proxy
        (for an agent outside it); `DrumsError` when the proxy does not
        listen on the host (`drumsd --llm-proxy-local off`)."""
        at = (await self._client.version()).llm_proxy_local
        if at is None:
            raise DrumsError(
                "this node's drumsd has no LLM proxy on the host (--llm-proxy-local off)",
                kind="no_llm_proxy",
            )
        return f"http://{at}/s/{session.name}/v1"

    async def ping(self) -> None:
        """Whether the node answers: its actor, then its drumsd."""
        await self._client.version()

    # ---- replication (the copier) ---------------------------------------------

    async def replicate(
        self, session: Session, replica: Node, guard: Any, key: str, timeout: float
    ) -> None:
        """Copy every durable version of the session to `replica` before the
        answer of its turn is released: turn the session's replication gate
        on, then, in the background, take each version the gate names,
        send it, tell the guard, and acknowledge it."""
        sb = AsyncSandbox(session, client=self._client)
        await sb.replication.on(timeout=timeout)
        old = self._copiers.pop(session.id, None)
        if old is not None:
            old.cancel()
        self._copiers[session.id] = asyncio.get_running_loop().create_task(
            self._copy(sb, replica, guard, key)
        )

    async def _copy(self, sb: AsyncSandbox, replica: Node, guard: Any, key: str) -> None:
        from drums.ray._refs import async_resolve

        failed: str | None = None
        while True:
            try:
                version = await sb.replication.next(wait=5.0)
            except NotFound:
                return  # the session or its gate is gone
            except DrumsError as e:
                log.warning("replication of %s: %s", sb.name, e)
                await asyncio.sleep(0.5)
                continue
            if version is None:
                continue
            if version == failed:
                # Still waiting on one that failed: its hold times out and
                # drops it; the next version tries again.
                await asyncio.sleep(0.2)
                continue
            try:
                t0 = time.monotonic()
                staged = await self.stage(version)
                rx: Received = await async_resolve(replica.actor.receive.remote(staged))
                await async_resolve(guard.replicated.remote(key, version, rx.checkpoint))
                await sb.replication.ack(version)
                self._replicated.append((version, staged.size, time.monotonic() - t0))
                failed = None
            except (DrumsError, ray.exceptions.RayError) as e:
                log.warning("replication of %s, version %s: %s", sb.name, version, e)
                failed = version

    async def replicated(self) -> list[tuple[str, int, float]]:
        """The versions this node copied: id, archive bytes, seconds."""
        return list(self._replicated)

    # ---- checkpoints --------------------------------------------------------------

    async def checkpoint(self, id_or_name: str) -> CheckpointInfo:
        """A checkpoint of this node."""
        return (await self._client.checkpoints.get(id_or_name)).info

    async def checkpoints(self) -> list[CheckpointInfo]:
        """Every checkpoint of this node."""
        return [c.info for c in await self._client.checkpoints.list()]

    async def restore(
        self, checkpoint: CheckpointInfo, count: int, name: str | None = None
    ) -> list[Session]:
        """`count` hygienic siblings of a checkpoint of this node."""
        sibs = await AsyncCheckpoint(checkpoint, client=self._client).restore(count, name=name)
        return [s.info for s in sibs]

    async def remove_checkpoint(self, checkpoint: CheckpointInfo) -> bool:
        """Remove a checkpoint of this node; False if it was gone."""
        try:
            await AsyncCheckpoint(checkpoint, client=self._client).remove()
        except NotFound:
            return False
        self._digests.pop(checkpoint.id, None)
        return True

    # ---- warm pools ---------------------------------------------------------------

    async def pool_create(self, checkpoint: CheckpointInfo, size: int, name: str | None) -> Pool:
        """A warm pool of a checkpoint of this node, kept by its drumsd."""
        return await AsyncPool(checkpoint.id, size=size, name=name, client=self._client).create()

    async def pool_take(self, pool: Pool, timeout: float) -> Session:
        """One ready member of the node's pool, yours now (`Unavailable`
        when none is ready within `timeout` seconds)."""
        sb = await self._pool(pool).take(timeout)
        return sb.info

    async def pool_info(self, pool: Pool) -> Pool:
        """How the node's pool stands."""
        return await self._pool(pool).info()

    async def pool_remove(self, pool: Pool) -> bool:
        """Remove the node's pool and its members not taken."""
        return await self._pool(pool).remove()

    def _pool(self, info: Pool) -> AsyncPool:
        p = AsyncPool(info.checkpoint, size=info.size, name=info.name, client=self._client)
        p._info = info
        return p

    async def digest_of(self, checkpoint: str) -> str | None:
        """The digest of a checkpoint's archive, if this node exported it before."""
        return self._digests.get(checkpoint)

    async def lookup(self, digest: str) -> CheckpointInfo | None:
        """The checkpoint this node received with `digest`, if it has it."""
        try:
            return (await self._client.checkpoints.get(cache_name(digest))).info
        except NotFound:
            return None

    async def stage(self, checkpoint: str) -> Staged:
        """Export a checkpoint of this node into the object store, a chunk of
        `CHUNK` bytes per object, hashing it as it passes."""
        t0 = time.monotonic()
        ck = await self._client.checkpoints.get(checkpoint)
        h = hashlib.sha256()
        refs: list[ray.ObjectRef[bytes]] = []
        size = 0
        async for chunk in ck.iter_export(CHUNK):
            h.update(chunk)
            size += len(chunk)
            refs.append(ray.put(chunk))
        digest = h.hexdigest()
        self._digests[ck.id] = digest
        return Staged(
            source=self._node_id,
            checkpoint=ck.id,
            name=ck.name,
            digest=digest,
            size=size,
            chunks=tuple(refs),
            seconds=time.monotonic() - t0,
        )

    async def receive(self, staged: Staged) -> Received:
        """Import a staged archive (or find it in this node's cache). Its
        signature is checked by drumsd against the keys this node trusts,
        and what it is against this host (kernel, CPU, CRIU); a refusal,
        or bytes that stop coming, keep nothing here."""
        t0 = time.monotonic()
        lock = self._receiving.setdefault(staged.digest, asyncio.Lock())
        async with lock:
            hit = await self.lookup(staged.digest)
            if hit is not None:
                return Received(hit, 0, time.monotonic() - t0)
            ck = await self._client.checkpoints.import_(
                _verified_chunks(staged), name=cache_name(staged.digest)
            )
            return Received(ck.info, staged.size, time.monotonic() - t0)


async def _verified_chunks(staged: Staged) -> AsyncIterator[bytes]:
    """The staged archive's chunks, fetched one at a time from the object
    store. The last one is held back until the digest of all of them
    matches: an archive that is not what was staged never ends cleanly, so
    drumsd refuses it as truncated and keeps nothing."""
    h = hashlib.sha256()
    held: bytes | None = None
    got = 0
    for i, ref in enumerate(staged.chunks):
        try:
            chunk = await ref
        except ray.exceptions.RayError as e:
            raise TransferError(
                f"the archive of checkpoint {staged.name} from node {staged.source[:12]} "
                f"broke off at chunk {i + 1} of {len(staged.chunks)} ({got} bytes): {e}",
                kind="transfer",
            ) from e
        h.update(chunk)
        got += len(chunk)
        if held is not None:
            yield held
        held = chunk
    if got != staged.size or h.hexdigest() != staged.digest:
        raise TransferError(
            f"the archive of checkpoint {staged.name} from node {staged.source[:12]} "
            f"arrived as {got} bytes with digest {h.hexdigest()[:16]}, not {staged.size} "
            f"with {staged.digest[:16]}",
            kind="transfer",
        )
    if held is not None:
        yield held
