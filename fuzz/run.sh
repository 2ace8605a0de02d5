#!/usr/bin/env bash
# Runs the fuzz targets for SECONDS each (default 20), as many at once as there are cores
# (FUZZ_JOBS to say otherwise): fuzz/run.sh [--dev] [SECONDS] [TARGET...]
#
# Targets are built optimised by default, for runs that search. `--dev` builds them without
# optimisation: a quarter of the build time and fewer runs a second, for a short smoke run
# (CI's), which replays the corpus and tries a few mutations of it.
#
# Each target starts from its corpus in fuzz/corpus/TARGET and works on a scratch copy
# (fuzz/target/work/TARGET), so the checkout stays as it is. A crash fails the run: the input
# is in fuzz/artifacts/TARGET/. Put it in fuzz/regressions/TARGET/ once fixed: `cargo test`
# replays every corpus and regression input through the same checks.
#
# Needs rustup and a C++ compiler; Rust nightly and cargo-fuzz are installed when missing.
set -euo pipefail
cd "$(dirname "$0")"

mode=()
if [ "${1:-}" = --dev ]; then
    mode=(--dev)
    shift
fi
seconds=${1:-20}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(config path_router h1_head h1_request h1_response h1_chunked ext_authz_answer ext_authz_check balancer proxy_protocol xds jwt h3_stream
        h2_frames h2_hpack h2_hpack_roundtrip h2_data h2_headers h2_priority h2_rst_stream
        h2_settings h2_push_promise h2_ping h2_goaway h2_window_update h2_continuation)
fi

command -v rustup >/dev/null || { echo "fuzz/run.sh needs rustup (for Rust nightly)" >&2; exit 1; }
rustup run nightly rustc -V >/dev/null 2>&1 || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --version 0.13.2 --locked
# libFuzzer itself is C++, built by libfuzzer-sys.
command -v c++ >/dev/null || command -v clang++ >/dev/null || {
    echo "fuzz/run.sh needs a C++ compiler (Debian: apt-get install g++)" >&2
    exit 1
}

# cargo-fuzz's default: optimised, with debug assertions and overflow checks, under
# AddressSanitizer (`--dev`: the same without optimisation).
cargo +nightly fuzz build ${mode[@]+"${mode[@]}"}

# One target's run; its summary (or, when it failed, its log's end) is printed in one piece,
# and a failure leaves target/work/TARGET.failed.
run_target() {
    local target=$1 work=target/work/$1 status=0
    mkdir -p "$work" "artifacts/$target"
    cargo +nightly fuzz run ${mode[@]+"${mode[@]}"} "$target" "$work" "corpus/$target" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        > "target/work/$target.log" 2>&1 || status=$?
    if [ $status -ne 0 ]; then
        {
            echo "== $target: FAILED (exit $status); the input is in fuzz/artifacts/$target/"
            tail -n 60 "target/work/$target.log"
        } >&2
        touch "target/work/$target.failed"
        return 1
    fi
    echo "== $target: $seconds s, $(grep -oE 'Done [0-9]+ runs in [0-9]+ second' \
        "target/work/$target.log" || echo 'no summary')"
}

# As many targets at once as there are cores: each run takes one. A target's failure is
# read from its mark, not from `wait`, which may have reported it already.
parallel=${FUZZ_JOBS:-$(nproc)}
mkdir -p target/work
rm -f target/work/*.failed
for target in "${targets[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$parallel" ]; do
        wait -n || true
    done
    run_target "$target" &
done
wait
failed=(target/work/*.failed)
if [ -e "${failed[0]}" ]; then
    echo "fuzz targets failed: ${failed[*]}" >&2
    exit 1
fi
