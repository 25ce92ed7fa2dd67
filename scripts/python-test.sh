#!/usr/bin/env bash
# The Python SDK's gates (python/), in the venv scripts/setup.sh makes:
#   the sync twin matches its async source (scripts/unasync.py --check),
#   ruff check and ruff format --check, mypy --strict,
#   the wheel and the sdist (python -m build, no isolation: no download),
#   pytest against real drumsd daemons (DRUMS_REQUIRE_ROOT_TESTS=1: a test
#   that cannot run fails, never skips), with the package installed from the
#   wheel just built, not from the source tree,
#   the API reference from the docstrings (pdoc) into target/python-docs;
# then drums.integrations in the harness venv (mini-swe-agent, SWE-ReX):
#   mypy --strict with the harnesses installed, and pytest tests/integrations
#   against a real drumsd with its LLM proxy on, from the same wheel;
# then drums.integrations.harbor in the harbor venv (Harbor 0.26, CPython
#   3.13): mypy --strict, and pytest tests/integrations/test_harbor.py
#   (`harbor run` against a real drumsd and a loopback registry);
# then drums.ray in the Ray venv (Ray 2.60): mypy --strict, and pytest
#   tests/ray against a real 3-node Ray cluster on loopback with a drumsd
#   per node, and its API reference into target/python-docs/ray.
# Run from anywhere, as root, after setup.sh and a release build. Arguments
# go to pytest (e.g. -k files); a run narrowed so skips the check that every
# operation of the spec was sent to the daemon.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
state=${DRUMS_STATE_DIR:-/var/lib/drums}
venv=${DRUMS_PYTHON_VENV:-$state/cache/python-sdk}
py=$venv/bin/python
[ -x "$py" ] || { echo "python-test: no venv at $venv: run scripts/setup.sh" >&2; exit 1; }
hvenv=${DRUMS_HARNESS_VENV:-$state/cache/harnesses}
hpy=$hvenv/bin/python
[ -x "$hpy" ] || { echo "python-test: no harness venv at $hvenv: run scripts/setup.sh" >&2; exit 1; }
bvenv=${DRUMS_HARBOR_VENV:-$state/cache/harbor}
bpy=$bvenv/bin/python
[ -x "$bpy" ] || { echo "python-test: no harbor venv at $bvenv: run scripts/setup.sh" >&2; exit 1; }
rvenv=${DRUMS_RAY_VENV:-$state/cache/ray}
rpy=$rvenv/bin/python
[ -x "$rpy" ] || { echo "python-test: no Ray venv at $rvenv: run scripts/setup.sh" >&2; exit 1; }
# What needs a harness installed is checked in the harness venv, below;
# Harbor (Python >= 3.12) in its own venv.
integrations=(src/drums/integrations tests/integrations examples/integrations bench/integrations)
harbor=(src/drums/integrations/harbor.py tests/integrations/test_harbor.py
  examples/integrations/harbor_job.py bench/integrations/harbor_bench.py)
# drums.ray needs Ray: checked and tested in the Ray venv.
ray=(src/drums/ray tests/ray bench/cluster.py)

step() { printf '\033[1mpython-test:\033[0m %s\n' "$*" >&2; }
cd "$repo/python"

step "unasync --check"
"$py" scripts/unasync.py --check

step "ruff"
"$venv/bin/ruff" check --no-cache src tests scripts bench examples
"$venv/bin/ruff" format --no-cache --check src tests scripts bench examples

step "mypy --strict"
"$venv/bin/mypy" --strict --exclude "^($(echo "${integrations[*]} ${ray[*]}" | tr ' ' '|'))(/|$)" src tests bench examples

step "build (wheel and sdist)"
dist=$repo/target/python-dist
rm -rf "$dist"
"$py" -m build --no-isolation --outdir "$dist" . >/dev/null
ls "$dist"/drums-*.whl "$dist"/drums-*.tar.gz >/dev/null

# The tests import the package as a user would have it: the wheel, installed
# (not editable) into a directory of its own; httpx and the test tools come
# from the venv.
site=$(mktemp -d /tmp/drums-py-site.XXXXXX)
trap 'rm -rf "$site"' EXIT
"$py" -m pip install -q --disable-pip-version-check --no-deps --no-index \
  --target "$site" "$dist"/drums-*.whl
export PYTHONPATH=$site

step "pytest (real drumsd daemons)"
DRUMS_REQUIRE_ROOT_TESTS=1 DRUMS_BIN_DIR=${DRUMS_BIN_DIR:-$repo/target/release} \
  "$py" -c 'import drums, sys; assert drums.__file__.startswith(sys.argv[1]), drums.__file__' "$site"
