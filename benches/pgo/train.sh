#!/usr/bin/env bash
# The training load for a profile-guided build (benches/pgo/build.sh): an instrumented legate
# (built with -Cprofile-generate) serves, on one worker,
#   - HTTP/1.1 and h2c through the peer bench's config (benches/peer/legate.yaml.tmpl) to the
#     testbed upstream: the plain proxied path the benchmarks measure;
#   - HTTP/1.1 and HTTP/2 over TLS through `legate demo`, and HTTP/1.1 through its ext_authz
#     check (/private with the demo's token, on the plain listener: the TLS one has no check),
#     so TLS and the filter chain are not left cold.
# Each part is counted: a run where any request failed stops the build, since its profile
# would not be of the request path. All traffic is on 127.0.0.1; every process started here is
# ended here, by its PID. The profile is written when legate exits: SIGTERM, a clean drain and
# exit status 0, which is checked (a crash or a hung drain would leave no profile).
#
#   benches/pgo/train.sh INSTRUMENTED_BINARY
set -euo pipefail
bin=$1
repo="$(cd "$(dirname "$0")/../.." && pwd)"
run=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2> /dev/null || true; done; rm -rf "$run"' EXIT
# Below the ephemeral range (32768 up), where the load's own connections could take it.
port=$((20000 + RANDOM % 12000)) upstream=$((port + 1)) admin=$((port + 2)) h2c=$((port + 3))
tls=$((port + 4)) demo=$((port + 5)) demo_admin=$((port + 6))

wait_for() { # file pattern
    for _ in $(seq 300); do grep -q "$2" "$1" 2> /dev/null && return 0; sleep 0.1; done
    echo "timed out waiting for '$2' in $1:" >&2; cat "$1" >&2; exit 1
}
load() { # requests h2load-arguments...
    local n=$1; shift
    h2load -n "$n" "$@" > "$run/h2load.out"
    grep -q "status codes: $n 2xx" "$run/h2load.out" \
        || { echo "not every request succeeded (h2load $*):" >&2; cat "$run/h2load.out" >&2; exit 1; }
    echo "  $n requests: h2load $*"
}
stop() { # pid: a clean exit within 30 s, which writes the profile
    kill -TERM "$1"
    for _ in $(seq 300); do kill -0 "$1" 2> /dev/null || break; sleep 0.1; done
    if kill -0 "$1" 2> /dev/null; then
        echo "legate did not exit within 30 s of SIGTERM" >&2; exit 1
    fi
    local status=0
    wait "$1" || status=$?
    [ "$status" = 0 ] || { echo "legate exited with status $status: no profile" >&2; exit 1; }
    local kept=() p
    for p in "${pids[@]}"; do [ "$p" = "$1" ] || kept+=("$p"); done
    pids=("${kept[@]}")
}

"$repo/target/release/noop-upstream" --listen "127.0.0.1:$upstream" > "$run/upstream.out" &
pids+=($!)
wait_for "$run/upstream.out" listening
source "$repo/benches/peer/proxy.sh"
proxy_setup "$bin" "$repo/benches/peer/legate.yaml.tmpl" "$run" "$port" "$upstream" "$admin" "$h2c"
"${proxy_command[@]}" 2> "$run/proxy.log" &
proxy=$!
pids+=("$proxy")
wait_for "$run/proxy.log" "legate ready"
load 200000 --h1 -c 64 "http://127.0.0.1:$port/"
load 200000 -c 16 -m 4 "http://127.0.0.1:$h2c/"
stop "$proxy"

"$bin" demo --port "$demo" --tls-port "$tls" --admin-port "$demo_admin" --concurrency 1 \
    > "$run/demo.log" 2>&1 &
proxy=$!
pids+=("$proxy")
wait_for "$run/demo.log" "legate ready"
load 50000 --h1 -c 16 "https://127.0.0.1:$tls/hello"
load 50000 -c 8 -m 4 "https://127.0.0.1:$tls/hello"
load 20000 -c 8 -m 4 -H "authorization: Bearer demo" "https://127.0.0.1:$tls/private"
load 20000 --h1 -c 16 -H "authorization: Bearer demo" "http://127.0.0.1:$demo/private"
stop "$proxy"
