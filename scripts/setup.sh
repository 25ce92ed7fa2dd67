#!/usr/bin/env bash
# Host set-up for drums, idempotent: every step checks whether its result is
# already there and skips if so, so running it again costs seconds.
#
#   scripts/setup.sh demo     what `drums demo` needs: the packages drums builds
#                             and runs with, CRIU 4.2.1, the four binaries the
#                             demo runs (drums, drumsd, drums-init,
#                             drums-guest), the default image (`make demo`)
#   scripts/setup.sh cluster  that, the desktop image and the Ray venv: what
#                             `make cluster-demo` runs (python -m drums.ray.demo)
#   scripts/setup.sh [all]    that, and what the tests and benches need: their
#                             packages, venvs, CPython 3.13 + harbor, every
#                             binary, the desktop and agent images (`make test`)
#
# A newcomer's first command is `make demo`, so its part is kept lean (see
# docs/setup.md); the rest comes with `make test`, or an image with
# `scripts/setup.sh image desktop` when first wanted.
#
# It writes no registry host name anywhere: the Debian mirror is derived from the
# machine's own apt sources.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
state=${DRUMS_STATE_DIR:-/var/lib/drums}
cache=$state/cache
criu_version=4.2.1
level=${1:-all}
want_image=
want_cluster=
case "$level" in
  demo|all) ;;
  cluster)
    # What `make cluster-demo` runs: the demo's part, the desktop image and
    # the Ray venv.
    want_cluster=1; level=demo ;;
  image)
    # One image, with the demo's part of set-up (drumsd, debootstrap) first.
    case "${2:-}" in
      default|desktop|agent) want_image=$2; level=demo ;;
      *) echo "setup: usage: scripts/setup.sh image default|desktop|agent" >&2; exit 2 ;;
    esac ;;
  *) echo "setup: usage: scripts/setup.sh [demo|cluster|all|image default|desktop|agent]" >&2; exit 2 ;;
esac

log() { printf '\033[1msetup:\033[0m %s\n' "$*" >&2; }

if [ "$(id -u)" != 0 ]; then
  echo "setup: must run as root (drums creates namespaces, mounts and cgroups)" >&2
  exit 1
fi

# ---- the crates, downloaded while the packages install ----------------------
# cargo needs no system package to download the workspace's crates, so this
# runs beside apt and CRIU's build; the build below waits for it. Only the
# host's target: a plain `cargo fetch` also downloads every other
# platform's crates (windows-sys and the like), which no build here needs.
# A failed step ends set-up with these jobs still running: stop them with it.
trap 'jobs -p | xargs -r kill 2>/dev/null || true' EXIT
mkdir -p "$cache"
host_target=$(rustc -vV | sed -n 's/^host: //p')
(cd "$here" && cargo fetch -q --target "$host_target") >"$cache/cargo-fetch.log" 2>&1 &
fetch_pid=$!
wait_fetch() {
  wait "$fetch_pid" \
    || { cat "$cache/cargo-fetch.log" >&2; echo "setup: cargo fetch failed (log: $cache/cargo-fetch.log)" >&2; exit 1; }
}

# ---- Debian packages -------------------------------------------------------
# What drums builds and runs with (the demo's part):
# Runtime: btrfs-progs (mkfs of the store), debootstrap (images), nftables (CRIU's
# network lock), iproute2 (debugging only; drums itself speaks netlink).
# CRIU build deps: the list from shared/notes/criu-on-this-kernel.md.
# eBPF toolchain (used by the inspector): clang libelf-dev zlib1g-dev bpftool
# (libbpf-cargo runs clang alone; llvm's own tools are not needed).
# libseccomp-dev: the archive linked statically into drums-init (the seccomp filter).
packages=(
  btrfs-progs debootstrap nftables iproute2 procps python3 xz-utils ca-certificates
  build-essential pkgconf git
  libbsd-dev libcap-dev libgnutls28-dev libnet1-dev libnftables-dev libnl-3-dev
  libprotobuf-c-dev libprotobuf-dev protobuf-c-compiler protobuf-compiler uuid-dev
  python3-protobuf
  clang libelf-dev zlib1g-dev bpftool
  libseccomp-dev
)
# What only the tests and benches need:
# Desktop tests on the host (the screen and OSWorld crates drive a real X
# server): xvfb xdotool wmctrl x11-xserver-utils ffmpeg; python3-venv for the
# OSWorld client's virtualenv. fonts-dejavu-core: the font `drums eval` draws
# its figures' text with.
# OCI images: docker-registry (a real distribution v2 registry that the pull
# tests start on loopback) and skopeo (pushes test images to it and writes
# docker-save and oci-archive files); skopeo+umoci and podman are the
# comparison arms of `drums bench image`. runc: podman's default runtime,
# crun, refuses this host's hybrid cgroups, so the bench runs podman with
# `--runtime runc`.
# buildah: `drums build`'s builder (docs/build.md).
# busybox-static: the whole of the libc-less test images in
# crates/daemon/tests/foreign_libc.rs (a static /bin/busybox).
# CPython 3.13's build deps (Harbor's interpreter, below), for the modules it
# needs: ssl, ctypes, sqlite3, bz2, lzma, readline (with zlib1g-dev and
# uuid-dev above: zlib, uuid).
# The cluster demo's Ray venv needs python3-venv.
if [ -n "$want_cluster" ]; then
  packages+=(python3-venv)
