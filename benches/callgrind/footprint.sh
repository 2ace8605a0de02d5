#!/usr/bin/env bash
# The distinct cache lines and pages the proxy touches per HTTP/1.1 request, data and code,
# which mappings the data lines are in (a thread's stack, the heap, the binary), and which
# functions first touched the stack lines (llvm-symbolizer names them): what a request
# must fetch back into the caches at partial load, where the core idles or runs the kernel's
# work between requests. Runs the proxy under valgrind's lackey (every access traced; slow:
# a few requests a second), one client on 127.0.0.1 that waits 100 ms after each answer before
# its next request, and counts with footprint.py for MEASURE seconds (default 20) after WARM
# seconds (default 8). Under valgrind the heap and the main thread's stack are both anonymous
# mappings: for nginx and HAProxy, whose main thread serves, they are counted together.
#
#   benches/callgrind/footprint.sh BINARY [CONFIG_TEMPLATE]
#
# BINARY is a legate build (CONFIG_TEMPLATE as for per_request.sh, default the peer bench's)
# or `nginx` / `haproxy` with the peer bench's config, one process.
# Needs valgrind, wrk and python3, and a release build of noop-upstream; x86_64 (footprint.py
# knows its system call numbers).
set -euo pipefail
bin=$1
repo="$(cd "$(dirname "$0")/../.." && pwd)"
template=${2:-$repo/benches/peer/legate.yaml.tmpl}
run=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2> /dev/null || true; done; rm -rf "$run"' EXIT
source "$repo/benches/peer/proxy.sh"
# Below the ephemeral range (32768 up), where the load's own connections could take it.
port=$((20000 + RANDOM % 12000)) upstream=$((port + 1)) admin=$((port + 2)) h2c=$((port + 3))
"$repo/target/release/noop-upstream" --listen "127.0.0.1:$upstream" > "$run/upstream.out" &
pids+=($!)
for _ in $(seq 50); do grep -q listening "$run/upstream.out" && break; sleep 0.1; done
grep -q listening "$run/upstream.out" || { echo "the upstream did not start" >&2; exit 1; }
proxy_setup "$bin" "$template" "$run" "$port" "$upstream" "$admin" "$h2c"
mkfifo "$run/trace"
python3 "$repo/benches/callgrind/footprint.py" "$run/start" "$run/stop" "$run/maps" \
    < "$run/trace" > "$run/counts" &
counter=$!
pids+=($counter)
valgrind --tool=lackey --trace-mem=yes --trace-sched=yes --trace-syscalls=yes \
    --log-file="$run/trace" "${proxy_command[@]}" 2> "$run/valgrind.err" &
proxy=$!
pids+=($proxy)
for _ in $(seq 600); do
    proxy_listening "$port" && break
    kill -0 "$proxy" 2> /dev/null || break
    sleep 0.2
done
proxy_listening "$port" || { echo "the proxy did not start:" >&2; cat "$run/valgrind.err" >&2; exit 1; }
lua=$(paced_script "$run" 100)
wrk -t 1 -c 1 -d "${WARM:-8}s" --timeout 10s -s "$lua" "http://127.0.0.1:$port/" > "$run/warm-up"
cat "/proc/$proxy/maps" > "$run/maps"
touch "$run/start"
wrk -t 1 -c 1 -d "${MEASURE:-20}s" --timeout 10s -s "$lua" "http://127.0.0.1:$port/" > "$run/load"
touch "$run/stop"
paced_served "$run/load" > /dev/null || exit 1
# The counter stops at the next line it reads, or when the log ends with the proxy.
kill -TERM "$proxy" 2> /dev/null || true
for _ in $(seq 300); do kill -0 "$proxy" 2> /dev/null || break; sleep 0.1; done
kill -KILL "$proxy" 2> /dev/null || true
wait "$proxy" 2> /dev/null || true
wait "$counter"
echo "$(basename "$bin"), one client, 100 ms between an answer and the next request:"
cat "$run/counts"
