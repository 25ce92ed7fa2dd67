#!/usr/bin/env python3
"""What the SDK adds to one command: `commands.run("true")` three ways, in one run.

    python bench/overhead.py [-n 200] [--socket S] [--drums PATH] [--json]

Arms, interleaved round-robin (the order rotates every iteration, so no arm
always runs first or after a given other):

  sdk  drums.Client().sandbox's commands.run("true")
  raw  the same exec request (the SDK's body: /bin/sh -c true, 60 s timeout)
       by http.client over an AF_UNIX socket, one kept-alive connection, the
       NDJSON read to its exit frame
  cli  drums --socket S --no-autostart exec ID -- true (a process per call)

Prints p50 and p95 per arm and the SDK's p50 minus the raw p50 (the SDK's
target: at most 0.5 ms). Needs a running drumsd (DRUMS_SOCKET or --socket);
it creates one session and removes it.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import drums

TARGET_MS = 0.5


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("drumsd")
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(self._path)
        self.sock = s


def raw_arm(sock: str, session: str) -> Callable[[], None]:
    conn = UnixHTTPConnection(sock)
    body = json.dumps({"argv": ["/bin/sh", "-c", "true"], "timeout_ms": 60000}).encode()
    headers = {"content-type": "application/json"}
    path = f"/v1/sessions/{session}/exec"

    def run() -> None:
        conn.request("POST", path, body=body, headers=headers)
        r = conn.getresponse()
        data = r.read()
        last = json.loads(data.strip().rsplit(b"\n", 1)[-1])
        if r.status != 200 or last["exit"]["code"] != 0:
            raise RuntimeError(f"raw exec: {r.status} {data[:200]!r}")

    return run


def sdk_arm(sb: drums.Sandbox) -> Callable[[], None]:
    def run() -> None:
        if sb.commands.run("true").exit_code != 0:
            raise RuntimeError("sdk exec failed")

    return run


def cli_arm(drums_bin: str, sock: str, session: str) -> Callable[[], None]:
    argv = [drums_bin, "--socket", sock, "--no-autostart", "exec", session, "--", "true"]

    def run() -> None:
        subprocess.run(argv, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)

    return run


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=200, help="iterations per arm (default 200)")
    ap.add_argument("--socket", default=None, help="drumsd's socket (default: as the SDK finds it)")
    ap.add_argument(
        "--drums", default=None, help="the drums CLI (default: on PATH, or beside drumsd)"
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = ap.parse_args()

    client = drums.Client(args.socket, autostart=False)
    sock = str(client.socket)
    drums_bin = args.drums or shutil.which("drums")
    if drums_bin is None and os.environ.get("DRUMS_BIN_DIR"):
        drums_bin = str(Path(os.environ["DRUMS_BIN_DIR"]) / "drums")
    arms: dict[str, Callable[[], None]] = {}
    times: dict[str, list[float]] = {}
    with client, drums.Sandbox.create(client=client) as sb:
        arms["sdk"] = sdk_arm(sb)
        arms["raw"] = raw_arm(sock, sb.id)
        if drums_bin:
            arms["cli"] = cli_arm(drums_bin, sock, sb.id)
        names = list(arms)
        for name in names:  # warm: connections open, caches filled
            for _ in range(3):
                arms[name]()
        times = {name: [] for name in names}
        for i in range(args.n):
            k = i % len(names)
            for name in names[k:] + names[:k]:
                t = time.perf_counter()
                arms[name]()
                times[name].append((time.perf_counter() - t) * 1000)

    result: dict[str, object] = {
        "n": args.n,
        "arms": {
            name: {
                "p50_ms": round(statistics.median(ts), 3),
                "p95_ms": round(pct(ts, 95), 3),
            }
            for name, ts in times.items()
        },
    }
    delta = statistics.median(times["sdk"]) - statistics.median(times["raw"])
    result["sdk_minus_raw_p50_ms"] = round(delta, 3)
    result["target_ms"] = TARGET_MS
    result["target_met"] = delta <= TARGET_MS
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"commands.run('true'), n={args.n} per arm, interleaved")
    print(f"{'arm':<5} {'p50 ms':>8} {'p95 ms':>8}")
    arm_stats = result["arms"]
    assert isinstance(arm_stats, dict)
    for name, st in arm_stats.items():
        print(f"{name:<5} {st['p50_ms']:>8.3f} {st['p95_ms']:>8.3f}")
    verdict = "met" if delta <= TARGET_MS else "MISSED"
    print(f"sdk - raw p50: {delta:+.3f} ms (target <= {TARGET_MS} ms: {verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