fi
if [ "$level" = all ]; then
  packages+=(
    xvfb xdotool wmctrl x11-xserver-utils ffmpeg python3-venv
    fonts-dejavu-core
    docker-registry skopeo umoci podman runc buildah
    busybox-static
    libssl-dev libffi-dev libsqlite3-dev libbz2-dev liblzma-dev libreadline-dev libncurses-dev
  )
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# ---- the Debian mirror, from the machine's own apt sources -----------------
mirror_uri() {
  # deb822 sources first (Debian 12's default), then one-line sources.
  local u
  u=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  if [ -z "$u" ]; then
    u=$(grep -hE '^deb[[:space:]]' /etc/apt/sources.list 2>/dev/null | grep -v security | awk '{print $2; exit}' || true)
  fi
  [ -n "$u" ] || { echo "setup: no Debian mirror found in /etc/apt/sources.list*" >&2; exit 1; }
  echo "${u%/}"
}

# ---- a deb-src entry for sid, for the source packages built below -----------
# Source packages only (no binary from sid is ever installed). Called only
# when a source tarball below is missing; then apt's lists are refreshed so
# `apt-get source` sees sid.
sid_src() {
  local m
  m=$(mirror_uri)
  log "adding a deb-src entry for sid from $m (source packages only)"
  cat > /etc/apt/sources.list.d/drums-sid-src.sources <<SRC
Types: deb-src
URIs: $m
Suites: sid
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  apt-get update -qq
}

# ---- CRIU 4.2.1 from Debian's source package (sid) --------------------------
# Bookworm's 3.17 fails on kernel 6.18 (SO_PASSCRED on listening sockets), and
# sid's binary needs glibc 2.38, so build sid's orig tarball.
have_criu() { command -v criu >/dev/null 2>&1 && criu --version 2>/dev/null | grep -q "Version: $criu_version"; }
if ! have_criu; then
  mkdir -p "$cache/criu"
  tarball="$cache/criu/criu_${criu_version}.orig.tar.xz"
  if [ ! -s "$tarball" ]; then
    sid_src
    # The packaging tarball of this version is missing on the mirror, so apt-get
    # source exits non-zero after the orig tarball arrived; only that is needed.
    (cd "$cache/criu" && apt-get source --download-only -qq "criu=${criu_version}-*" >/dev/null 2>&1 || true)
    [ -s "$tarball" ] || (cd "$cache/criu" && apt-get source --download-only -qq criu >/dev/null 2>&1 || true)
    [ -s "$tarball" ] || { echo "setup: could not download $tarball from the sid source package" >&2; exit 1; }
  fi
  log "building CRIU $criu_version (about 30 s)"
  rm -rf "$cache/criu/build" && mkdir -p "$cache/criu/build"
  tar -C "$cache/criu/build" --strip-components=1 -xf "$tarball"
  make -C "$cache/criu/build" -j"$(nproc)" criu >"$cache/criu/build.log" 2>&1 \
    || { tail -30 "$cache/criu/build.log" >&2; echo "setup: CRIU build failed, log: $cache/criu/build.log" >&2; exit 1; }
  install -m 0755 "$cache/criu/build/criu/criu" /usr/local/sbin/criu
  # Keep rpc.proto next to the binary's cache: the CRIU driver generates its
  # message types from it at build time (never a committed copy).
  install -D -m 0644 "$cache/criu/build/images/rpc.proto" /usr/local/share/criu/rpc.proto
  hash -r
