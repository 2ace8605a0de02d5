#!/usr/bin/env bash
# The global rate limit against ext_authz: what each call costs the proxy. One Legate worker on
# CPU 1 with three listeners in front of the testbed upstream: no filter, ext_authz (the
# testbed sidecar, gRPC, allowing at once) and global_rate_limit (the testbed's rate limit
# service, answering at once; with --real, envoyproxy/ratelimit on Redis, a limit never
# reached). wrk, the upstream and the services share CPU 0. For each, interleaved over two
# rounds, at saturation (wrk -c 64): requests a second, and the proxy's CPU (utime+stime from
# /proc) per 100k requests, the fair figure when CPU 0 is the limit. Loopback only; ports
# 21520-21535, below the ephemeral range.
#
# Needs wrk (Debian's package); --real also redis-server and the rate limit service:
# RATELIMIT_BIN, or target/tools/service_cmd as tests/run.sh builds it.
#
# usage: benches/global_rate_limit/run.sh [--duration SECONDS] [--real]
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo"
duration=8
real=false
while [ $# -gt 0 ]; do
  case "$1" in
    --duration) duration="$2"; shift 2 ;;
    --real) real=true; shift ;;
    *) echo "usage: $0 [--duration SECONDS] [--real]" >&2; exit 2 ;;
  esac
done
ratelimit="${RATELIMIT_BIN:-$repo/target/tools/service_cmd}"
command -v wrk >/dev/null || { echo "wrk is not installed" >&2; exit 1; }
if $real; then
  [ -x "$ratelimit" ] || { echo "no rate limit service at $ratelimit (run tests/run.sh, or set RATELIMIT_BIN)" >&2; exit 1; }
  command -v redis-server >/dev/null || { echo "redis-server is not installed" >&2; exit 1; }
fi
cargo build --release --bin legate -p legate >&2
cargo build --release -p testbed --bin noop-upstream --bin authz-sidecar --bin ratelimit-service >&2
dir="$(mktemp -d /tmp/legate-ratelimit.XXXXXX)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT
mkdir -p "$dir/runtime/ratelimit/config"
cat > "$dir/runtime/ratelimit/config/config.yaml" <<YAML
domain: bench
descriptors:
  - key: generic_key
    value: everyone
    rate_limit: { unit: second, requests_per_unit: 1000000000 }
YAML
cat > "$dir/legate.yaml" <<YAML
concurrency: 1
admin: { address: 127.0.0.1:21523 }
listeners:
  - name: off
    address: 127.0.0.1:21520
    routes:
      - match: { prefix: / }
        cluster: origin
  - name: authz
    address: 127.0.0.1:21521
    http_filters: [{ ext_authz: { grpc: { address: 127.0.0.1:21531 } } }]
    routes:
      - match: { prefix: / }
        cluster: origin
  - name: ratelimit
    address: 127.0.0.1:21522
    http_filters:
      - global_rate_limit:
          service: { address: 127.0.0.1:21532 }
          domain: bench
          timeout: 1s
          rate_limits: [{ actions: [{ generic_key: { descriptor_value: everyone } }] }]
    routes:
      - match: { prefix: / }
        cluster: origin
clusters:
  - name: origin
    endpoints: [127.0.0.1:21530]
YAML
taskset -c 0 target/release/noop-upstream --listen 127.0.0.1:21530 >/dev/null 2>&1 &
pids+=($!)
taskset -c 0 target/release/authz-sidecar --listen 127.0.0.1:21531 >/dev/null 2>&1 &
pids+=($!)
if $real; then
  service="envoyproxy/ratelimit on Redis"
  taskset -c 0 redis-server --port 0 --save "" --appendonly no --unixsocket "$dir/redis.sock" >/dev/null 2>&1 &
  pids+=($!)
  for _ in $(seq 50); do [ -S "$dir/redis.sock" ] && break; sleep 0.1; done
  USE_STATSD=false LOG_LEVEL=warn REDIS_SOCKET_TYPE=unix REDIS_URL="$dir/redis.sock" \
    RUNTIME_ROOT="$dir/runtime" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false \
    HOST=127.0.0.1 PORT=21533 GRPC_HOST=127.0.0.1 GRPC_PORT=21532 DEBUG_HOST=127.0.0.1 DEBUG_PORT=21534 \
    taskset -c 0 "$ratelimit" >"$dir/ratelimit.log" 2>&1 &
  pids+=($!)
