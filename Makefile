# The two entry points a newcomer needs (see README.md). Both run set-up first;
# set-up is idempotent and caches CRIU, the build and the image.
.PHONY: setup demo test lint

setup:
	bash scripts/setup.sh

demo: setup
	target/release/drums demo

test: setup
	bash scripts/test.sh

lint:
	cargo clippy --workspace --all-targets -- -D warnings
	cargo fmt --all -- --check
