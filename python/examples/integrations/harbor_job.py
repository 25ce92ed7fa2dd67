"""A Harbor job over local tasks, each trial in a drums session.

Writes two tasks in Harbor's format (task.toml, instruction.md,
environment/Dockerfile, solution/solve.sh, tests/test.sh) FROM `--base`,
runs Harbor's oracle agent over them with `DrumsEnvironment` (each task's
Dockerfile built by `drums build`, cached), and prints each trial's reward
and the mean. The same job from the command line:

    harbor run -p TASKS -a oracle -e drums.integrations.harbor:DrumsEnvironment \\
      --ek insecure=true -o jobs -y

Needs Harbor (>= 0.26, Python >= 3.12), drumsd, and the `drums` CLI on PATH;
the base needs `bash` (Harbor runs every command under `bash -c`). The
built images stay, as drums' build cache (`drums images`, `drums image rm`).

    python harbor_job.py --base 127.0.0.1:5000/debian:12 --insecure
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
from pathlib import Path

# Harbor sends telemetry unless told not to.
os.environ.setdefault("HARBOR_TELEMETRY", "0")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

TASK_TOML = """schema_version = "1.4"

[agent]
timeout_sec = 120.0

[verifier]
timeout_sec = 120.0

[environment]
build_timeout_sec = 600.0
cpus = 1
memory_mb = 512
"""


def write_tasks(root: Path, base: str) -> list[Path]:
    """Two tasks: a file to fix in the image's WORKDIR, a sum from ENV."""
    tasks = {
        "fix-greeting": (
            f"FROM {base}\nWORKDIR /app\nCOPY greeting.txt /app/greeting.txt\n",
            {"greeting.txt": "helo\n"},
            "sed -i 's/helo/hello/' greeting.txt\n",
            '[ "$(cat /app/greeting.txt)" = hello ]',
        ),
        "sum-env": (
            f"FROM {base}\nENV A=2 B=40\nRUN mkdir -p /work\nWORKDIR /work\n",
            {},
            "echo $((A + B)) > sum.txt\n",
            '[ "$(cat /work/sum.txt)" = 42 ]',
        ),
    }
    out = []
    for name, (dockerfile, files, solve, check) in tasks.items():
        t = root / name
        for d in ("environment", "solution", "tests"):
            (t / d).mkdir(parents=True)
        (t / "task.toml").write_text(TASK_TOML)
        (t / "instruction.md").write_text(f"{name}: make tests/test.sh pass.\n")
        (t / "environment/Dockerfile").write_text(dockerfile)
        for rel, text in files.items():
            (t / "environment" / rel).write_text(text)
        (t / "solution/solve.sh").write_text("#!/bin/bash\nset -e\n" + solve)
        (t / "tests/test.sh").write_text(
            f"#!/bin/bash\nif {check}; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n"
        )
        out.append(t)
    return out


async def run_job(tasks: list[Path], jobs_dir: Path, kwargs: dict[str, object]) -> Path:
    from harbor.job import Job  # type: ignore[import-untyped]
    from harbor.models.job.config import JobConfig  # type: ignore[import-untyped]
    from harbor.models.trial.config import (  # type: ignore[import-untyped]
        AgentConfig,
        EnvironmentConfig,
        TaskConfig,
    )

    config = JobConfig(
        job_name="drums-oracle",
        jobs_dir=jobs_dir,
        n_concurrent_trials=2,
        quiet=True,
        agents=[AgentConfig(name="oracle")],
        environment=EnvironmentConfig(
            import_path="drums.integrations.harbor:DrumsEnvironment", kwargs=kwargs
        ),
        tasks=[TaskConfig(path=t) for t in tasks],
    )
    job = await Job.create(config)
    await job.run()
    path: Path = job.job_dir
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", required=True, help="the tasks' FROM image (with bash)")
    p.add_argument("--insecure", action="store_true", help="--base's registry is plain HTTP")
    p.add_argument("--socket", default="", help="drumsd's socket (default: the SDK's)")
    args = p.parse_args()
    kwargs: dict[str, object] = {"insecure": args.insecure}
    if args.socket:
        kwargs["socket"] = args.socket
    if os.environ.get("DRUMS_STATE_DIR"):
        kwargs["state_dir"] = os.environ["DRUMS_STATE_DIR"]
    with tempfile.TemporaryDirectory(prefix="harbor-job-") as tmp:
        tasks = write_tasks(Path(tmp) / "tasks", args.base)
        job_dir = asyncio.run(run_job(tasks, Path(tmp) / "jobs", kwargs))
        stats = json.loads((job_dir / "result.json").read_text())["stats"]
        rewards = []
        for f in sorted(job_dir.glob("*/result.json")):
            trial = json.loads(f.read_text())
            vr = trial.get("verifier_result") or {}
            reward = (vr.get("rewards") or {}).get("reward")
            err = trial.get("exception_info")
            why = f"  ({err['exception_type']}: {err['exception_message']})" if err else ""
            print(f"{trial['task_name']:<14} reward {reward}{why}")
            if reward is not None:
                rewards.append(float(reward))
        n_err = stats["n_errored_trials"]
        mean = sum(rewards) / len(rewards) if rewards else 0.0
        print(f"mean reward {mean} over {len(rewards)} trials, {n_err} errored")
        if n_err:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