else
  service="the testbed's rate limit service"
  taskset -c 0 target/release/ratelimit-service --listen 127.0.0.1:21532 >/dev/null 2>&1 &
  pids+=($!)
fi
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/21532) 2>/dev/null && break; sleep 0.1; done
taskset -c 1 target/release/legate -c "$dir/legate.yaml" 2>"$dir/legate.log" &
proxy=$!
pids+=($proxy)
for _ in $(seq 50); do grep -q "legate ready" "$dir/legate.log" && break; sleep 0.1; done
grep -q "legate ready" "$dir/legate.log" || { cat "$dir/legate.log" >&2; exit 1; }

cpu_ticks() { awk '{print $14 + $15}' "/proc/$proxy/stat"; }
hz=$(getconf CLK_TCK)
declare -A port=([off]=21520 [authz]=21521 [ratelimit]=21522)
results="$dir/results.tsv"
: > "$results"
measure() { # name
  local name=$1 before after start end out
  before=$(cpu_ticks); start=$(date +%s.%N)
  out=$(taskset -c 0 wrk -t 1 -c 64 -d "${duration}s" "http://127.0.0.1:${port[$name]}/")
  after=$(cpu_ticks); end=$(date +%s.%N)
  python3 - "$name" "$before" "$after" "$hz" "$start" "$end" "$out" >> "$results" <<'PY'
import re, sys
name, before, after, hz, start, end, out = sys.argv[1:]
total = int(re.search(r"(\d+) requests in", out).group(1))
bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
bad = int(bad.group(1)) if bad else 0
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
cpu = (int(after) - int(before)) / int(hz)
wall = float(end) - float(start)
print("\t".join(str(x) for x in [name, rps, cpu / max(total, 1) * 1e5, cpu / wall * 100, total, bad]))
PY
  tail -1 "$results" | awk -F'\t' '{printf "  %-9s %9.0f req/s  CPU %.3f s/100k  busy %3.0f%%  requests %d, not 2xx %d\n", $1, $2, $3, $4, $5, $6}' >&2
}
# Warm up every listener (connections to the upstream and the services).
for name in off authz ratelimit; do taskset -c 0 wrk -t 1 -c 16 -d 1s "http://127.0.0.1:${port[$name]}/" >/dev/null; done
for round in 1 2; do
  echo "== round $round" >&2
  for name in off authz ratelimit; do measure "$name"; done
  for name in ratelimit authz off; do measure "$name"; done
done
stats=$(curl -s "127.0.0.1:21523/stats?filter=^(http_ratelimit|ext_authz)_(ok|error|over_limit|denied)" | grep -v worker || true)
python3 - "$results" "$duration" "$stats" "$service" <<'PY'
import sys, statistics
path, duration, stats, service = sys.argv[1:]
rows = [l.rstrip("\n").split("\t") for l in open(path) if l.strip()]
def med(name, col):
    return statistics.median(float(r[col]) for r in rows if r[0] == name)
print(f"## global rate limit ({service}) and ext_authz: one worker on CPU 1; wrk, upstream and services on CPU 0 ({duration} s a run, medians of 4)\n")
print("| | off | ext_authz | global_rate_limit | ext_authz / off | global_rate_limit / off |")
print("|---|---:|---:|---:|---:|---:|")
for label, col, fmt in [("saturation req/s", 1, "{:.0f}"), ("proxy CPU s per 100k requests", 2, "{:.3f}"), ("proxy busy %", 3, "{:.0f}")]:
    off, authz, rl = (med(n, col) for n in ("off", "authz", "ratelimit"))
    print(f"| {label} | {fmt.format(off)} | {fmt.format(authz)} | {fmt.format(rl)} | x{authz / off:.2f} | x{rl / off:.2f} |")
bad = [r for r in rows if r[5] != "0"]
print()
print("not 2xx: " + ("none" if not bad else ", ".join(f"{r[0]}: {r[5]}" for r in bad)))
print("proxy stats: " + " ".join(stats.split()))
PY
