# The two entry points a newcomer needs (see README.md). Both run set-up first;
# set-up is idempotent and caches CRIU, the build and the images. `make demo`
# sets up only what the demo runs (docs/setup.md); `make test` the rest too.
.PHONY: setup setup-demo demo cluster-demo test lint

setup:
	bash scripts/setup.sh all

setup-demo:
	bash scripts/setup.sh demo

demo: setup-demo
	target/release/drums demo

# drums on a Ray cluster of 3 nodes on this host, a drumsd each (docs/cluster.md).
cluster-demo:
	bash scripts/setup.sh cluster
	PYTHONPATH=$(CURDIR)/python/src DRUMS_BIN_DIR=$(CURDIR)/target/release \
	  $${DRUMS_STATE_DIR:-/var/lib/drums}/cache/ray/bin/python -m drums.ray.demo --nodes 3

test: setup
	bash scripts/test.sh

lint:
	cargo clippy --workspace --all-targets -- -D warnings
	cargo fmt --all -- --check
