#!/usr/bin/env bash
# Instructions the proxy executes per request, counted by valgrind's callgrind: repeatable on
# a noisy machine, unlike CPU seconds. Runs the proxy twice under callgrind (N1 and N2
# HTTP/1.1 requests from h2load against a testbed upstream, all on 127.0.0.1) and divides the
# difference, so start-up and shutdown cancel out.
#
#   benches/callgrind/per_request.sh BINARY CONFIG_TEMPLATE [N1 N2]
#
# CONFIG_TEMPLATE is a legate config with {listen_port} and {upstream_port} placeholders (the
# peer-bench template works; {run_dir} is a scratch directory). Prints instructions/request.
# REQUEST_PATH (default /) is the path requested, e.g. a longer one to weigh path handling;
# HEADER ("name: value") is sent with each request (a token for an authentication filter).
# PROTOCOL=h2c sends the requests over HTTP/2 without TLS (to {h2c_port}, 10 streams at once
# per connection) instead of HTTP/1.1.
# BINARY may also be `nginx` or `haproxy` (from PATH, one process, one thread), run the same way
# with the peer bench's config (../shared/bench/conf; CONFIG_TEMPLATE is then ignored), to set
# the figure beside theirs.
# PACED=CONNECTIONS sends HTTP/1.1 at partial load instead, as the peer bench's fixed rate paces
# wrk: each connection waits 10 ms before each request, for the time N1 and N2 requests take at
# about 95 a second per connection (wrk counts them); with few connections (5: about 475 req/s)
# the proxy wakes up for nearly every request, even under callgrind, so the figure holds what
# a wake-up costs. PACED_DELAY=MS (default 10) is another wait: many connections, each
# sending seldom (PACED=128 PACED_DELAY=200: about 640 req/s, which callgrind keeps up with), are
# the peer bench's fixed rate as a cache sees it, every request on a connection gone cold.
# CACHE_SIM=1 also simulates the caches and branch predictors (valgrind's --cache-sim and
# --branch-sim) and prints every event per request: I1mr is instruction fetches that missed the
# first-level cache, D1mr/D1mw data reads/writes that did, Bcm/Bim mispredicted branches.
# CONNECTIONS (default 8) is how many connections h2load opens. With CACHE_SIM=1,
# LL=SIZE,WAYS,LINE sets the simulated last-level cache (valgrind takes the machine's largest,
# often a shared L3 where a few connections' state always fits): e.g. LL=524288,8,64, a core's
# own L2 on this machine's EPYC, and 128 connections show what each connection's state costs
# once they outgrow it (DLmr, DLmw: data reads/writes that missed there too).
# Needs valgrind and h2load (Debian: apt-get install valgrind nghttp2-client; wrk for PACED) and a release
# build of noop-upstream (cargo build --release -p testbed --bin noop-upstream).
set -euo pipefail
bin=$1 template=${2:-} n1=${3:-2000} n2=${4:-12000}
repo="$(cd "$(dirname "$0")/../.." && pwd)"
run=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$run"' EXIT
# Below the ephemeral range (32768 up), where the load's own connections could take it.
port=$((20000 + RANDOM % 12000)) upstream=$((port + 1)) admin=$((port + 2))
"$repo/target/release/noop-upstream" --listen "127.0.0.1:$upstream" > "$run/upstream.out" &
for _ in $(seq 50); do grep -q listening "$run/upstream.out" && break; sleep 0.1; done
grep -q listening "$run/upstream.out" || { echo "the upstream did not start (port $upstream taken?)" >&2; exit 1; }
h2c=$((port + 3))
case "$bin" in
    nginx | haproxy) ;;
    *) [ -n "$template" ] || { echo "usage: $0 BINARY CONFIG_TEMPLATE [N1 N2]" >&2; exit 2; } ;;
esac
source "$repo/benches/peer/proxy.sh"
proxy_setup "$bin" "$template" "$run" "$port" "$upstream" "$admin" "$h2c"
events=()
[ -z "${CACHE_SIM:-}" ] || events=(--cache-sim=yes --branch-sim=yes ${LL:+--LL=$LL})
connections=${CONNECTIONS:-8}

ready() { # log: the proxy serves (for a peer: both its listeners take connections, and the one
           # probe connection to each is in both runs, so it cancels out)
    case "$bin" in
        nginx | haproxy) proxy_listening "$port" "$h2c" ;;
        *) grep -q "legate ready" "$1" 2> /dev/null ;;
    esac
}

paced_delay=${PACED_DELAY:-10}
paced_lua=$(paced_script "$run" "$paced_delay")

count() { # requests -> the requests served, then the totals of every event
    valgrind --tool=callgrind "${events[@]}" --callgrind-out-file="$run/cg.$1" "${proxy_command[@]}" \
        2>"$run/log.$1" &
    local pid=$!
    for _ in $(seq 300); do ready "$run/log.$1" && break; sleep 0.1; done
    local served=$1
    if [ -n "${PACED:-}" ]; then
        # Each connection sends one request per DELAY + 0.5 ms (its answer's time).
        local seconds=$(( ($1 * (2 * paced_delay + 1) + PACED * 2000 - 1) / (PACED * 2000) ))
        wrk -t 1 -c "$PACED" -d "${seconds}s" --timeout 5s -s "$paced_lua" \
            ${HEADER:+-H "$HEADER"} "http://127.0.0.1:$port${REQUEST_PATH:-/}" > "$run/h2load.$1"
        served=$(paced_served "$run/h2load.$1") || exit 1
    elif [ "${PROTOCOL:-h1}" = h2c ]; then
        h2load -n "$1" -c "$connections" -m 10 ${HEADER:+-H "$HEADER"} "http://127.0.0.1:$h2c${REQUEST_PATH:-/}" > "$run/h2load.$1"
    else
        h2load --h1 -n "$1" -c "$connections" ${HEADER:+-H "$HEADER"} "http://127.0.0.1:$port${REQUEST_PATH:-/}" > "$run/h2load.$1"
    fi
    # Only a run where every request got a 2xx measures the request path.
    [ -n "${PACED:-}" ] || grep -q "status codes: $1 2xx" "$run/h2load.$1" \
        || { echo "not every request succeeded:" >&2; cat "$run/h2load.$1" >&2; exit 1; }
    kill -TERM $pid; wait $pid || true
    echo "$served $(grep -m1 '^summary:\|^totals:' "$run/cg.$1" | cut -d' ' -f2-)"
}
a=($(count "$n1")); b=($(count "$n2"))
names=(requests $(grep -m1 '^events:' "$run/cg.$n1" | cut -d' ' -f2-))
requests=$(( b[0] - a[0] ))
load="${PROTOCOL:-h1}, $connections connections"
[ -z "${PACED:-}" ] || load="h1 paced, $PACED connections, a request each per $paced_delay ms"
[ -z "${CACHE_SIM:-}" ] || [ -z "${LL:-}" ] || load="$load, LL $LL"
echo "$(( (b[1] - a[1]) / requests )) instructions/request ($load, $bin${template:+, $(basename "$template")})"
if [ -n "${CACHE_SIM:-}" ]; then
    for i in "${!names[@]}"; do
        [ "$i" -gt 0 ] || continue
        printf '%s %s  ' "${names[$i]}" "$(( (b[i] - a[i]) / requests ))"
    done
    echo "(per request)"
fi
[ -z "${KEEP:-}" ] || echo "callgrind outputs kept in $run"
