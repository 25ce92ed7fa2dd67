"""drums on a Ray cluster, shown on this one host.

    python -m drums.ray.demo [--nodes 3] [--json]

Starts a Ray cluster of N nodes here, each with its own drumsd (as root;
`drums.ray.local`), with every node trusting the others' keys. Then:

1. places 2 sessions per node and says where each went;
2. forks a desktop checkpoint (Chromium) onto every node, and again (the
   second fork moves nothing: each node has it in its cache);
3. runs a coordinated agent (its model calls through its node's LLM proxy,
   to a scripted model this demo serves on loopback; its commands through
   the cluster handle) in a session replicated to a second node, kills the
   session's node (`kill -9` of its raylet, its drumsd and its sessions'
   processes) while a command runs, and shows the agent finishing on the
   other node, with the same outputs as the steps it ran before.

It prints what happened (with `--json`: one object with the node ids,
placements, fork and transfer times, and the recovery's time and outcome),
and removes everything it made, also when it fails: the cluster's stop
proves that nothing is left on the host.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

import drums
import drums.ray
from drums.ray.local import LocalCluster, stdout_to_stderr

STEPS = [
    "echo one >> /root/log && wc -l < /root/log",
    "mkdir -p /root/w && echo two > /root/w/a && ls /root/w",
    "sleep 2 && echo three >> /root/log && cat /root/log",
    "cat /root/w/a && wc -l < /root/log",
    "echo done",
]
KILL_AT_STEP = 2


class ScriptedModel:
    """An OpenAI-style chat completions upstream on loopback that answers
    step k of a conversation (k = the assistant messages in it) with
    `STEPS[k]`, as text: the model the demo's agent talks to."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def do_POST(self) -> None:
                n = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                step = sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")
                answer = {
                    "id": f"demo-{step}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": body.get("model", "demo"),
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": STEPS[min(step, 4)]},
                            "finish_reason": "stop",
                        }
                    ],
                }
                b = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(b)))
                self.end_headers()
                self.wfile.write(b)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)


