#!/usr/bin/env bash
# The counts issue 27 ("the house") is measured by, from the tree as it is:
# each is a git grep or wc anyone can rerun, so a before and an after are
# this script on two commits. Prints one `name value` line per count.
#
#   scripts/house-metrics.sh            the working tree
#   scripts/house-metrics.sh REV        a commit (read through `git show`)
set -euo pipefail
cd "$(dirname "$0")/.."

rev=${1:-}
if [ -n "$rev" ]; then
  # Measure a commit in a throwaway worktree so the greps see its files.
  tmp=$(mktemp -d)
  trap 'git worktree remove --force "$tmp" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
  git worktree add -q --detach "$tmp" "$rev"
  cd "$tmp"
fi

# Rust sources outside tests/ directories, and their text up to a file's
# `#[cfg(test)]` module (drums keeps unit tests at a file's end).
src() { git ls-files -- 'crates/*.rs' | grep -v '/tests/'; }
prod() { src | grep -v "${1:-^$}" | xargs awk 'FNR == 1 { skip = 0 } /^#\[cfg\(test\)\]/ { skip = 1 } !skip'; }

# 1. The session manager.
mgr=crates/session/src/manager.rs
fields=$(awk '/^pub struct Manager \{/{on=1; next} on && /^\}/{on=0} on && /^ *(pub(\([a-z]+\))? )?[a-z_]+: /' "$mgr" | wc -l)
crate_fields=$(awk '/^pub struct Manager \{/{on=1; next} on && /^\}/{on=0} on && /^ *pub\(crate\) [a-z_]+: /' "$mgr" | wc -l)
impl_blocks=$(git grep -hcE '^impl Manager\b' -- 'crates/session/src/*.rs' | awk '{s+=$1} END{print s+0}')
impl_files=$(git grep -lE '^impl Manager\b' -- 'crates/session/src/*.rs' | wc -l)
echo "manager_fields $fields"
echo "manager_pub_crate_fields $crate_fields"
echo "impl_manager_blocks $impl_blocks"
echo "impl_manager_files $impl_files"

# 2. Privileged calls made directly, outside crates/sys: a call of the
# function itself (nix's or libc's), not a method of the Syscall seam
# (`sys.mount(`), a definition, a comment or a string; and the raw
# syscalls of the new mount API.
priv='(^|[^.a-z_])(mount|umount2|umount|setns|unshare|open_tree|move_mount|mount_setattr)\(|SYS_(open_tree|move_mount|mount_setattr|fsopen|fsmount)'
priv_calls=$(prod '^crates/sys/' | grep -E "$priv" | grep -vE '^\s*//' \
  | grep -vE '\bfn (mount|umount2|umount|setns|unshare|open_tree|move_mount|mount_setattr)\b' \
  | grep -vE '"[^"]*\b(mount|umount2?|setns|unshare)\([^"]*"' | wc -l)
echo "direct_privileged_calls_outside_sys $priv_calls"

# 3. The CLI crate.
cli_lines=$(git ls-files -- 'crates/cli/src/*.rs' | xargs cat | wc -l)
bench_lines=$( (git ls-files -- 'crates/cli/src/bench.rs' 'crates/cli/src/bench/*.rs' | xargs -r cat) | wc -l)
echo "cli_lines $cli_lines"
echo "cli_bench_lines $bench_lines"
cli_deps=$(awk '/^\[dependencies\]/{on=1; next} /^\[/{on=0} on && /^drums-/{sub(/[ .=].*/, ""); printf "%s ", $0}' crates/cli/Cargo.toml)
echo "cli_drums_dependencies ${cli_deps:-none}"

# 5. Closed sets compared as string literals: session, version and job
# states, profile, network, egress, policy, turn class, what a version took.
closed='"(creating|running|removing|pending|dumping|versioning|done|failed|queued|desktop|headless|none|bridge|nat|selective|full|files|off|processes|both|manual|process)"'
string_cmps=$(prod | grep -E "(==|!=) *$closed|$closed *(==|!=)" | grep -vE '^\s*//' | wc -l)
echo "closed_set_string_comparisons $string_cmps"

# 6. Errors turned into text. (`|| true`: with pipefail, a grep that finds
# nothing would end the script.)
chain_fns=$( (src | xargs grep -hE 'fn (chain|error_chain)\(' || true) | wc -l)
chain_calls=$( (src | xargs grep -hoE '\b(chain|error_chain)\(&' || true) | wc -l)
string_err_crates=$( (src | xargs grep -lE 'Result<[^;{]*, *String>' || true) | cut -d/ -f2 | sort -u | wc -l)
# SessionError's variants that hold a message made from an error (not an id
# or name): its chain was flattened where it was raised.
string_variants=$( (git grep -hoE '^\s+(Hygiene|Desktop|Init|Injected|Conflict|Invalid)\((String|BoxError)\)' -- 'crates/session/src/lib.rs' || true) | tr -d ' ' | tr '\n' ' ')
anyhow_libs=$( (git grep -lE 'anyhow' -- 'crates/*/src/*.rs' 'crates/*/src/**/*.rs' || true) | (grep -v '/main.rs$' || true) | cut -d/ -f2 | sort -u | tr '\n' ' ')
echo "error_chain_fns $chain_fns"
echo "error_chain_call_sites $chain_calls"
echo "crates_with_result_string $string_err_crates"
echo "session_error_string_variants ${string_variants:-none}"
echo "crates_using_anyhow_outside_main ${anyhow_libs:-none}"

# Size, for scale.
echo "crates $(ls -d crates/*/ | wc -l)"
echo "rust_lines $(git ls-files -- 'crates/*.rs' | xargs cat | wc -l)"
