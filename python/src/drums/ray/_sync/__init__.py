# GENERATED from src/drums/ray/_async/__init__.py by scripts/unasync.py: do not edit.
"""The async source of drums.ray's cluster layer; `_sync` is generated from
it by scripts/unasync.py."""

from drums.ray._sync._cluster import Cluster
from drums.ray._sync._pool import ClusterPool
from drums.ray._sync._sandbox import (
    ClusterCheckpoint,
    ClusterCommands,
    ClusterFiles,
    ClusterSandbox,
    ClusterTurn,
    Transfer,
)

__all__ = [
    "Cluster",
    "ClusterCheckpoint",
    "ClusterCommands",
    "ClusterFiles",
    "ClusterPool",
    "ClusterSandbox",
    "ClusterTurn",
    "Transfer",
]
