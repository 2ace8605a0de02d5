#!/usr/bin/env bash
# A release build of `legate` optimised with a profile of its own request path (profile-guided
# optimisation): built once instrumented, run under the training load (benches/pgo/train.sh,
# all on 127.0.0.1), then built again with the profile. The compiler lays the code the requests
# run out together and moves what they never run out of the way, so a request touches fewer
# cache lines: see "Profile-guided build" in docs/performance.md for the figures.
#
#   benches/pgo/build.sh            # -> target/pgo/<host triple>/release/legate
#
# Needs the llvm-tools component (rustup component add llvm-tools, for llvm-profdata) and
# h2load (Debian: nghttp2-client). Two full release builds: about 30 minutes on 2 cores.
# Builds into target/pgo, apart from target/release. `--target` is given so that RUSTFLAGS
# reach the binary's code only, not build scripts and proc macros (run on the host, they would
# write profiles of their own).
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo"
host=$(rustc -vV | sed -n 's/^host: //p')
sysroot=$(rustc --print sysroot)
profdata="$sysroot/lib/rustlib/$host/bin/llvm-profdata"
[ -x "$profdata" ] || { echo "llvm-profdata not found: rustup component add llvm-tools" >&2; exit 1; }
command -v h2load > /dev/null || { echo "h2load not found (Debian: nghttp2-client)" >&2; exit 1; }
target_dir="$repo/target/pgo"
profiles="$target_dir/profiles"
rm -rf "$profiles" && mkdir -p "$profiles"
# Either would override the flags below: the profiles' place, or RUSTFLAGS altogether.
unset LLVM_PROFILE_FILE CARGO_ENCODED_RUSTFLAGS

# The upstream the training load goes to, built as usual.
cargo build --release --locked -p testbed --bin noop-upstream

RUSTFLAGS="-Cprofile-generate=$profiles" cargo build --release --locked --bin legate \
    --target "$host" --target-dir "$target_dir/instrumented"
bash benches/pgo/train.sh "$target_dir/instrumented/$host/release/legate"
compgen -G "$profiles/*.profraw" > /dev/null \
    || { echo "the training wrote no profile into $profiles" >&2; exit 1; }
"$profdata" merge -o "$target_dir/legate.profdata" "$profiles"

RUSTFLAGS="-Cprofile-use=$target_dir/legate.profdata" cargo build --release --locked \
    --bin legate --target "$host" --target-dir "$target_dir"
echo "built $target_dir/$host/release/legate"
