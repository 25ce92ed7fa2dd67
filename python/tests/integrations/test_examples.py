"""The integration examples (python/examples/integrations) run against the
run's drumsd."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import drums
from tests.daemon import Daemon

EXAMPLES = Path(__file__).resolve().parents[2] / "examples/integrations"


@pytest.mark.parametrize(
    ("example", "expect"),
    [
        ("minisweagent_repo_task", ["exit status: Submitted", "+    return a + b", "tests pass"]),
        ("best_of_n", ["baseline: fails", "return a + b           PASS", "kept "]),
    ],
)
def test_example_runs(example: str, expect: list[str], daemon: Daemon, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "DRUMS_SOCKET": str(daemon.socket),
        "DRUMS_NO_AUTOSTART": "1",
        "PYTHONPATH": str(Path(drums.__file__).resolve().parents[1]),
    }
    r = subprocess.run(
        [sys.executable, str(EXAMPLES / f"{example}.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, f"{example} failed:\n{r.stdout}\n{r.stderr}"
    for line in expect:
        assert line in r.stdout, r.stdout


def test_bench_runs(daemon: Daemon) -> None:
    """bench/integrations/harness_bench.py keeps working (a few iterations,
    one round each, its JSON checked)."""
    bench = Path(__file__).resolve().parents[2] / "bench/integrations/harness_bench.py"
    env = {**os.environ, "PYTHONPATH": str(Path(drums.__file__).resolve().parents[1])}
    argv = [sys.executable, str(bench), "-n", "3", "--rounds", "1", "--json"]
    r = subprocess.run(
        [*argv, "--socket", str(daemon.socket)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out["execute"]) == {"drums", "drums_sh", "local"}
    assert set(out["best_of_8"]) == {"fork", "cold"}
    for arm in (*out["execute"].values(), *out["best_of_8"].values()):
        assert 0 < arm["p50_ms"] <= arm["p95_ms"]
