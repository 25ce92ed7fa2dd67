"""The integration examples (python/examples/integrations) run against the
run's drumsd."""

from __future__ import annotations

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
