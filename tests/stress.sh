#!/usr/bin/env bash
# Runs the whole test suite while busy loops, one per core, compete for the CPUs: a test that
# passes only on a quiet machine fails here. Three runs by default (`tests/stress.sh 5` for
# five); stops at the first failure. The loops are this script's own children, ended by PID
# when it exits, however it exits.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=${1:-3}
cores=$(nproc)

# Built first, on a quiet machine: the loops are for the tests, not the compiler.
cargo test --workspace --locked --no-run --quiet

busy=()
stop_loops() {
    for pid in "${busy[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${busy[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
}
trap stop_loops EXIT
for _ in $(seq "$cores"); do
    (while :; do :; done) &
    busy+=("$!")
done
echo "stress: ${#busy[@]} busy loops (pids ${busy[*]}) on $cores cores"

for run in $(seq "$runs"); do
    started=$(date +%s)
    if cargo test --workspace --locked --quiet >"target/stress-run-$run.log" 2>&1; then
        echo "stress: run $run of $runs passed in $(($(date +%s) - started)) s"
    else
        echo "stress: run $run of $runs FAILED after $(($(date +%s) - started)) s; see target/stress-run-$run.log"
        grep -E "^test .* FAILED|panicked at" "target/stress-run-$run.log" | head -20 || true
        exit 1
    fi
done
echo "stress: $runs runs in a row passed"
