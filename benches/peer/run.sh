#!/usr/bin/env bash
# Legate side by side with nginx and HAProxy on this machine; extra arguments go to the harness
# (e.g. --quick, --scenarios saturation,h2c). Run from anywhere; needs ../shared beside the repo.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo"
cargo build --release --locked --bin legate
exec ../shared/bench/peer-bench run --ours-cmd 'target/release/legate -c {config}' \
    --ours-config benches/peer/legate.yaml.tmpl "$@"
