"""The async source of drums.ray's cluster layer; `_sync` is generated from
it by scripts/unasync.py."""

from drums.ray._async._cluster import AsyncCluster
from drums.ray._async._pool import AsyncClusterPool
from drums.ray._async._sandbox import (
    AsyncClusterCheckpoint,
    AsyncClusterCommands,
    AsyncClusterFiles,
    AsyncClusterSandbox,
    AsyncClusterTurn,
    AsyncTransfer,
)

__all__ = [
    "AsyncCluster",
    "AsyncClusterCheckpoint",
    "AsyncClusterCommands",
    "AsyncClusterFiles",
    "AsyncClusterPool",
    "AsyncClusterSandbox",
    "AsyncClusterTurn",
    "AsyncTransfer",
]