fi
have_criu || { echo "setup: criu --version does not report $criu_version" >&2; exit 1; }
log "$(criu --version | head -1)"

# ---- build drums -----------------------------------------------------------
# The demo runs four binaries; the tests run every one (the benches, the
# evaluation, drums-vmrun). One cargo run either way: its scheduler keeps
# both cores busy, and the default image's build (dpkg's work, not the
# mirror's: 41 s of its 45 with the packages already downloaded) would only
# compete with it for them (docs/setup.md).
wait_fetch
if [ "$level" = all ]; then
  log "building drums (release, every binary)"
  (cd "$here" && cargo build --release --workspace --bins -q)
else
  log "building drums (release: drums, drumsd, drums-init, drums-guest)"
  (cd "$here" && cargo build --release -q -p drums-cli -p drums-daemon -p drums-init -p drums-guest)
fi

# ---- the images ----------------------------------------------------------------
image() {
  log "building the $1 image ($2; cached after the first run)"
  "$here/target/release/drumsd" --state-dir "$state" image build "$1" --mirror "$(mirror_uri)"
}
if [ -n "$want_image" ]; then
  image "$want_image" debootstrap
  exit 0
fi
# ---- Ray, for drums.ray (scripts/python-test.sh) -------------------------------
# Ray from PyPI, pinned, in a venv of its own (its tree is large and must not
# leak into the SDK's gates), with the test tools at the SDK venv's pins.
# openai is the SDK the failover test's agent calls its model with.
# The tests start their own 3-node cluster on loopback (python/tests/ray);
# usage stats are off there (RAY_USAGE_STATS_ENABLED=0). Same marker scheme
# as the venvs above.
setup_ray_venv() {
ray_pins="ray==2.60.0 openai==3.57.0 httpx==0.28.1 pytest==9.2.0 pytest-timeout==2.4.0 anyio==4.16.0 mypy==2.4.1 ruff==0.17.5 pdoc==16.0.0 pyyaml==6.0.3 types-pyyaml==6.0.12.20261113"
ray_venv=$cache/ray
ray_marker="$ray_venv/.drums-ready-$(echo "$ray_pins" | tr ' =' '_-')"
if [ ! -e "$ray_marker" ]; then
  log "installing Ray into $ray_venv"
  rm -rf "$ray_venv"
  mkdir -p "$cache"
  /usr/bin/python3 -m venv "$ray_venv"
  # shellcheck disable=SC2086 # one word per requirement
  "$ray_venv/bin/python" -m pip install -q --disable-pip-version-check $ray_pins
  touch "$ray_marker"
fi
}

image default debootstrap
if [ -n "$want_cluster" ]; then
  image desktop "debootstrap + pip"
  setup_ray_venv
  log "ready for the cluster demo"
  exit 0
fi
if [ "$level" = demo ]; then
  log "ready for the demo (\`make test\` sets up the rest)"
  exit 0
fi

# ---- no system registry ---------------------------------------------------------
# Debian's docker-registry package enables a service on :5000. The tests start
# registries of their own on free loopback ports, and a system one would only
# hold a port and serve stale blobs: stop it and keep it off, under systemd or
# under the package's init script, and never fail where neither runs.
if [ -d /run/systemd/system ]; then
  if systemctl is-enabled --quiet docker-registry 2>/dev/null \
    || systemctl is-active --quiet docker-registry 2>/dev/null; then
    log "stopping and disabling the docker-registry system service (tests start their own)"
    systemctl disable --now docker-registry >/dev/null 2>&1 || true
  fi
elif [ -x /etc/init.d/docker-registry ]; then
  if /etc/init.d/docker-registry status >/dev/null 2>&1; then
    log "stopping the docker-registry init service (tests start their own)"
    /etc/init.d/docker-registry stop >/dev/null 2>&1 || true
  fi
  update-rc.d docker-registry disable >/dev/null 2>&1 || true
fi

# ---- schemathesis, for the API fuzz test ------------------------------------
# crates/daemon/tests/fuzz.rs runs it against a real drumsd. A virtualenv of its
# own, from PyPI through pip; the marker names the version, so a new pin
# replaces the old venv and an unchanged one costs nothing.
schemathesis_version=4.32.5
st_venv=$cache/schemathesis
if [ ! -e "$st_venv/.drums-ready-$schemathesis_version" ]; then
  log "installing schemathesis $schemathesis_version into $st_venv (the API fuzz test)"
  rm -rf "$st_venv"
  mkdir -p "$cache"
  /usr/bin/python3 -m venv "$st_venv"
  "$st_venv/bin/python" -m pip install -q --disable-pip-version-check \
    "schemathesis==$schemathesis_version"
  touch "$st_venv/.drums-ready-$schemathesis_version"
