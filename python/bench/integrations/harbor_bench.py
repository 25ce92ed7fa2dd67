#!/usr/bin/env python3
"""A Harbor trial environment's start and stop: drums against podman.

    python bench/integrations/harbor_bench.py --base REF [--insecure] [-n 20] [--socket S] [--json]

One task (`FROM --base`, `WORKDIR`, `ENV`, `RUN`), `cpus = 1`, `memory_mb =
512`, built once by each arm before timing. Interleaved (the arm that goes
first alternates every iteration):

- **drums**: `DrumsEnvironment.start(force_build=False)` as Harbor's trial
  calls it (`drums build`, a cache hit; the session with the task's limits
  and no network, as podman's; Harbor's `/logs` dirs), then
  `stop(delete=True)`.
- **podman**: what Harbor's docker environment does, with podman:
  `podman build` (a cache hit), `podman run -d --cpus 1 --memory 512m IMAGE
  sleep infinity` (runc, `--network none`, ulimits it may set: podman as it
  works on this host), `podman exec` of the same `/logs` mkdir, then `podman rm
  -f -t 0`. podman keeps its images and containers in a storage of this run
  (`--root`), removed at the end.

Harbor's docker environment itself cannot run on this host: there is no
docker (and no docker compose); the output says so. Needs a running drumsd
(DRUMS_SOCKET or --socket), the `drums` CLI on PATH, podman, and Harbor.
It removes every session, container and image it made.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harbor.models.task.config import (  # type: ignore[import-untyped]
    EnvironmentConfig,
    NetworkMode,
    NetworkPolicy,
)
from harbor.models.trial.paths import TrialPaths  # type: ignore[import-untyped]

import drums
from drums.integrations.harbor import DrumsEnvironment

DOCKER_MISSING = (
    "!!! Harbor's docker environment is NOT measured: this host has no docker "
    "(nor docker compose). podman, doing the same steps, stands in for it. !!!"
)
_DIRS = "/logs/agent /logs/verifier /logs/artifacts"
LOGS = f"mkdir -p {_DIRS} && chmod 777 {_DIRS}"  # Harbor's ensure_dirs


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def stats(xs: list[float]) -> dict[str, float]:
    return {"p50_ms": round(statistics.median(xs), 1), "p95_ms": round(pct(xs, 95), 1)}


def write_task(root: Path, base: str) -> Path:
    env = root / "environment"
    env.mkdir(parents=True)
    (env / "Dockerfile").write_text(
        f"FROM {base}\nENV BENCH=1\nRUN mkdir -p /app && echo ready > /app/state\nWORKDIR /app\n"
    )
    return env


class Drums:
    def __init__(self, env_dir: Path, tmp: Path, args: argparse.Namespace) -> None:
        self.env_dir, self.tmp, self.args = env_dir, tmp, args
        self.i = 0

    def make(self) -> DrumsEnvironment:
        self.i += 1
        trial = TrialPaths(self.tmp / f"trial{self.i}")
        trial.mkdir()
        kwargs: dict[str, Any] = {"insecure": self.args.insecure}
        if self.args.socket:
            kwargs["socket"] = self.args.socket
        if self.args.state_dir:
            kwargs["state_dir"] = self.args.state_dir
        return DrumsEnvironment(
            environment_dir=self.env_dir,
            environment_name="bench",
            session_id=f"bench__{self.i}__env",
            trial_paths=trial,
            task_env_config=EnvironmentConfig(cpus=1, memory_mb=512, network_mode="no-network"),
            # No network, as podman's arm (its bridge does not work here).
            network_policy=NetworkPolicy(network_mode=NetworkMode.NO_NETWORK),
            logger=logging.getLogger("harbor_bench"),
            **kwargs,
        )

    async def once(self) -> tuple[float, float]:
        env = self.make()
        t0 = time.perf_counter()
        try:
            await env.start(force_build=False)
            t1 = time.perf_counter()
            r = await env.exec("cat /app/state", timeout_sec=30)
            if r.stdout != "ready\n":
                raise RuntimeError(f"drums: {r}")
        finally:
            t2 = time.perf_counter()
            await env.stop(delete=True)
        t3 = time.perf_counter()
        return (t1 - t0) * 1000, (t3 - t2) * 1000


class Podman:
    def __init__(self, env_dir: Path, tmp: Path, args: argparse.Namespace) -> None:
        self.env_dir = env_dir
        self.root = tmp / "podman"
        self.g = ["podman", "--root", str(self.root / "root"), "--runroot", str(self.root / "run")]
        self.tag = "localhost/harbor-bench:latest"
        self.tls = [] if not args.insecure else ["--tls-verify=false"]
        self.i = 0

    def run(self, *argv: str) -> str:
        r = subprocess.run(
            [*self.g, *argv], capture_output=True, text=True, stdin=subprocess.DEVNULL
        )
        if r.returncode != 0:
            raise RuntimeError(f"podman {' '.join(argv[:2])}: {r.stderr.strip()[-800:]}")
        return r.stdout

    def build(self) -> None:
        self.run("build", "-q", *self.tls, "-t", self.tag, str(self.env_dir))

    def once(self) -> tuple[float, float]:
        self.i += 1
        name = f"harbor-bench-{self.i}"
        t0 = time.perf_counter()
        try:
            self.build()
            # As podman works on this host (crates/bench/src/image.rs):
            # runc, no network, ulimits it may set without CAP_SYS_RESOURCE.
            self.run(
                "--runtime", "runc", "run", "-d", "--name", name, "--network", "none",
                "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1000:1000",
                "--cpus", "1", "--memory", "512m", self.tag, "sleep", "infinity",
            )  # fmt: skip
            self.run("exec", name, "sh", "-c", LOGS)
            t1 = time.perf_counter()
            if self.run("exec", name, "cat", "/app/state") != "ready\n":
                raise RuntimeError("podman: no /app/state")
        finally:
            t2 = time.perf_counter()
            subprocess.run([*self.g, "rm", "-f", "-t", "0", name], capture_output=True, check=False)
        t3 = time.perf_counter()
        return (t1 - t0) * 1000, (t3 - t2) * 1000

    def close(self) -> None:
        subprocess.run([*self.g, "rm", "-a", "-f", "-t", "0"], capture_output=True, check=False)
        subprocess.run([*self.g, "rmi", "-a", "-f"], capture_output=True, check=False)
        shutil.rmtree(self.root, ignore_errors=True)


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="harbor-bench-"))
    dr = pm = None
    built: str | None = None
    try:
        env_dir = write_task(tmp / "task", args.base)
        dr = Drums(env_dir, tmp, args)
        pm = Podman(env_dir, tmp, args)
        # Warm-up, untimed: each arm builds its image once.
        await dr.once()
        built = f"localhost/harbor-{dr.make().environment_id}:latest"
        pm.build()
        pm.once()
        times: dict[str, dict[str, list[float]]] = {
            a: {"start": [], "stop": []} for a in ("drums", "podman")
        }
        for i in range(args.n):
            order = ("drums", "podman") if i % 2 == 0 else ("podman", "drums")
            for arm in order:
                start, stop = await dr.once() if arm == "drums" else pm.once()
                times[arm]["start"].append(start)
                times[arm]["stop"].append(stop)
        return {
            "n": args.n,
            "docker": "not measured: no docker on this host; podman stands in",
            **{
                arm: {
                    "start": stats(t["start"]),
                    "stop": stats(t["stop"]),
                    "total": stats([a + b for a, b in zip(t["start"], t["stop"], strict=True)]),
                }
                for arm, t in times.items()
            },
        }
    finally:
        if pm is not None:
            pm.close()
        if built is not None and not args.keep_image:
            async with drums.AsyncClient(
                args.socket or None, state_dir=args.state_dir or None
            ) as c:
                for img in await c.images.list():
                    if built in img.names:
                        await c.images.remove(img.id or img.name)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", required=True, help="the FROM image, which both arms pull")
    p.add_argument("--insecure", action="store_true", help="--base's registry is plain HTTP")
    p.add_argument("-n", type=int, default=20, help="iterations of each arm")
    p.add_argument("--socket", default="", help="drumsd's socket")
    p.add_argument("--state-dir", default="", help="drumsd's state directory (for builds)")
    p.add_argument("--keep-image", action="store_true", help="leave drums' built image")
    p.add_argument("--json", action="store_true", help="print JSON only")
    args = p.parse_args()
    print(DOCKER_MISSING, file=sys.stderr)
    res = asyncio.run(bench(args))
    if args.json:
        print(json.dumps(res))
        return
    print(DOCKER_MISSING)
    print(f"Harbor trial environment, start and stop, n={args.n} each (ms)")
    print(f"{'arm':<8} {'start p50':>10} {'start p95':>10} {'stop p50':>9} {'stop p95':>9}"
          f" {'total p50':>10} {'total p95':>10}")  # fmt: skip
    for arm in ("drums", "podman"):
        r = res[arm]
        print(
            f"{arm:<8} {r['start']['p50_ms']:>10} {r['start']['p95_ms']:>10}"
            f" {r['stop']['p50_ms']:>9} {r['stop']['p95_ms']:>9}"
            f" {r['total']['p50_ms']:>10} {r['total']['p95_ms']:>10}"
        )


if __name__ == "__main__":
    main()
