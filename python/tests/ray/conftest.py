"""The Ray cluster the tests of drums.ray share: 3 nodes on this host, each
with its own drumsd (tests/ray/cluster.py), started once for the module and
stopped at its end with proof that nothing is left.

Trust, as a cluster's operator would set it up: every node trusts every
other's key, except that node a does not trust node c (the untrusted-key
test). Node c's store is smaller (2 GiB), so it refuses a checkpoint whose
disk limit it cannot hold: a checkpoint that node cannot restore; and it
holds at most 4 sessions (`--max-sessions 4`), a node's own limit that
placement keeps to. Each node's LLM proxy listens on its own loopback port
and forwards to one mock upstream in the test's process (`cluster.llm`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.conftest import require_daemon
from tests.daemon import pick_k
from tests.integrations.mock_llm import MockLLM
from tests.ray.cluster import RayCluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    require_daemon()
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    # Every node gives a session 1 GiB of disk unless it asks (the default
    # is what the store holds, which differs between a and c).
    disk = ("--default-disk", "1G")
    llm = MockLLM().start()
    rc = RayCluster(
        k0=pick_k(17),
        store_gib={"c": 2},
        daemon_args={"a": disk, "b": disk, "c": (*disk, "--max-sessions", "4")},
        llm_upstream=f"http://127.0.0.1:{llm.port}",
    )
    rc.llm = llm
    try:
        rc.start()
    except BaseException:
        llm.stop()
        raise
    try:
        for a in rc.nodes:
            for b in rc.nodes:
                if a != b and (a, b) != ("a", "c"):
                    rc.trust(a, b)
        yield rc
    finally:
        try:
            rc.stop()
        finally:
            llm.stop()
