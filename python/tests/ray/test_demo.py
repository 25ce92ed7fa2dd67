"""`python -m drums.ray.demo --nodes 3 --json` does what it says, and removes
everything it made (its own cluster's stop proves it; the module's checks
find nothing of it either)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import require_daemon
from tests.daemon import bin_dir


def test_the_demo_runs_and_leaves_nothing() -> None:
    require_daemon()
    r = subprocess.run(
        [sys.executable, "-m", "drums.ray.demo", "--nodes", "3", "--json"],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "DRUMS_BIN_DIR": str(bin_dir()), "RAY_USAGE_STATS_ENABLED": "0"},
    )
    assert r.returncode == 0, r.stderr[-5000:]
    out = json.loads(r.stdout)
    assert out["nodes"] == 3 and sorted(out["node_ids"]) == ["a", "b", "c"]
    per = [sum(1 for p in out["placements"] if p["node"] == n) for n in "abc"]
    assert per == [2, 2, 2], out["placements"]
    first, second = out["forks"]
    assert first["moved_bytes"]["a"] == 0  # its own node
    assert first["moved_bytes"]["b"] > 100 << 20 and first["moved_bytes"]["c"] > 100 << 20
    assert second["moved_bytes"] == {"a": 0, "b": 0, "c": 0}
    assert len(set(first["siblings"].values())) == 3
    agent = out["agent"]
    assert (agent["killed_node"], agent["ended_on"]) == ("c", "b")
    assert [s["node"] for s in agent["steps"]] == ["c", "c", "b", "b", "b"]
    assert [s["stdout"] for s in agent["steps"]] == [
        "1\n",
        "a\n",
        "one\nthree\n",
        "two\n2\n",
        "done\n",
    ]
    rec = agent["recovery"]
    assert rec["error"] is None and 0 <= rec["noticed_s"] <= rec["resumed_s"] < 10
    assert out["outcome"] == "finished on another node" and out["cleaned_up"] is True