fi

# ---- the official LLM SDKs, for the coordinator's tests ----------------------
# crates/daemon/tests/coordinator.rs runs the openai and anthropic Python SDKs,
# unchanged, through drumsd's LLM proxy. Pinned like schemathesis.
llm_sdks="openai==3.57.0 anthropic==2.15.0"
sdk_venv=$cache/llm-sdks
sdk_marker="$sdk_venv/.drums-ready-$(echo "$llm_sdks" | tr ' =' '_-')"
if [ ! -e "$sdk_marker" ]; then
  log "installing $llm_sdks into $sdk_venv (the coordinator's tests)"
  rm -rf "$sdk_venv"
  mkdir -p "$cache"
  /usr/bin/python3 -m venv "$sdk_venv"
  # shellcheck disable=SC2086 # one word per requirement
  "$sdk_venv/bin/python" -m pip install -q --disable-pip-version-check $llm_sdks
  touch "$sdk_marker"
fi

# ---- the Python SDK's tools (python/, scripts/python-test.sh) ---------------
# Every dev tool pinned, in a venv of its own from PyPI through pip; the
# marker names the pins, so a new pin replaces the venv and an unchanged one
# costs nothing. hatchling is here because the wheel and sdist are built
# without build isolation (no download at test time); anyio's pytest plugin
# runs the async twin's tests; types-pyyaml lets mypy --strict read the
# spec tests.
py_sdk_pins="httpx==0.28.1 pytest==9.2.0 pytest-timeout==2.4.0 anyio==4.16.0 mypy==2.4.1 ruff==0.17.5 build==1.6.1 pdoc==16.0.0 pyyaml==6.0.3 types-pyyaml==6.0.12.20261113 hatchling==1.33.0"
py_sdk_venv=$cache/python-sdk
py_sdk_marker="$py_sdk_venv/.drums-ready-$(echo "$py_sdk_pins" | tr ' =' '_-')"
if [ ! -e "$py_sdk_marker" ]; then
  log "installing the Python SDK's tools into $py_sdk_venv"
  rm -rf "$py_sdk_venv"
  mkdir -p "$cache"
  /usr/bin/python3 -m venv "$py_sdk_venv"
  # shellcheck disable=SC2086 # one word per requirement
  "$py_sdk_venv/bin/python" -m pip install -q --disable-pip-version-check $py_sdk_pins
  touch "$py_sdk_marker"
fi

# ---- the agent harnesses, for drums.integrations (scripts/python-test.sh) ---
# mini-swe-agent and SWE-ReX from PyPI, pinned, in a venv of their own (their
# dependency trees are large and must not leak into the SDK's gates), with
# the tools their tests and mypy need. httpx is pinned to the SDK's release
# line (litellm accepts it; unpinned, pip would take a newer one the SDK is
# not tested with); litellm and pydantic are pinned because the tests drive
# them (a model through drums' LLM proxy, the environments' configs). Harbor
# is not here: every release of it needs Python >= 3.12, and Debian 12 has
# 3.11; it has a venv of its own on a CPython built below. Same marker scheme
# as the venvs above.
harness_pins="mini-swe-agent==2.4.6 swe-rex==1.4.0 litellm==1.110.2 pydantic==2.14.4 httpx==0.28.1 pytest==9.2.0 pytest-timeout==2.4.0 anyio==4.16.0 mypy==2.4.1 ruff==0.17.5 pdoc==16.0.0 types-pyyaml==6.0.12.20261113"
harness_venv=$cache/harnesses
harness_marker="$harness_venv/.drums-ready-$(echo "$harness_pins" | tr ' =' '_-')"
if [ ! -e "$harness_marker" ]; then
  log "installing the agent harnesses into $harness_venv"
  rm -rf "$harness_venv"
  mkdir -p "$cache"
  /usr/bin/python3 -m venv "$harness_venv"
  # shellcheck disable=SC2086 # one word per requirement
  "$harness_venv/bin/python" -m pip install -q --disable-pip-version-check $harness_pins
  touch "$harness_marker"
