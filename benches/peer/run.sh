#!/usr/bin/env bash
# Legate side by side with nginx and HAProxy on this machine; extra arguments go to the harness
# (e.g. --quick, --scenarios saturation,h2c). Run from anywhere; needs ../shared beside the repo.
# The harness writes its report to stdout and a JSON file here; a picture of the run is drawn
# beside the JSON (peer-bench-*.png: latency by percentile, CPU per request).
# PGO=1 measures the profile-guided build (benches/pgo/build.sh) instead of the plain one.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo"
if [ "${PGO:-0}" = 1 ]; then
    bash benches/pgo/build.sh
    bin="target/pgo/$(rustc -vV | sed -n 's/^host: //p')/release/legate"
else
    cargo build --release --locked --bin legate
    bin=target/release/legate
fi
../shared/bench/peer-bench run --ours-cmd "$bin -c {config}" \
    --ours-config benches/peer/legate.yaml.tmpl "$@"
json=$(ls -t peer-bench-*.json | head -n 1)
bash benches/plot/plot.sh peer "$json" "${json%.json}.png"
