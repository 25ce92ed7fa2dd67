#!/usr/bin/env python3
"""drums.ray on a real Ray cluster of 3 nodes on this host, each with its own
drumsd (tests/ray/cluster.py), in one run:

    python bench/cluster.py [-n 5] [--profile desktop|headless]
        [--reset-seconds 20] [--replicated 16] [--desktop-replicated 2]
        [--turns 5] [--recovering 8] [--json]

fork     a checkpoint forked into 4 siblings, interleaved round by round:
         same  restored on its own node (node a)
         cross sent to node b (its cached copy removed before each round, so
               every round moves the whole archive: export on a, the object
               store, import on b), then restored there; transfer, restore
               and total apart
         hit   sent to b again (the cache: nothing moves), then restored
resets   resets per hour with warm pools: workers take a sibling, run one
         command in it and remove it, for --reset-seconds, alternately
         against a cluster pool on all 3 nodes and a pool on node a alone
         (the same members per node, the same number of workers)

replication  --replicated headless sessions (and --desktop-replicated
         desktop ones) on node a, each running --turns agent turns at once
         through node a's LLM proxy (to a scripted model on loopback), with
         replicate=True (replicas on b) and without, interleaved: the delay
         each turn's answer was held after the model's (release_ms), the
         hold for the replica, and the bytes each replicated version moved
recovery --recovering replicated sessions on node c, one turn each; node c
         is killed (raylet, drumsd, sessions' processes); the time from the
         kill to every session answering on node b (the last arm)

Prints p50 and p95 of every arm and the ratios; with --json, one object.
Everything it makes is removed at the end, also when it fails, and the
cluster's stop proves that nothing is left on the host. The 3 nodes share
this machine's 2 cores: the resets compare the cluster layer's cost at equal
hardware, not the gain of 3 machines.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


import httpx
import ray
from tests.daemon import pick_k
from tests.ray.cluster import RayCluster

import drums
import drums.ray
from drums.ray.demo import ScriptedModel
from drums.ray.local import stdout_to_stderr

SIBLINGS = 4
FORK_ARMS = (
    "same_restore",
    "cross_export",
    "cross_import",
    "cross_transfer",
    "cross_restore",
    "cross_total",
    "hit_transfer",
    "hit_restore",
    "hit_total",
)


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def summary(xs: list[float]) -> dict[str, float]:
    return {"p50": statistics.median(xs), "p95": pct(xs, 95), "n": len(xs)}


def remove_checkpoints(rc: RayCluster) -> None:
    """Every checkpoint on every node (the arms' own and the copies)."""
    for node in rc.nodes.values():
        with drums.Client(node.daemon.socket, autostart=False) as cl:
            for k in cl.checkpoints.list():
                k.remove()


def fork_arms(c: drums.ray.Cluster, rc: RayCluster, profile: str, n: int) -> dict[str, Any]:
    a, b = rc.nodes["a"].node_id, rc.nodes["b"].node_id
    kw: dict[str, Any] = {"profile": profile}
    if profile == "desktop":
        kw.update(memory="1G", pids=512, screen="800x600")
    sb = c.create(node=a, **kw)
    try:
        ck = sb.checkpoint(clean=profile == "desktop")
    finally:
        sb.kill()
    out: dict[str, list[float]] = {k: [] for k in FORK_ARMS}
    archive_bytes = 0
    try:
        for i in range(n):
            order = ["same", "cross", "hit"] if i % 2 == 0 else ["cross", "hit", "same"]
            for arm in order:
                if arm == "same":
                    t0 = time.monotonic()
                    sibs = ck.restore(SIBLINGS)
                    out["same_restore"].append(time.monotonic() - t0)
                elif arm == "cross":
                    # Every round a whole transfer: b's cached copy goes first.
                    with drums.Client(rc.nodes["b"].daemon.socket, autostart=False) as cb:
                        for k in cb.checkpoints.list():
                            if k.name.startswith(drums.ray._node.CACHE_PREFIX):
                                k.remove()
                    t0 = time.monotonic()
                    t = c.send(ck, to=b)
                    t1 = time.monotonic()
                    assert t.moved_bytes > 0
                    archive_bytes = t.moved_bytes
                    sibs = t.checkpoint.restore(SIBLINGS)
                    t2 = time.monotonic()
                    out["cross_export"].append(t.export_seconds)
                    out["cross_import"].append(t.import_seconds)
                    out["cross_transfer"].append(t1 - t0)
                    out["cross_restore"].append(t2 - t1)
                    out["cross_total"].append(t2 - t0)
                else:
                    t0 = time.monotonic()
                    t = c.send(ck, to=b)
                    t1 = time.monotonic()
                    assert t.cached, "the second send moved bytes"
                    sibs = t.checkpoint.restore(SIBLINGS)
                    t2 = time.monotonic()
                    out["hit_transfer"].append(t1 - t0)
                    out["hit_restore"].append(t2 - t1)
                    out["hit_total"].append(t2 - t0)
                for s in sibs:
                    s.kill()
    finally:
        remove_checkpoints(rc)
    res: dict[str, Any] = {k: summary(v) for k, v in out.items()}
    res["archive_bytes"] = archive_bytes
    same = res["same_restore"]["p50"]
    res["ratio_cross_total_vs_same_p50"] = res["cross_total"]["p50"] / same
    res["ratio_hit_total_vs_same_p50"] = res["hit_total"]["p50"] / same
    return res


def resets(pool: drums.ray.ClusterPool, seconds: float, workers: int) -> dict[str, Any]:
    """Workers take, use and remove members for `seconds`; resets per hour."""
    done: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def work() -> None:
        while time.monotonic() < stop:
            t0 = time.monotonic()
            try:
                with pool.take(timeout=60) as sb:
                    sb.commands.run("true")
            except drums.DrumsError as e:
                with lock:
                    errors.append(str(e))
                return
            with lock:
                done.append(time.monotonic() - t0)

    t0 = time.monotonic()
    threads = [threading.Thread(target=work) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    if errors:
        raise RuntimeError(f"resets failed: {errors[0]}")
    return {
        "resets": len(done),
        "seconds": elapsed,
        "per_hour": len(done) / elapsed * 3600,
        "take_use_remove": summary(done) if done else None,
    }


def reset_arms(
    c: drums.ray.Cluster, rc: RayCluster, profile: str, n: int, seconds: float
) -> dict[str, Any]:
    a = rc.nodes["a"].node_id
    kw: dict[str, Any] = {"profile": profile}
    if profile == "desktop":
        kw.update(memory="1G", pids=512, screen="800x600")
    sb = c.create(node=a, **kw)
    try:
        ck = sb.checkpoint(clean=profile == "desktop")
    finally:
        sb.kill()
    size, workers = 2, 4
    runs: dict[str, list[dict[str, Any]]] = {"cluster": [], "one_node": []}
    try:
        for i in range(n):
            for arm in ["cluster", "one_node"] if i % 2 == 0 else ["one_node", "cluster"]:
                nodes = None if arm == "cluster" else [a]
                with c.pool(ck, size=size, nodes=nodes) as pool:
                    # Full before the clock starts.
                    deadline = time.monotonic() + 120
                    while any(p.ready < size for p in pool.info().values()):
                        if time.monotonic() > deadline:
                            raise RuntimeError(f"the pools did not fill: {pool.info()}")
                        time.sleep(0.1)
                    runs[arm].append(resets(pool, seconds, workers))
    finally:
        remove_checkpoints(rc)
    res: dict[str, Any] = {"pool_size_per_node": size, "workers": workers}
    for arm, rs in runs.items():
        res[arm] = {
            "per_hour_p50": statistics.median(r["per_hour"] for r in rs),
            "runs": rs,
        }
    res["ratio_cluster_vs_one_node"] = (
        res["cluster"]["per_hour_p50"] / res["one_node"]["per_hour_p50"]
    )
    return res


def agent_turns(sb: drums.ray.ClusterSandbox, turns: int, label: str) -> None:
    """`turns` model calls through the session's node's LLM proxy, each
    followed by a command that changes a file: every turn takes a version."""
    url = sb.llm_base_url()
    messages: list[dict[str, Any]] = [{"role": "user", "content": label}]
    with httpx.Client(timeout=300) as http:
        for i in range(turns):
            r = http.post(f"{url}/chat/completions", json={"model": "bench", "messages": messages})
            r.raise_for_status()
            sb.commands.run(f"echo {label}-{i} >> /root/turns")
            messages += [
                {"role": "assistant", "content": "next"},
                {"role": "user", "content": str(i)},
            ]


def replication_arms(
    c: drums.ray.Cluster, rc: RayCluster, profile: str, sessions: int, turns: int, n: int
) -> dict[str, Any]:
    """Sessions on node a running agent turns at once, replicated to b or
    not, interleaved: what each turn's answer was held (the delay the agent
    saw after the model's), and the bytes each replicated version moved."""
    a, b = rc.nodes["a"].node_id, rc.nodes["b"].node_id
    kw: dict[str, Any] = {"profile": profile}
    if profile == "desktop":
        kw.update(memory="1G", pids=512, screen="800x600")
    release: dict[str, list[float]] = {"off": [], "on": []}
    replica: list[float] = []
    copied: list[int] = []
    for i in range(n):
        for arm in ["off", "on"] if i % 2 == 0 else ["on", "off"]:
            made = [
                c.create(node=a, replicate=arm == "on", replica=b if arm == "on" else None, **kw)
                for _ in range(sessions)
            ]
            try:
                threads = [
                    threading.Thread(target=agent_turns, args=(sb, turns, f"{arm}{i}"))
                    for sb in made
                ]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                for sb in made:
                    for rec in sb.turns():
                        # The first request ends no turn (it takes the base
                        # version): the turns proper are the rest.
                        if rec.turn is None:
                            continue
                        release[arm].append(rec.release_ms)
                        if arm == "on":
                            replica.append(rec.replica_ms)
            finally:
                for sb in made:
                    sb.kill()
    node_a = c.node(a)
    copied = [size for _, size, _ in ray.get(node_a.actor.replicated.remote())]
    remove_checkpoints(rc)
    off, on = summary(release["off"]), summary(release["on"])
    return {
        "profile": profile,
        "sessions": sessions,
        "turns_per_session": turns,
        "exposed_ms_off": off,
        "exposed_ms_on": on,
        "replica_hold_ms": summary(replica),
        "exposed_added_p50_ms": on["p50"] - off["p50"],
        "exposed_added_p95_ms": on["p95"] - off["p95"],
        "bytes_per_version": summary([float(x) for x in copied]),
        "versions_copied": len(copied),
    }


def recovery_arm(c: drums.ray.Cluster, rc: RayCluster, sessions: int) -> dict[str, Any]:
    """Replicated sessions on node c (replicas on b), one turn each; node c is
    killed; the time from the kill to each session answering on b. Leaves
    node c dead: the last arm."""
    b, n_c = rc.nodes["b"].node_id, rc.nodes["c"].node_id
    made = [c.create(node=n_c, replicate=True, replica=b) for _ in range(sessions)]
    try:
        for sb in made:
            agent_turns(sb, 1, "before")
        answered: dict[str, float] = {}
        killed = time.time()
        rc.kill_node("c")

        def answer(sb: drums.ray.ClusterSandbox) -> None:
            sb.commands.run("cat /root/turns")
            answered[sb.name] = time.time() - killed

        threads = [threading.Thread(target=answer, args=(sb,)) for sb in made]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if len(answered) != sessions or any(sb.node.id != b for sb in made):
            raise RuntimeError(f"not every session moved: {answered}")
        fo = [f for f in c.failovers() if f.lost_node == n_c]
        return {
            "sessions": sessions,
            "all_answering_s": max(answered.values()),
            "answering_s": summary(list(answered.values())),
            "noticed_s": summary([f.noticed_at - killed for f in fo]),
            "resumed_s": summary([f.resumed_at - killed for f in fo]),
            "errors": [f.error for f in fo if f.error],
        }
    finally:
        for sb in made:
            with contextlib.suppress(drums.DrumsError):
                sb.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=5, help="rounds of each arm")
    ap.add_argument("--profile", choices=("desktop", "headless"), default="desktop")
    ap.add_argument("--reset-seconds", type=float, default=20.0)
    ap.add_argument("--reset-profile", choices=("desktop", "headless"), default="headless")
    ap.add_argument("--replicated", type=int, default=16, help="sessions in the replication arm")
    ap.add_argument("--desktop-replicated", type=int, default=2)
    ap.add_argument("--turns", type=int, default=5, help="turns per session there")
    ap.add_argument("--recovering", type=int, default=8, help="sessions on the node killed")
    ap.add_argument(
        "--arms",
        default="fork,resets,replication,recovery",
        help="which arms, comma-separated (recovery kills a node: it runs last)",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    if args.json:
        with stdout_to_stderr():
            result = measure(args)
        print(json.dumps(result, indent=2))
        return 0
    result = measure(args)
    report(args, result)
    return 0


def measure(args: argparse.Namespace) -> dict[str, Any]:
    model = ScriptedModel()
    rc = RayCluster(k0=pick_k(31), object_store_bytes=600 << 20, llm_upstream=model.url)
    try:
        rc.start()
    except BaseException:
        model.stop()
        raise
    result: dict[str, Any] = {"nodes": 3, "siblings": SIBLINGS}
    try:
        for x in rc.nodes:
            for y in rc.nodes:
                if x != y:
                    rc.trust(x, y)
        c = drums.ray.Cluster()
        result["node_ids"] = {name: n.node_id for name, n in rc.nodes.items()}
        arms = set(args.arms.split(","))
        if "fork" in arms:
            result["fork"] = fork_arms(c, rc, args.profile, args.n)
            result["fork"]["profile"] = args.profile
        if "resets" in arms:
            result["resets"] = reset_arms(c, rc, args.reset_profile, args.n, args.reset_seconds)
            result["resets"]["profile"] = args.reset_profile
        if "replication" in arms:
            result["replication"] = [
                replication_arms(c, rc, "headless", args.replicated, args.turns, args.n),
                replication_arms(
                    c, rc, "desktop", args.desktop_replicated, args.turns, max(1, args.n // 2)
                ),
            ]
        if "recovery" in arms:
            result["recovery"] = recovery_arm(c, rc, args.recovering)
    finally:
        try:
            rc.stop()
        finally:
            model.stop()
    return result


def report(args: argparse.Namespace, result: dict[str, Any]) -> None:
    if "fork" in result:
        report_fork(args, result)
    for rep in result.get("replication", []):
        print(
            f"replication, {rep['sessions']} {rep['profile']} sessions x {rep['turns_per_session']}"
            f" turns: exposed delay per turn p50/p95 off {rep['exposed_ms_off']['p50']:.1f}/"
            f"{rep['exposed_ms_off']['p95']:.1f} ms, on {rep['exposed_ms_on']['p50']:.1f}/"
            f"{rep['exposed_ms_on']['p95']:.1f} ms; {rep['bytes_per_version']['p50'] / 1e6:.2f} MB"
            " per version"
        )
    if "recovery" in result:
        rec = result["recovery"]
        print(
            f"node lost with {rec['sessions']} replicated sessions: all answering on another "
            f"node {rec['all_answering_s']:.2f} s after the kill "
            f"(noticed p50 {rec['noticed_s']['p50']:.2f} s)"
        )


def report_fork(args: argparse.Namespace, result: dict[str, Any]) -> None:
    f = result["fork"]
    print(
        f"fork of a {args.profile} checkpoint ({f['archive_bytes'] >> 20} MiB archive) "
        f"into {SIBLINGS} siblings, {args.n} interleaved rounds (seconds):"
    )
    print(f"  {'arm':<16} {'p50':>8} {'p95':>8}")
    for k in FORK_ARMS:
        print(f"  {k:<16} {f[k]['p50']:>8.3f} {f[k]['p95']:>8.3f}")
    print(
        f"  cross total / same: {f['ratio_cross_total_vs_same_p50']:.2f}x; "
        f"cache hit total / same: {f['ratio_hit_total_vs_same_p50']:.2f}x"
    )
    if "resets" not in result:
        return
    r = result["resets"]
    print(
        f"resets per hour ({args.reset_profile}, pools of {r['pool_size_per_node']} per node, "
        f"{r['workers']} workers, {args.reset_seconds:.0f} s a run):"
    )
    print(
        f"  3 nodes: {r['cluster']['per_hour_p50']:.0f}; one node: "
        f"{r['one_node']['per_hour_p50']:.0f}; ratio {r['ratio_cluster_vs_one_node']:.2f}"
    )


if __name__ == "__main__":
    sys.exit(main())