rc=0
DRUMS_REQUIRE_ROOT_TESTS=1 DRUMS_BIN_DIR=${DRUMS_BIN_DIR:-$repo/target/release} \
  "$py" -m pytest -p no:cacheprovider --ignore=tests/integrations --ignore=tests/ray tests "$@" || rc=$?
if [ "$rc" != 0 ] && ! { [ "$rc" = 5 ] && [ $# -gt 0 ]; }; then exit "$rc"; fi

step "pdoc (API reference into target/python-docs)"
rm -rf "$repo/target/python-docs"
# Warnings are errors: a docstring pdoc cannot read fails the step. The
# integrations need their harnesses: documented from the harness venv below.
"$py" -W error -m pdoc --docformat google -o "$repo/target/python-docs" drums '!drums\.integrations.*' '!drums\.ray.*'

step "harness venv: mypy --strict (drums.integrations with mini-swe-agent and SWE-ReX)"
"$hvenv/bin/mypy" --strict --exclude "^($(IFS='|'; echo "${harbor[*]}"))$" "${integrations[@]}"

step "harness venv: pytest tests/integrations (real drumsd, its LLM proxy, a mock upstream)"
"$hpy" -c 'import drums, sys; assert drums.__file__.startswith(sys.argv[1]), drums.__file__' "$site"
# A run narrowed by arguments (-k files) may select none of these: that is
# no failure (pytest's exit 5), a run without arguments must run them all.
rc=0
DRUMS_REQUIRE_ROOT_TESTS=1 DRUMS_BIN_DIR=${DRUMS_BIN_DIR:-$repo/target/release} \
  "$hpy" -m pytest -p no:cacheprovider --ignore=tests/integrations/test_harbor.py \
  tests/integrations "$@" || rc=$?
if [ "$rc" != 0 ] && ! { [ "$rc" = 5 ] && [ $# -gt 0 ]; }; then exit "$rc"; fi

step "harbor venv: mypy --strict (drums.integrations.harbor with Harbor)"
"$bvenv/bin/mypy" --strict "${harbor[@]}"

step "harbor venv: pytest tests/integrations/test_harbor.py (harbor run, real drumsd, a loopback registry)"
"$bpy" -c 'import drums, sys; assert drums.__file__.startswith(sys.argv[1]), drums.__file__' "$site"
rc=0
DRUMS_REQUIRE_ROOT_TESTS=1 DRUMS_BIN_DIR=${DRUMS_BIN_DIR:-$repo/target/release} \
  "$bpy" -m pytest -p no:cacheprovider tests/integrations/test_harbor.py "$@" || rc=$?
if [ "$rc" != 0 ] && ! { [ "$rc" = 5 ] && [ $# -gt 0 ]; }; then exit "$rc"; fi

step "Ray venv: mypy --strict (drums.ray and its tests, with Ray)"
"$rvenv/bin/mypy" --strict "${ray[@]}"

step "Ray venv: pytest tests/ray (a real 3-node Ray cluster on loopback, a drumsd per node)"
"$rpy" -c 'import drums, sys; assert drums.__file__.startswith(sys.argv[1]), drums.__file__' "$site"
rc=0
RAY_USAGE_STATS_ENABLED=0 DRUMS_REQUIRE_ROOT_TESTS=1 DRUMS_BIN_DIR=${DRUMS_BIN_DIR:-$repo/target/release} \
  "$rpy" -m pytest -p no:cacheprovider tests/ray "$@" || rc=$?
if [ "$rc" != 0 ] && ! { [ "$rc" = 5 ] && [ $# -gt 0 ]; }; then exit "$rc"; fi

step "harness venv: pdoc (the whole package, integrations too, into target/python-docs)"
rm -rf "$repo/target/python-docs"
# drums.integrations.harbor needs Harbor, which the harness venv has not
# (and the harbor venv has no pdoc): left out, its one warning allowed; its
# reference is its docstrings.
"$hpy" -W error -W "ignore:Couldn't import drums.integrations.harbor" -m pdoc \
  --docformat google -o "$repo/target/python-docs" drums drums.integrations \
  '!drums\.integrations\.harbor' '!drums\.ray.*'

step "Ray venv: pdoc (drums.ray, into target/python-docs/ray)"
rm -rf "$repo/target/python-docs/ray"
"$rpy" -W error -m pdoc --docformat google -o "$repo/target/python-docs/ray" drums.ray

step "all gates passed"
