#!/usr/bin/env bash
# The test suite: unit tests everywhere, the root integration tests that
# start real drumsd daemons, the Python SDK's gates and tests against real
# daemons (scripts/python-test.sh), then every bench once
# (scripts/bench-smoke.sh).
# Run through `make test`, which runs set-up first.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "test: the integration tests need root (namespaces, mounts, cgroups); CI runs as root" >&2
  exit 1
fi
# The integration tests run the workspace's binaries (drums, drums-init,
# drums-guest) from the same target directory as the test's drumsd.
cargo build --release --workspace --bins -q
# Two at a time: each integration test runs its own daemon, and this machine
# has two cores.
cargo test --release --workspace -- --test-threads=2
# The Python SDK (python/): unasync --check, ruff, mypy --strict, its wheel
# and sdist, pytest against its own drumsd, the API reference (about a
# minute).
bash scripts/python-test.sh
# Every bench once, with -n 1, against a drumsd of its own: a bench that no
# longer runs, or leaves a session, checkpoint, image or host resource
# behind, fails here (about 5 minutes on this 2-core machine; the per-bench
# times are in its summary). After the tests, not beside them: the benches
# drop the page cache and load both cores.
bash scripts/bench-smoke.sh
