# The two entry points a newcomer needs (see README.md). Both run set-up first;
# set-up is idempotent and caches CRIU, the build and the images. `make demo`
# sets up only what the demo runs (docs/setup.md); `make test` the rest too.
.PHONY: setup setup-demo demo test lint

setup:
	bash scripts/setup.sh all

setup-demo:
	bash scripts/setup.sh demo

demo: setup-demo
	target/release/drums demo

test: setup
	bash scripts/test.sh

lint:
	cargo clippy --workspace --all-targets -- -D warnings
	cargo fmt --all -- --check
