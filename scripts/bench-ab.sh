#!/usr/bin/env bash
# Two builds of drums measured in one run: each arm gets a drumsd of its own
# (state directory, bridge, subnet, cgroup parent, proxy ports), and every
# round runs each bench once on arm A, then on arm B (B first on odd rounds),
# so the machine's drift lands on both. At the end, per bench and per JSON
# number, the median over rounds of each arm and B/A.
#
#   scripts/bench-ab.sh A_BIN_DIR B_BIN_DIR [ROUNDS] [BENCH...]
#
# A_BIN_DIR and B_BIN_DIR hold drums, drumsd, drums-init and drums-guest (and
# drums-bench where the CLI execs it) of the two builds; default benches:
# start restore restore-desktop engine proxy, 3 rounds. Needs root and
# what scripts/setup.sh makes. Prints the table to stdout; the raw JSON is
# removed with the work directory unless BENCH_AB_KEEP=1 (a failure keeps
# it, with the daemons' logs).
set -euo pipefail
cd "$(dirname "$0")/.."

[ $# -ge 2 ] || { echo "usage: scripts/bench-ab.sh A_BIN_DIR B_BIN_DIR [ROUNDS] [BENCH...]" >&2; exit 2; }
bins=("$(cd "$1" && pwd)" "$(cd "$2" && pwd)")
rounds=${3:-3}
shift 2; [ $# -gt 0 ] && shift
order=("$@")
[ ${#order[@]} -gt 0 ] || order=(start restore restore-desktop engine proxy)
images="${DRUMS_IMAGES_DIR:-/var/lib/drums/images}"

log() { echo "bench-ab: $*" >&2; }
die() { log "FAILED: $*"; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (namespaces, mounts, cgroups)"

work=$(mktemp -d -t drums-bench-ab.XXXXXX)
# Each drumsd installs the binaries sessions run beside its state directory
# (STATE-bin), which the sessions' id ranges must reach: mktemp's 0700
# would keep them out.
chmod 0755 "$work"
declare -a state bridge cgp proxy mock
for a in 0 1; do
  state[a]=$work/arm$a
  bridge[a]=drab$a
  cgp[a]=drums-bench-ab$a
  mkdir -p "${state[a]}"
  [ ! -e "/sys/class/net/${bridge[a]}" ] || die "${bridge[a]} exists: another bench-ab runs, or one left it"
done
read -r proxy[0] mock[0] proxy[1] mock[1] < <(/usr/bin/python3 -c '
import socket
s = [socket.socket() for _ in range(4)]
for x in s: x.bind(("127.0.0.1", 0))
print(*(x.getsockname()[1] for x in s))')

drums() { local a=$1; shift; "${bins[a]}/drums" --state-dir "${state[a]}" --no-autostart "$@"; }

start_drumsd() {
  local a=$1
  setsid -f "${bins[a]}/drumsd" --state-dir "${state[a]}" --images-dir "$images" \
    --bridge "${bridge[a]}" --subnet "10.217.$a.0/24" --cgroup-parent "${cgp[a]}" \
    --store-gib 16 \
    --llm-upstream "openai=http://127.0.0.1:${mock[a]}" \
    --llm-proxy-local "127.0.0.1:${proxy[a]}" \
    </dev/null >>"${state[a]}/drumsd.log" 2>&1
  for _ in $(seq 600); do
    drums "$a" ps >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  die "arm $a: drumsd did not answer within 60 s: $(tail -5 "${state[a]}/drumsd.log")"
}

# The pid from the lock file: the engine bench restarts drumsd.
stop_drumsd() {
  local a=$1 pid
  pid=$(cat "${state[a]}/drumsd.lock" 2>/dev/null || true)
  [ -n "$pid" ] && [ -d "/proc/$pid" ] || return 0
  kill -TERM "$pid"
  for _ in $(seq 1200); do
    [ -d "/proc/$pid" ] || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  return 1
}

leftovers() {
  local a l h
  for a in 0 1; do
    grep -F "${state[a]}" /proc/self/mountinfo | sed 's/^/mount: /' || true
    [ ! -e "/sys/class/net/${bridge[a]}" ] || echo "link: ${bridge[a]}"
    for h in /sys/fs/cgroup /sys/fs/cgroup/*; do
      [ ! -d "$h/${cgp[a]}" ] || echo "cgroup: $h/${cgp[a]}"
    done
    for l in /sys/block/loop*/loop/backing_file; do
      if [ -f "$l" ] && grep -qF "${state[a]}" "$l"; then echo "loop device: $l"; fi
    done
    nft list tables 2>/dev/null | grep -F "${bridge[a]}" | sed 's/^/nft: /' || true
  done
}

finish() {
  local rc=$? left
  trap - EXIT
  stop_drumsd 0 || rc=1
  stop_drumsd 1 || rc=1
  left=$(leftovers)
  if [ -n "$left" ]; then
    log "FAILED: left on the host:"; echo "$left" >&2; rc=1
  fi
  rm -rf "${state[0]}-bin" "${state[1]}-bin"
  if [ "$rc" != 0 ] || [ "${BENCH_AB_KEEP:-0}" = 1 ]; then
    log "kept: $work"
  else
    rm -rf "$work"
  fi
  exit "$rc"
}
trap finish EXIT
trap 'exit 130' INT TERM

argv() {
  local a=$1 b=$2
  case "$b" in
    start) echo "bench start -n 10" ;;
    restore) echo "bench restore -n 5" ;;
    restore-desktop) echo "bench restore --profile desktop -n 3" ;;
    engine) echo "bench engine -n 2" ;;
    proxy) echo "bench proxy -n 50 --turns 2 --proxy 127.0.0.1:${proxy[a]} --mock-port ${mock[a]}" ;;
    *) die "no bench $b" ;;
  esac
}

