#!/usr/bin/env bash
# Every `drums bench` once, with -n 1 and its smallest options, against a
# drumsd of its own (its own state directory, bridge, subnet, cgroup parent
# and ports), so that a bench that no longer runs, or that leaves a session,
# a checkpoint, an image or a host resource behind, fails CI instead of
# breaking silently. The numbers are not looked at: one round measures
# nothing.
#
# scripts/test.sh runs it after `cargo test`: the benches drop the page
# cache and take the machine's cores, which the tests' daemons must not
# share. Needs root and what scripts/setup.sh makes (CRIU, the images,
# podman, skopeo, umoci, docker-registry).
#
#   scripts/bench-smoke.sh [BENCH...]   # default: all of them, in order
set -euo pipefail
cd "$(dirname "$0")/.."

bin="${CARGO_TARGET_DIR:-$PWD/target}/release"
images="${DRUMS_IMAGES_DIR:-/var/lib/drums/images}"
bridge=drbench0
cgroup_parent=drums-bench-ci
subnet=10.215.0.0/24

log() { echo "bench-smoke: $*" >&2; }
die() { log "FAILED: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (namespaces, mounts, cgroups)"
for b in drums drums-bench drumsd drums-init drums-guest; do
  [ -x "$bin/$b" ] || die "$bin/$b missing: cargo build --release --workspace --bins"
done
for i in default desktop; do
  [ -f "$images/$i/image.json" ] || die "no $i image in $images: run scripts/setup.sh"
done
if [ -e "/sys/class/net/$bridge" ]; then
  die "$bridge exists: another bench-smoke runs, or one left it (ip link del $bridge)"
fi

# Two free loopback ports, for drumsd's LLM proxy and the proxy bench's mock
# upstream (the defaults, 7080 and 7090, may be a user's drumsd's).
read -r proxy_port mock_port < <(/usr/bin/python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*(x.getsockname()[1] for x in s))')

state=$(mktemp -d -t drums-bench-smoke.XXXXXX)
drums() { "$bin/drums" --state-dir "$state" --no-autostart "$@"; }

# The daemon's pid is read from its lock file when it is stopped: the engine
# bench kills drumsd and starts it again (as /proc says it was started), so
# the one running at the end need not be the one started here.
stop_drumsd() {
  local pid
  pid=$(cat "$state/drumsd.lock" 2>/dev/null || true)
  [ -n "$pid" ] && [ -d "/proc/$pid" ] || return 0
  log "stopping drumsd (pid $pid)"
  kill -TERM "$pid"
  for _ in $(seq 1200); do
    [ -d "/proc/$pid" ] || return 0
    sleep 0.1
  done
  log "drumsd (pid $pid) did not stop within 120 s of SIGTERM: killed"
  kill -KILL "$pid" 2>/dev/null || true
  return 1
}

# What a drumsd of these names could leave on the host after it stopped.
host_leftovers() {
  grep -F "$state" /proc/self/mountinfo | sed 's/^/mount: /' || true
  if [ -e "/sys/class/net/$bridge" ]; then echo "link: $bridge"; fi
  local l h c f
  for l in /sys/class/net/drums*; do
    if [ "$(basename "$(readlink -f "$l/master" 2>/dev/null)")" = "$bridge" ]; then
      echo "link: $(basename "$l")"
    fi
  done
  for h in /sys/fs/cgroup /sys/fs/cgroup/*; do
    for c in "$h/$cgroup_parent" "$h"/drums-bench-freeze-*; do
      if [ -d "$c" ]; then echo "cgroup: $c"; fi
    done
  done
  for f in /sys/block/loop*/loop/backing_file; do
    if [ -f "$f" ] && grep -qF "$state" "$f"; then echo "loop device: $f"; fi
  done
  nft list tables 2>/dev/null | grep -F "$bridge" | sed 's/^/nft: /' || true
}

finish() {
  local rc=$?
  trap - EXIT
  stop_drumsd || rc=1
  local left
  left=$(host_leftovers)
  if [ -n "$left" ]; then
    log "FAILED: left on the host after drumsd stopped:"
    echo "$left" >&2
    rc=1
  else
    # And the binaries drumsd installs beside its state directory.
    rm -rf "$state" "$state-bin"
  fi
  [ "$rc" = 0 ] || log "drumsd's log: $state/drumsd.log (kept)"
  exit "$rc"
}
trap finish EXIT
trap 'exit 130' INT TERM

log "drumsd on $state (bridge $bridge, subnet $subnet, proxy 127.0.0.1:$proxy_port)"
# In a session of its own and not this shell's child, as `drums` starts one:
# whoever stops it (here, or the engine bench's kill -9) need not reap it.
setsid -f "$bin/drumsd" --state-dir "$state" --images-dir "$images" \
  --bridge "$bridge" --subnet "$subnet" --cgroup-parent "$cgroup_parent" \
  --store-gib 16 \
  --llm-upstream "openai=http://127.0.0.1:$mock_port" \
  --llm-proxy-local "127.0.0.1:$proxy_port" \
  </dev/null >>"$state/drumsd.log" 2>&1
for _ in $(seq 600); do
  drums ps >/dev/null 2>&1 && break
  pid=$(cat "$state/drumsd.lock" 2>/dev/null || true)
  if [ -n "$pid" ] && [ ! -d "/proc/$pid" ]; then
    die "drumsd exited at its start: $(tail -5 "$state/drumsd.log")"
  fi
  sleep 0.1
done
drums ps >/dev/null || die "drumsd did not answer within 60 s"

# What drums still holds after a bench: sessions, checkpoints, OCI images,
# warm pools.
drums_leftovers() {
  local json
  if ! json=$(drums ps --json && drums checkpoints --json && drums images --json && drums pool ls --json); then
    echo "drumsd does not answer"
    return
  fi
  /usr/bin/python3 -c '
import json, sys
dec, text, out = json.JSONDecoder(), sys.stdin.read(), []
i = 0
while i < len(text):
    if text[i].isspace():
        i += 1
        continue
    doc, i = dec.raw_decode(text, i)
    for s in doc.get("sessions", []):
        out.append("session %s (%s)" % (s["id"], s["name"]))
    for p in doc.get("pools", []):
        out.append("pool %s (%s)" % (p["id"], p["name"]))
    for k in doc.get("checkpoints", []):
        out.append("checkpoint %s" % k["id"])
    for m in doc.get("images", []):
        if m.get("kind") == "oci":
            out.append("image %s %s" % (m["id"], " ".join(m.get("names", []))))
print("\n".join(out))' <<<"$json"
}

podman_count() { podman ps -aq | wc -l; podman images -q | wc -l; }
podman_before=$(podman_count | tr '\n' ' ')

declare -A argv=(
  [start]="bench start -n 1"
  [restore]="bench restore -n 1"
  [restore-desktop]="bench restore --profile desktop -n 1"
  [inspect]="bench inspect -n 1"
  [confinement]="bench confinement -n 1"
  [freeze]="bench freeze -n 1"
  [engine]="bench engine -n 1"
  [proxy]="bench proxy -n 1 --turns 1 --proxy 127.0.0.1:$proxy_port --mock-port $mock_port"
  [image]="bench image -n 1 --base $images/default/rootfs"
  [corpus]="bench corpus -n 1"
  [pool]="bench pool -n 1 --segments 1 --segment-secs 3"
)
order=(start restore restore-desktop inspect confinement freeze engine proxy image corpus pool)
if [ $# -gt 0 ]; then order=("$@"); fi

summary=()
failed=0
for b in "${order[@]}"; do
  [ -n "${argv[$b]:-}" ] || die "no bench $b (known: ${!argv[*]})"
  log "drums ${argv[$b]}"
  t0=$(date +%s%N)
  # shellcheck disable=SC2086 # the arguments are words
  if drums ${argv[$b]}; then rc=0; else rc=$?; fi
  secs=$(awk -v a="$t0" -v b="$(date +%s%N)" 'BEGIN { printf "%.1f", (b - a) / 1e9 }')
  left=$(drums_leftovers)
  if [ "$b" = image ] && [ "$(podman_count | tr '\n' ' ')" != "$podman_before" ]; then
    left+=$'\n'"podman containers and images: $podman_before before, $(podman_count | tr '\n' ' ')after"
  fi
  left=$(echo "$left" | sed '/^$/d')
  verdict=ok
  if [ "$rc" != 0 ]; then verdict="exit $rc"; failed=1; fi
  if [ -n "$left" ]; then
    verdict="$verdict, left behind:"$'\n'"$left"
    failed=1
  fi
  summary+=("$(printf '%-16s %7s s  %s' "$b" "$secs" "$verdict")")
  log "$b: $verdict ($secs s)"
done

log "summary:"
printf '  %s\n' "${summary[@]}" >&2
[ "$failed" = 0 ] || die "a bench failed or left something behind (see above)"
