#!/usr/bin/env bash
# A flame graph of drumsd at the coordinator's turn boundary: a drumsd of
# its own (state directory, bridge, subnet, cgroup parent, proxy port), then
# `drums bench proxy`, and `perf record` of drumsd for SECS seconds while the
# bench sends model calls from a session one after the other (each a turn
# boundary whose turn changed nothing). Folded stacks (OUT.folded) and the
# graph by inferno. PART `rps` profiles the requests-per-second part
# instead: 16 sessions at once, each request a turn boundary (the part is
# made to last SECS + 4 s).
#
#   scripts/profile-proxy.sh OUT.svg [SECS] [session|rps]
#
# Needs root, perf (Debian's linux-perf) and inferno (`cargo install
# inferno`), and a release build with debug info (the workspace's release
# profile keeps it). Leaves nothing: drumsd is stopped, its state removed.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/profile-proxy.sh OUT.svg [SECS]}
secs=${2:-6}
part=${3:-session}
case $part in
  session) marker="added latency: session"; title="session part, one request after another"; rounds=20000 ;;
  rps) marker="requests per second: proxy"; title="16 sessions at once"; rounds=200; export DRUMS_BENCH_RPS_SECS=$((secs + 4)) ;;
  *) echo "profile-proxy: PART is session or rps" >&2; exit 2 ;;
esac
command -v perf >/dev/null || { echo "profile-proxy: no perf (apt-get install linux-perf)" >&2; exit 1; }
command -v inferno-flamegraph >/dev/null || { echo "profile-proxy: no inferno (cargo install inferno)" >&2; exit 1; }

work=$(mktemp -d /var/tmp/drums-profile.XXXXXX)
chmod 0755 "$work"
read -r proxy mock < <(/usr/bin/python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*(x.getsockname()[1] for x in s))')
bridge=drprof$$
bridge=${bridge:0:15}
pid=
finish() {
  [ -z "$pid" ] || { kill -TERM "$pid" 2>/dev/null || true; while [ -d "/proc/$pid" ]; do sleep 0.1; done; }
  rm -rf "$work"
}
trap finish EXIT

target/release/drumsd --state-dir "$work/state" --images-dir "${DRUMS_IMAGES_DIR:-/var/lib/drums/images}" \
  --bridge "$bridge" --subnet 10.218.77.0/24 --cgroup-parent "drums-profile-$$" --store-gib 8 \
  --llm-upstream "openai=http://127.0.0.1:$mock" --llm-proxy-local "127.0.0.1:$proxy" \
  </dev/null >"$work/drumsd.log" 2>&1 &
pid=$!
for _ in $(seq 600); do [ -S "$work/state/drumsd.sock" ] && break; sleep 0.1; done

: >"$work/bench.err"
target/release/drums --state-dir "$work/state" --no-autostart bench proxy -n "$rounds" --turns 1 \
  --proxy "127.0.0.1:$proxy" --mock-port "$mock" >"$work/bench.out" 2>"$work/bench.err" &
bench=$!
until tr '\r' '\n' <"$work/bench.err" | grep -q "$marker"; do
  kill -0 "$bench" 2>/dev/null || { echo "profile-proxy: the bench ended early:" >&2; cat "$work/bench.err" >&2; exit 1; }
  sleep 0.2
done
sleep 1
# drumsd's CPU time over the window (clock ticks, /proc/PID/stat fields
# 14 and 15), to set against the requests it answered.
ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
t0=$(ticks)
perf record -q -F 999 --call-graph dwarf,16384 -p "$pid" -o "$work/perf.data" -- sleep "$secs" 2>/dev/null
t1=$(ticks)
echo "profile-proxy: drumsd used $(( (t1 - t0) * 1000 / $(getconf CLK_TCK) )) ms of CPU in ${secs} s (perf's own cost included)" >&2
# TERM, not INT: bash starts a background job of a script with SIGINT
# ignored.
kill -TERM "$bench" 2>/dev/null || true
wait "$bench" 2>/dev/null || true
perf script -i "$work/perf.data" 2>/dev/null | inferno-collapse-perf >"${out%.svg}.folded"
inferno-flamegraph --title "drumsd at the turn boundary (drums bench proxy, ${title}, ${secs} s)" \
  <"${out%.svg}.folded" >"$out"
echo "profile-proxy: wrote $out and ${out%.svg}.folded" >&2
