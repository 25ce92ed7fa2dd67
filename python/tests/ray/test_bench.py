"""bench/cluster.py keeps working: one round of each arm on its own 3-node
cluster (headless, 2 s of resets), its JSON checked; the bench's own stop
proves it left nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import require_daemon


def test_the_cluster_bench_runs() -> None:
    require_daemon()
    bench = Path(__file__).resolve().parents[2] / "bench/cluster.py"
    r = subprocess.run(
        [sys.executable, str(bench), "-n", "1", "--profile", "headless", "--reset-seconds", "2",
         "--replicated", "2", "--desktop-replicated", "1", "--turns", "2", "--recovering", "2",
         "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-5000:]
    out = json.loads(r.stdout)
    assert out["nodes"] == 3 and len(out["node_ids"]) == 3
    fork = out["fork"]
    for arm in ("same_restore", "cross_transfer", "cross_restore", "cross_total", "hit_total"):
        assert fork[arm]["n"] == 1 and fork[arm]["p50"] > 0, arm
    assert fork["archive_bytes"] > 0
    resets = out["resets"]
    for arm in ("cluster", "one_node"):
        assert resets[arm]["runs"][0]["resets"] > 0, arm
    for rep in out["replication"]:
        assert rep["versions_copied"] >= rep["sessions"] * rep["turns_per_session"], rep
        assert rep["bytes_per_version"]["p50"] > 0
    rec = out["recovery"]
    assert rec["errors"] == [] and rec["sessions"] == 2 and rec["all_answering_s"] < 30
