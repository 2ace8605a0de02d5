#!/usr/bin/env bash
# A long run of the release binary under a fleet's churn (crates/testbed/src/bin/soak.rs):
# keep-alive HTTP/1.1 and HTTP/2 load, 10% of the endpoints replaced every second over EDS, a
# route flip every 5 s, a config reload every 30 s, the access log rotated every 5 minutes.
# Passes with no failed request, resident memory within 5% after the first 5 minutes, and one
# access log line per answered request; draws the memory to OUT/rss.png.
#
#   benches/soak/run.sh [MINUTES (30)] [RATE (400 requests/s)] [OUT (target/soak)]
#
# Not part of CI: it takes half an hour. Everything runs on 127.0.0.1 and stops by itself.
set -euo pipefail
cd "$(dirname "$0")/../.."
minutes=${1:-30}
rate=${2:-400}
out=${3:-target/soak}
cargo build --release --locked --bin legate -p legate
cargo build --release --locked --bin soak -p testbed
status=0
target/release/soak --binary target/release/legate --minutes "$minutes" --rate "$rate" \
    --out "$out" || status=$?
benches/plot/plot.sh soak "$out/rss.csv" "$out/rss.png" || true
exit "$status"