start_drumsd 0
start_drumsd 1
log "arms: A=${bins[0]} B=${bins[1]}; $rounds rounds of: ${order[*]}; work dir $work"
for r in $(seq 1 "$rounds"); do
  for b in "${order[@]}"; do
    arms=(0 1); [ $((r % 2)) = 0 ] || arms=(1 0)
    for a in "${arms[@]}"; do
      log "round $r, arm $([ "$a" = 0 ] && echo A || echo B): drums $(argv "$a" "$b")"
      # shellcheck disable=SC2046 # the arguments are words
      drums "$a" $(argv "$a" "$b") --json >"$work/$b.arm$a.round$r.json" 2>>"$work/$b.arm$a.log" \
        || die "arm $a, $b, round $r failed: $(tail -5 "$work/$b.arm$a.log")"
    done
  done
done

/usr/bin/python3 - "$work" "$rounds" "${order[@]}" <<'PY'
import json, statistics, sys
work, rounds, benches = sys.argv[1], int(sys.argv[2]), sys.argv[3:]

def leaves(doc, prefix=""):
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from leaves(v, f"{prefix}.{k}" if prefix else k)
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from leaves(v, f"{prefix}[{i}]")
    elif isinstance(doc, (int, float)) and not isinstance(doc, bool):
        yield prefix, float(doc)

def load(path):
    # A bench may print more than one JSON document; take them all.
    text, dec, i, out = open(path).read(), json.JSONDecoder(), 0, {}
    while i < len(text):
        if text[i].isspace():
            i += 1
            continue
        doc, i = dec.raw_decode(text, i)
        out.update(dict(leaves(doc)))
    return out

print("| bench | measure | A (median of rounds) | B | B/A |")
print("|---|---|---:|---:|---:|")
for b in benches:
    arms = [[load(f"{work}/{b}.arm{a}.round{r}.json") for r in range(1, rounds + 1)] for a in (0, 1)]
    keys = [k for k in arms[0][0] if all(k in x for arm in arms for x in arm)]
    for k in keys:
        # Timings and sizes only: counts and settings are the same in both arms.
        if "[" in k or not any(t in k for t in ("p50", "p95", "ms", "mib", "bytes", "per_s", "rps")):
            continue
        a = statistics.median(x[k] for x in arms[0])
        bb = statistics.median(x[k] for x in arms[1])
        ratio = f"{bb / a:.2f}" if a else "-"
        print(f"| {b} | {k} | {a:.4g} | {bb:.4g} | {ratio} |")
PY
