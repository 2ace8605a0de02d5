#!/usr/bin/env bash
# Overload: how fast the proxy refuses requests past a circuit breaker, next to how fast it
# answers direct responses, on the same connections and machine. max_requests is 64 and the
# upstream holds each admitted request 1 s, so 320 connections (5x the limit) are refused at
# the breaker almost entirely (at most 64 admitted a second; they are the 1 s tail above
# p99.9). oha reports the latency distribution and the status codes. Loopback only.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo"
cargo build --release --bin legate && cargo build --release -p testbed --bin noop-upstream
dir="$(mktemp -d /tmp/legate-overload.XXXXXX)"
cat > "$dir/legate.yaml" <<YAML
concurrency: ${WORKERS:-1}
admin: { address: 127.0.0.1:21402 }
listeners:
  - name: bench
    address: 127.0.0.1:21400
    routes:
      - match: { prefix: /direct }
        direct_response: { status: 200, body: "ok\n" }
      - match: { prefix: / }
        cluster: origin
clusters:
  - name: origin
    endpoints: [127.0.0.1:21401]
    circuit_breakers: { max_requests: 64 }
YAML
target/release/noop-upstream --listen 127.0.0.1:21401 >/dev/null 2>&1 &
upstream=$!
taskset -c 1 target/release/legate -c "$dir/legate.yaml" 2>/dev/null &
proxy=$!
trap 'kill $proxy $upstream 2>/dev/null; rm -rf "$dir"' EXIT
sleep 1
summary() { grep -E "Requests/sec|50.00% in|90.00% in|99.00% in|99.90% in|\[[0-9]{3}\] [0-9]+ responses"; }
for run in 1 2; do
  echo "== run $run: direct response, 320 connections"
  taskset -c 0 oha -c 320 -z 10s --no-tui http://127.0.0.1:21400/direct | summary
  echo "== run $run: 5x over max_requests (503 at the breaker), 320 connections"
  taskset -c 0 oha -c 320 -z 10s --no-tui -H "x-noop-delay: 1s" http://127.0.0.1:21400/ | summary
done
curl -s "127.0.0.1:21402/stats?filter=upstream_rq_pending_overflow%7Cupstream_rq_total" | grep -v worker