fi

setup_ray_venv

# ---- CPython 3.13 from Debian's source package (sid), for Harbor -------------
# Harbor (the Terminal-Bench 2 harness) needs Python >= 3.12 and Debian 12 has
# 3.11, so build the orig tarball (upstream's release tarball, checked by apt
# against sid's signed Sources) of sid's python3.13 into a prefix of drums'
# own cache: never /usr or /usr/local, and
# `make altinstall` writes bin/python3.13 only, no python3. sid lists more
# than one python3.13 and the mirror has the files of 3.13.15-1 only, so the
# version is pinned and its Debian revision looked up (apt-get source takes
# no wildcard). No PGO or LTO: about 3 minutes on 2 cores. The marker names
# the version, so an unchanged one costs nothing; the build tree goes after
# the check, the tarball and build.log stay.
py_version=3.13.15
py_prefix=$cache/python3.13
py_src=$cache/python3.13-src
py_marker="$py_prefix/.drums-ready-$py_version"
py_modules='import ssl, sqlite3, ctypes, zlib, bz2, lzma, uuid, readline, venv'
if [ ! -e "$py_marker" ]; then
  mkdir -p "$py_src"
  tarball="$py_src/python3.13_${py_version}.orig.tar.xz"
  if [ ! -s "$tarball" ]; then
    sid_src
    deb_version=$(apt-cache showsrc python3.13 2>/dev/null \
      | awk -v v="$py_version" '$1 == "Version:" && index($2, v "-") == 1 { print $2; exit }')
    [ -n "$deb_version" ] \
      || { echo "setup: sid has no python3.13 $py_version source package; update py_version" >&2; exit 1; }
    (cd "$py_src" && apt-get source --download-only -qq "python3.13=$deb_version" >/dev/null 2>&1 || true)
    [ -s "$tarball" ] \
      || { echo "setup: could not download $tarball from sid's python3.13 $deb_version" >&2; exit 1; }
  fi
  log "building CPython $py_version into $py_prefix (no PGO/LTO; about 3 minutes)"
  rm -rf "$py_src/build" "$py_prefix" && mkdir -p "$py_src/build"
  tar -C "$py_src/build" --strip-components=1 -xf "$tarball"
  (cd "$py_src/build" \
    && ./configure --prefix="$py_prefix" --with-ensurepip=no \
    && make -j"$(nproc)" \
    && make altinstall) >"$py_src/build.log" 2>&1 \
    || { tail -30 "$py_src/build.log" >&2; echo "setup: CPython build failed, log: $py_src/build.log" >&2; exit 1; }
  "$py_prefix/bin/python3.13" -c "$py_modules" \
    || { echo "setup: CPython $py_version lacks a module ($py_modules), log: $py_src/build.log" >&2; exit 1; }
  rm -rf "$py_src/build"
  touch "$py_marker"
fi

# ---- Harbor, for drums.integrations.harbor -----------------------------------
# harbor from PyPI, pinned, in a venv of its own made with the CPython above,
# with the test tools at the harness venv's pins and httpx on the SDK's line
# (harbor accepts it: pip puts harbor 0.26.0 beside httpx 0.28.1). The marker
# names the interpreter's version and the pins, so a new one of either
# replaces the venv and an unchanged one costs nothing.
harbor_pins="harbor==0.26.0 httpx==0.28.1 pytest==9.2.0 pytest-timeout==2.4.0 anyio==4.16.0 mypy==2.4.1 ruff==0.17.5"
harbor_venv=$cache/harbor
harbor_marker="$harbor_venv/.drums-ready-$(echo "python==$py_version $harbor_pins" | tr ' =' '_-')"
if [ ! -e "$harbor_marker" ]; then
  log "installing harbor into $harbor_venv (Python $py_version)"
  rm -rf "$harbor_venv"
  "$py_prefix/bin/python3.13" -m venv "$harbor_venv"
  # shellcheck disable=SC2086 # one word per requirement
  "$harbor_venv/bin/python" -m pip install -q --disable-pip-version-check $harbor_pins
  touch "$harbor_marker"
fi

# ---- vmrun ---------------------------------------------------------------------
# OSWorld's vmware provider runs `vmrun`; drums-vmrun answers as it.
ln -sf "$here/target/release/drums-vmrun" /usr/local/bin/vmrun

image desktop "debootstrap + pip"
image agent "debootstrap + the openai SDK"
log "ready"