def agent(sb: drums.ray.ClusterSandbox, on_step: Any = None) -> list[dict[str, Any]]:
    """Ask the model, run what it says, tell it the output; the base URL is
    asked again when a call breaks (the session may have moved)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "do the task"}]
    out = []
    for step in range(len(STEPS)):
        while True:
            try:
                r = httpx.post(
                    f"{sb.llm_base_url()}/chat/completions",
                    json={"model": "demo", "messages": messages},
                    timeout=120,
                )
                r.raise_for_status()
                break
            except httpx.TransportError:
                time.sleep(0.2)
        command = r.json()["choices"][0]["message"]["content"]
        if on_step is not None:
            on_step(step)
        t0 = time.monotonic()
        res = sb.commands.run(command)
        out.append(
            {
                "step": step,
                "command": command,
                "stdout": res.stdout,
                "node": sb.node.id,
                "seconds": round(time.monotonic() - t0, 3),
            }
        )
        messages += [
            {"role": "assistant", "content": command},
            {"role": "user", "content": res.stdout},
        ]
    return out


def say(quiet: bool, *a: Any) -> None:
    if not quiet:
        print(*a, flush=True)


def run(nodes: int, quiet: bool) -> dict[str, Any]:
    names = tuple("abcdefgh"[:nodes])
    model = ScriptedModel()
    lc = LocalCluster(
        names, k0=(os.getpid() % 200) + 20, object_store_bytes=600 << 20, llm_upstream=model.url
    )
    result: dict[str, Any] = {"nodes": nodes}
    made: list[drums.ray.ClusterSandbox] = []
    try:
        say(quiet, f"starting {nodes} Ray nodes, each with its own drumsd ...")
        lc.start()
        for x in names:
            for y in names:
                if x != y:
                    lc.trust(x, y)
        ids = {n: lc.nodes[n].node_id for n in names}
        short = {v: k for k, v in ids.items()}
        result["node_ids"] = ids
        c = drums.ray.Cluster()

        # 1. placement
        sessions = [c.create() for _ in range(2 * nodes)]
        made += sessions
        result["placements"] = [{"session": s.name, "node": short[s.node.id]} for s in sessions]
        per = {n: sum(1 for p in result["placements"] if p["node"] == n) for n in names}
        say(quiet, f"1. placed {len(sessions)} sessions by each node's room: {per}")
        for s in sessions:
            s.kill()
        made.clear()

        # 2. a desktop checkpoint forked onto every node, twice
        desk = c.create(node=ids["a"], profile="desktop", memory="1G", pids=512, screen="800x600")
        made.append(desk)
        ck = desk.checkpoint(clean=True)
        desk.kill()
        made.clear()
        forks = []
        for round_ in (1, 2):
            t0 = time.monotonic()
            transfers = c.send_many(ck, list(ids.values()))
            t1 = time.monotonic()
            sibs = [s for t in transfers for s in t.checkpoint.restore(1)]
            t2 = time.monotonic()
            made += sibs
            forks.append(
                {
                    "round": round_,
                    "moved_bytes": {short[t.checkpoint.node.id]: t.moved_bytes for t in transfers},
                    "transfer_s": round(t1 - t0, 3),
                    "restore_s": round(t2 - t1, 3),
                    "siblings": {short[s.node.id]: s.info.hostname for s in sibs},
                }
            )
            png = {short[s.node.id]: len(s.screenshot()) for s in sibs}
            forks[-1]["screenshot_bytes"] = png
            say(
                quiet,
                f"2.{round_} forked a desktop onto every node: transfer {t1 - t0:.2f} s "
                f"({sum(t.moved_bytes for t in transfers) >> 20} MiB moved), restore "
                f"{t2 - t1:.2f} s; hostnames {forks[-1]['siblings']}",
            )
            for s in sibs:
                s.kill()
            made.clear()
        result["forks"] = forks
        for name in names:
            with drums.Client(lc.nodes[name].daemon.socket, autostart=False) as cl:
                for k in cl.checkpoints.list():
                    k.remove()

        # 3. a replicated agent whose node is killed mid-run
        victim, replica = names[-1], names[-2]
        sb = c.create(node=ids[victim], replicate=True, replica=ids[replica], name="agent")
        made.append(sb)
        killed: list[float] = []

        def kill_soon(step: int) -> None:
            if step == KILL_AT_STEP:

                def kill() -> None:
                    killed.append(time.time())
                    lc.kill_node(victim)

                threading.Timer(0.5, kill).start()

        say(
            quiet,
            f"3. an agent in a session on node {victim}, replicated to {replica}; "
            f"node {victim} is killed during step {KILL_AT_STEP}",
        )
        steps = agent(sb, kill_soon)
        for st in steps:
            st["node"] = short[st["node"]]
            say(
                quiet,
                f"   step {st['step']} on node {st['node']}: {st['command']!r} -> "
                f"{st['stdout'].strip()!r} ({st['seconds']} s)",
            )
        (f,) = [x for x in c.failovers() if x.name == "agent"]
        result["agent"] = {
            "steps": steps,
            "killed_node": victim,
            "ended_on": short[sb.node.id],
            "recovery": {
                "noticed_s": round(f.noticed_at - killed[0], 3),
                "resumed_s": round(f.resumed_at - killed[0], 3),
                "replayed_operations": f.replayed,
                "version": f.version,
                "error": f.error,
            },
        }
        say(
            quiet,
            f"   node {victim} killed: the guard noticed {f.noticed_at - killed[0]:.2f} s later, "
            f"and the session ran again on node {short[sb.node.id]} "
            f"{f.resumed_at - killed[0]:.2f} s after the kill",
        )
        sb.kill()
        made.clear()
        result["outcome"] = (
            "finished on another node" if short[sb.node.id] != victim else "did not move"
        )
    finally:
        for left in made:
            with contextlib.suppress(drums.DrumsError):
                left.kill()
        try:
            lc.stop()
            result["cleaned_up"] = True
        finally:
            model.stop()
    say(quiet, "everything removed: Ray stopped, every drumsd stopped, nothing left on the host")
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m drums.ray.demo", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--nodes", type=int, default=3, help="Ray nodes to start (2 to 8)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    if not 2 <= args.nodes <= 8:
        ap.error("--nodes takes 2 to 8")
    if os.geteuid() != 0:
        print("drums.ray.demo: needs root (each node runs a drumsd)", file=sys.stderr)
        return 2
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if not args.json:
        result = run(args.nodes, quiet=False)
    else:
        with stdout_to_stderr():
            result = run(args.nodes, quiet=True)
        print(json.dumps(result, indent=2))
    return 0 if result.get("outcome") == "finished on another node" else 1


if __name__ == "__main__":
    sys.exit(main())
