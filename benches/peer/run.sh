#!/usr/bin/env bash
# Legate side by side with nginx and HAProxy on this machine; extra arguments go to the harness
# (e.g. --quick, --scenarios saturation,h2c). Run from anywhere; needs ../shared beside the repo.
# The harness writes its report to stdout and a JSON file here; a picture of the run is drawn
# beside the JSON (peer-bench-*.png: latency by percentile, CPU per request).
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo"
cargo build --release --locked --bin legate
../shared/bench/peer-bench run --ours-cmd 'target/release/legate -c {config}' \
    --ours-config benches/peer/legate.yaml.tmpl "$@"
json=$(ls -t peer-bench-*.json | head -n 1)
bash benches/plot/plot.sh peer "$json" "${json%.json}.png"
