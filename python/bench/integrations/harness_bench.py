#!/usr/bin/env python3
"""What drums costs and saves a harness, measured in one run.

    python bench/integrations/harness_bench.py [-n 200] [--rounds 5] [--socket S] [--json]

1. **A mini-swe-agent step's `execute`**: `DrumsEnvironment.execute` against
   mini-swe-agent's own `LocalEnvironment.execute` (a subprocess on this
   host), both running `echo hi`, interleaved (the arm that goes first
   alternates every iteration): p50 and p95, and drums' p50 over local's.
2. **Best-of-8 from one warm task environment**: time until 8 environments
   are ready to try a candidate each, `fork(8)` of a warm sandbox (the
   repository set up, its tests run once) against 8 cold starts of the same
   image (`Sandbox.create`, 8 at once) that then run the same set-up;
   interleaved rounds (the arm that goes first alternates): p50 and p95.

Needs mini-swe-agent 2.x and a running drumsd (DRUMS_SOCKET or --socket);
it removes every session it made.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")

from minisweagent.environments.local import LocalEnvironment

import drums
from drums.integrations.minisweagent import DrumsEnvironment

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples/integrations"))
from task_repo import SETUP, TEST

N_SIBLINGS = 8


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def stats(xs: list[float]) -> dict[str, float]:
    return {"p50_ms": round(statistics.median(xs), 3), "p95_ms": round(pct(xs, 95), 3)}


def interleave(arms: dict[str, Callable[[], float]], n: int) -> dict[str, list[float]]:
    """Each arm `n` times, the order rotating every iteration; an arm returns
    the milliseconds it measured."""
    names = list(arms)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(n):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            times[name].append(arms[name]())
    return times


def step_arms(
    env: DrumsEnvironment, env_sh: DrumsEnvironment, local: LocalEnvironment
) -> dict[str, Callable[[], float]]:
    def timed(e: DrumsEnvironment | LocalEnvironment) -> Callable[[], float]:
        def run() -> float:
            t = time.perf_counter()
            out = e.execute({"command": "echo hi"})
            ms = (time.perf_counter() - t) * 1000
            if out["output"] != "hi\n" or out["returncode"] != 0:
                raise RuntimeError(f"execute: {out}")
            return ms

        return run

    return {"drums": timed(env), "drums_sh": timed(env_sh), "local": timed(local)}


def best_of_arms(client: drums.Client, warm: drums.Sandbox) -> dict[str, Callable[[], float]]:
    image = warm.info.image

    def kill_all(sbs: list[drums.Sandbox]) -> None:
        with ThreadPoolExecutor(len(sbs) or 1) as pool:
            list(pool.map(lambda s: s.kill(), sbs))

    def fork() -> float:
        t = time.perf_counter()
        sibs = warm.fork(N_SIBLINGS)
        ms = (time.perf_counter() - t) * 1000
        kill_all(sibs)
        return ms

    def cold_one() -> drums.Sandbox:
        sb = drums.Sandbox.create(image=image, client=client)
        try:
            sb.commands.run(SETUP, check=True)
            sb.commands.run(TEST, timeout=120)  # fails: the task's starting state
        except BaseException:
            sb.kill()
            raise
        return sb

    def cold() -> float:
        t = time.perf_counter()
        with ThreadPoolExecutor(N_SIBLINGS) as pool:
            futures = [pool.submit(cold_one) for _ in range(N_SIBLINGS)]
            made, errors = [], []
            for f in futures:
                try:
                    made.append(f.result())
                except Exception as e:
                    errors.append(e)
        ms = (time.perf_counter() - t) * 1000
        kill_all(made)
        if errors:
            raise errors[0]
        return ms

    return {"fork": fork, "cold": cold}


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("-n", type=int, default=200, help="execute calls per arm (default 200)")
    ap.add_argument("--rounds", type=int, default=5, help="best-of-8 rounds per arm (default 5)")
    ap.add_argument("--socket", default=None, help="drumsd's socket (default: as the SDK finds it)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    args = ap.parse_args()

    client = drums.Client(args.socket, autostart=False)
    with client, DrumsEnvironment(socket=str(client.socket)) as env:
        local = LocalEnvironment()
        # The same session, with LocalEnvironment's interpreter (/bin/sh -c)
        # instead of the default (bash -lc, as mini-swe-agent's Docker one).
        env_sh = DrumsEnvironment(sandbox=env.sandbox, interpreter=["/bin/sh", "-c"])
        env_sh._finalizer.detach()  # the session is env's to remove
        arms = step_arms(env, env_sh, local)
        for arm in arms.values():  # warm: connections open, caches filled
            for _ in range(3):
                arm()
        steps = interleave(arms, args.n)

        env.sandbox.commands.run(SETUP, check=True)
        env.sandbox.commands.run(TEST, timeout=120)
        best_of = interleave(best_of_arms(client, env.sandbox), args.rounds)

    ex = {k: stats(v) for k, v in steps.items()}
    bo = {k: stats(v) for k, v in best_of.items()}
    ratios = {
        "execute_drums_over_local_p50": round(ex["drums"]["p50_ms"] / ex["local"]["p50_ms"], 2),
        "execute_drums_sh_over_local_p50": round(
            ex["drums_sh"]["p50_ms"] / ex["local"]["p50_ms"], 2
        ),
        "best_of_8_cold_over_fork_p50": round(bo["cold"]["p50_ms"] / bo["fork"]["p50_ms"], 2),
    }
    if args.json:
        print(
            json.dumps(
                {"n": args.n, "rounds": args.rounds, "execute": ex, "best_of_8": bo, **ratios}
            )
        )
        return 0
    print(f"mini-swe-agent execute('echo hi'), {args.n} calls per arm, interleaved")
    print(f"{'environment':<34}{'p50':>10}{'p95':>10}")
    for name, label in (
        ("drums", "DrumsEnvironment (bash -lc)"),
        ("drums_sh", "DrumsEnvironment (/bin/sh -c)"),
        ("local", "LocalEnvironment (host, sh -c)"),
    ):
        print(f"{label:<34}{ex[name]['p50_ms']:>8.2f}ms{ex[name]['p95_ms']:>8.2f}ms")
    print(
        f"drums / local at p50: {ratios['execute_drums_over_local_p50']}x (bash -lc), "
        f"{ratios['execute_drums_sh_over_local_p50']}x (/bin/sh -c)\n"
    )
    print(f"best-of-8: time to 8 ready environments, {args.rounds} rounds per arm, interleaved")
    print(f"{'arm':<34}{'p50':>10}{'p95':>10}")
    for name, label in (
        ("fork", "fork(8) of the warm environment"),
        ("cold", "8 x Sandbox.create + set-up"),
    ):
        print(f"{label:<34}{bo[name]['p50_ms']:>8.0f}ms{bo[name]['p95_ms']:>8.0f}ms")
    print(f"cold / fork at p50: {ratios['best_of_8_cold_over_fork_p50']}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
