"""Where a session goes: the node actors, and whether a node has room.

Shared by both twins of the cluster layer."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from drums._types import parse_size
from drums.models import Capacity
from drums.ray._errors import NoCapacity, NodeLost
from drums.ray._node import NAMESPACE, DrumsNode, Node, actor_name

T = TypeVar("T")

INFO_TIMEOUT_S = 30.0
"""How long a node may take to say what it is before discovery leaves it out."""


def node_actor(node_id: str) -> Any:
    """The `DrumsNode` actor of Ray node `node_id`, made if it is not there yet."""
    return (
        ray.remote(DrumsNode)
        .options(
            name=actor_name(node_id),
            namespace=NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            num_cpus=0,
            max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        )
        .remote()
    )


def existing_node(node_id: str) -> Node:
    """The drums node `node_id`, whose actor a discovery made; `NodeLost`
    if there is none (no such node, or it is gone)."""
    try:
        return Node(node_id, ray.get_actor(actor_name(node_id), namespace=NAMESPACE))
    except ValueError as e:
        raise NodeLost(f"no drums node {node_id}: {e}", kind="node_lost") from e


def memory_needed(memory: int | str | None, cap: Capacity) -> int:
    if memory is not None:
        return parse_size(memory, "memory")
    return cap.default_memory_bytes or 0


def room(cap: Capacity, pending: int, need: int) -> str | None:
    """Why a node cannot take one more session, or None."""
    held = cap.sessions + pending
    if cap.max_sessions is not None and held >= cap.max_sessions:
        return f"{held} sessions of its {cap.max_sessions}"
    # A limit is a ceiling, not a reservation (drumsd overcommits), but a
    # session whose limit is more than the host has free now is sent where
    # it has room.
    if need > cap.memory_available_bytes:
        return f"{cap.memory_available_bytes >> 20} MiB available, {need >> 20} MiB asked"
    return None


SNAPSHOT_TTL_S = 1.0
"""How long one reading of the nodes' capacity serves placements: a burst of
creates is placed against one reading plus what this process placed since,
instead of each reading nodes that are filling under it."""


@dataclass(frozen=True)
class Snapshot(Generic[T]):
    """One reading of every node's capacity, and its generation."""

    gen: int
    caps: tuple[tuple[T, str, Capacity], ...]
    taken: float


class Placements:
    """The sessions this process sent to nodes that a capacity reading may
    not count yet, so that concurrent creates spread instead of all seeing
    the same empty node.

    Each capacity reading has a generation. A placement counts against its
    node, on top of what the node said, in every reading that began before
    its create ended; a reading that began after it ended got it from the
    node's drumsd. Thread-safe (the sync twin's users create from threads),
    with no await inside (the async twin's tasks interleave only between
    calls).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._gen = 0
        self._next = 0
        # token -> (node id, the generation when its create ended, or None)
        self._entries: dict[int, tuple[str, int | None]] = {}

    def begin_reading(self) -> int:
        """A capacity reading begins (the one before is used no more);
        returns its generation."""
        with self._lock:
            self._gen += 1
            self._entries = {
                t: (nid, ended)
                for t, (nid, ended) in self._entries.items()
                if ended is None or ended >= self._gen
            }
            return self._gen

    def choose(
        self,
        snap: Snapshot[T],
        need: Callable[[Capacity], int],
        among: set[str] | None = None,
    ) -> tuple[T, int]:
        """The node (of `among`, default all) with the most room for one
        more session: fewest sessions per CPU, then most memory available.
        Returns it with a token for `ended()`. Raises `NoCapacity` naming
        each node's reason when none has room."""
        with self._lock:
            best: tuple[tuple[float, int], T, str] | None = None
            reasons = []
            for item, nid, cap in snap.caps:
                if among is not None and nid not in among:
                    continue
                unseen = sum(
                    1
                    for n, ended in self._entries.values()
                    if n == nid and (ended is None or ended >= snap.gen)
                )
                why = room(cap, unseen, need(cap))
                if why is not None:
                    reasons.append(f"node {nid[:12]}: {why}")
                    continue
                key = ((cap.sessions + unseen) / max(cap.cpus, 1), -cap.memory_available_bytes)
                if best is None or key < best[0]:
                    best = (key, item, nid)
            if best is None:
                raise NoCapacity(
                    "no drums node can take the session: " + ("; ".join(reasons) or "none alive"),
                    kind="no_capacity",
                )
            return best[1], self._add(best[2])

    def add(self, node_id: str) -> int:
        """A session is being made on `node_id` (a placement by name)."""
        with self._lock:
            return self._add(node_id)

    def _add(self, node_id: str) -> int:
        self._next += 1
        self._entries[self._next] = (node_id, None)
        return self._next

    def ended(self, token: int) -> None:
        """The placement's create ended (made or failed)."""
        with self._lock:
            if token in self._entries:
                self._entries[token] = (self._entries[token][0], self._gen)
