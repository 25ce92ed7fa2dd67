"""drums on a Ray cluster: one `DrumsNode` actor per node in front of that
node's drumsd, sessions placed by each node's room, checkpoints that travel
between nodes through Ray's object store, and forks spread over nodes.

    import drums.ray

    cluster = drums.ray.Cluster()          # ray.init(address="auto") if needed
    for n in cluster.nodes():
        print(n.node_id, n.capacity.sessions)
    sb = cluster.create()                  # on the node with the most room
    print(sb.node, sb.commands.run("hostname").stdout)
    ck = sb.checkpoint()
    siblings = cluster.fork(ck, count=6)   # spread over every node

`AsyncCluster` and its handles are the async twins. Every node runs its own
drumsd (`DRUMS_SOCKET` in the environment of its `ray start`, else drumsd's
default socket); nothing of drums listens on a network port for the cluster.
A node accepts another's checkpoints only if it trusts that node's key
(`drums key show` there, in `STATE/trusted-keys` here). docs/cluster.md has
the design and its choices.
"""

from drums.ray._async import (
    AsyncCluster,
    AsyncClusterCheckpoint,
    AsyncClusterCommands,
    AsyncClusterFiles,
    AsyncClusterPool,
    AsyncClusterSandbox,
    AsyncClusterTurn,
    AsyncTransfer,
)
from drums.ray._errors import NoCapacity, NodeLost, TransferError
from drums.ray._guard import GUARD_NAME, ClusterGuard, Failover
from drums.ray._node import CHUNK, NAMESPACE, DrumsNode, Node, NodeInfo, actor_name, cache_name
from drums.ray._sync import (
    Cluster,
    ClusterCheckpoint,
    ClusterCommands,
    ClusterFiles,
    ClusterPool,
    ClusterSandbox,
    ClusterTurn,
    Transfer,
)

__all__ = [
    "CHUNK",
    "GUARD_NAME",
    "NAMESPACE",
    "AsyncCluster",
    "AsyncClusterCheckpoint",
    "AsyncClusterCommands",
    "AsyncClusterFiles",
    "AsyncClusterPool",
    "AsyncClusterSandbox",
    "AsyncClusterTurn",
    "AsyncTransfer",
    "Cluster",
    "ClusterCheckpoint",
    "ClusterCommands",
    "ClusterFiles",
    "ClusterGuard",
    "ClusterPool",
    "ClusterSandbox",
    "ClusterTurn",
    "DrumsNode",
    "Failover",
    "NoCapacity",
    "Node",
    "NodeInfo",
    "NodeLost",
    "Transfer",
    "TransferError",
    "actor_name",
    "cache_name",
]
