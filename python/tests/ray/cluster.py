"""The tests' Ray cluster: `drums.ray.local.LocalCluster` with the tests'
drumsd launcher (`tests.daemon.Daemon`: fault injection on, and its stop
also checks the veths its log names)."""

from __future__ import annotations

from typing import Any

from drums.ray.local import LOOPBACK, LocalCluster, RayNode
from tests.daemon import Daemon

__all__ = ["LOOPBACK", "RayCluster", "RayNode"]


class RayCluster(LocalCluster):
    """N Ray nodes on this host, each with a `tests.daemon.Daemon`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, daemon=Daemon, **kwargs)
