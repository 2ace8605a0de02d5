#!/usr/bin/env bash
# External authorization: what a check costs the proxy. One Legate worker on CPU 1 with three
# listeners in front of the testbed upstream: no ext_authz, ext_authz over loopback TCP, and
# over a Unix socket, each asking the testbed sidecar (gRPC, allowing at once, one thread). The
# load generator (oha), the upstream and the sidecars share CPU 0. For each, interleaved over
# two rounds:
#   fixed rate   oha -q RATE -c 16 --latency-correction: latency p50, p99 and mean
#   saturation   oha -c 64: requests a second, and the proxy's CPU (utime+stime from /proc)
#                per 100k requests, the fair figure when CPU 0 is the limit
# and the sidecar's own round trip with no proxy: `authz-probe` on CPU 1 (where the proxy runs)
# sending checks at the same fixed rate over one connection, TCP and Unix socket. (The
# in-process round trip is `cargo bench -p legate-benches --bench authz_check`.) Loopback only;
# ports 21500-21511, below the ephemeral range.
#
# usage: benches/ext_authz/run.sh [--rate N] [--duration SECONDS]
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo"
rate=2000
duration=8
while [ $# -gt 0 ]; do
  case "$1" in
    --rate) rate="$2"; shift 2 ;;
    --duration) duration="$2"; shift 2 ;;
    *) echo "usage: $0 [--rate N] [--duration SECONDS]" >&2; exit 2 ;;
  esac
done
cargo build --release --bin legate -p legate >&2
cargo build --release -p testbed --bin noop-upstream --bin authz-sidecar --bin authz-probe >&2
dir="$(mktemp -d /tmp/legate-authz.XXXXXX)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT
cat > "$dir/legate.yaml" <<YAML
concurrency: 1
admin: { address: 127.0.0.1:21503 }
listeners:
  - name: off
    address: 127.0.0.1:21500
    routes:
      - match: { prefix: / }
        cluster: origin
  - name: tcp
    address: 127.0.0.1:21501
    http_filters: [{ ext_authz: { grpc: { address: 127.0.0.1:21511 } } }]
    routes:
      - match: { prefix: / }
        cluster: origin
  - name: uds
    address: 127.0.0.1:21502
    http_filters: [{ ext_authz: { grpc: { address: "unix:$dir/authz.sock" } } }]
    routes:
      - match: { prefix: / }
        cluster: origin
clusters:
  - name: origin
    endpoints: [127.0.0.1:21510]
YAML
taskset -c 0 target/release/noop-upstream --listen 127.0.0.1:21510 >/dev/null 2>&1 &
pids+=($!)
taskset -c 0 target/release/authz-sidecar --listen 127.0.0.1:21511 >/dev/null 2>&1 &
pids+=($!)
taskset -c 0 target/release/authz-sidecar --listen "unix:$dir/authz.sock" >/dev/null 2>&1 &
pids+=($!)
sleep 0.5
taskset -c 1 target/release/legate -c "$dir/legate.yaml" 2>"$dir/legate.log" &
proxy=$!
pids+=($proxy)
for _ in $(seq 50); do grep -q "legate ready" "$dir/legate.log" && break; sleep 0.1; done
grep -q "legate ready" "$dir/legate.log" || { cat "$dir/legate.log" >&2; exit 1; }

cpu_ticks() { awk '{print $14 + $15}' "/proc/$proxy/stat"; }
hz=$(getconf CLK_TCK)
declare -A port=([off]=21500 [tcp]=21501 [uds]=21502)
results="$dir/results.tsv"
: > "$results"
measure() { # name kind
  local name=$1 kind=$2 url="http://127.0.0.1:${port[$1]}/" out="$dir/oha.json"
  local before after start end
  before=$(cpu_ticks); start=$(date +%s.%N)
  if [ "$kind" = rate ]; then
    taskset -c 0 oha -q "$rate" --latency-correction -c 16 -z "${duration}s" --no-tui --output-format json "$url" > "$out" 2>/dev/null
  else
    taskset -c 0 oha -c 64 -z "${duration}s" --no-tui --output-format json "$url" > "$out" 2>/dev/null
  fi
  after=$(cpu_ticks); end=$(date +%s.%N)
  python3 - "$out" "$name" "$kind" "$before" "$after" "$hz" "$start" "$end" >> "$results" <<'PY'
import json, sys
out, name, kind, before, after, hz, start, end = sys.argv[1:]
d = json.load(open(out))
s, p = d["summary"], d["latencyPercentiles"]
codes = d.get("statusCodeDistribution", {})
ok = codes.get("200", 0)
total = sum(codes.values())
cpu = (int(after) - int(before)) / int(hz)
wall = float(end) - float(start)
rps = s["requestsPerSec"]
print("\t".join(str(x) for x in [name, kind, rps, p["p50"] * 1e6, p["p99"] * 1e6, s["average"] * 1e6,
                                  cpu / max(ok, 1) * 1e5, cpu / wall * 100, ok, total]))
PY
  tail -1 "$results" | awk -F'\t' '{printf "  %-4s %-10s %9.0f req/s  p50 %6.0f us  p99 %6.0f us  mean %6.0f us  CPU %.3f s/100k  busy %3.0f%%  200s %d/%d\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10}' >&2
}
# Warm up every listener (connections to the upstream and the sidecars).
for name in off tcp uds; do taskset -c 0 oha -n 2000 -c 16 --no-tui "http://127.0.0.1:${port[$name]}/" >/dev/null 2>&1; done
probe() { # name target
  local line
  line=$(taskset -c 1 target/release/authz-probe --target "$2" --rate "$rate" --duration "$duration")
  echo "  $1 probe      $line" >&2
  echo "$line" | awk -v n="$1" '{print n "\tprobe\t0\t" $6 "\t" $8 "\t" $10 "\t0\t0\t" $2 "\t" $2 + $4}' >> "$results"
}
for round in 1 2; do
  echo "== round $round" >&2
  for name in off tcp uds; do measure "$name" rate; done
  probe tcp 127.0.0.1:21511
  probe uds "unix:$dir/authz.sock"
  for name in uds tcp off; do measure "$name" saturation; done
done
stats=$(curl -s "127.0.0.1:21503/stats?filter=^ext_authz_(ok|error|denied)" | grep -v worker || true)
python3 - "$results" "$rate" "$duration" "$stats" <<'PY'
import sys, statistics
path, rate, duration, stats = sys.argv[1:]
rows = [l.rstrip("\n").split("\t") for l in open(path) if l.strip()]
def med(name, kind, col):
    vals = [float(r[col]) for r in rows if r[0] == name and r[1] == kind]
    return statistics.median(vals) if vals else float("nan")
print(f"## ext_authz: one worker on CPU 1; oha, upstream and sidecars on CPU 0 ({duration} s a run, medians of 2 rounds)\n")
print(f"| | off | TCP | Unix socket | TCP - off | Unix - off |")
print(f"|---|---:|---:|---:|---:|---:|")
for label, kind, col, fmt in [
    (f"p50 at {rate} req/s (us)", "rate", 3, "{:.0f}"),
    (f"p99 at {rate} req/s (us)", "rate", 4, "{:.0f}"),
    (f"mean at {rate} req/s (us)", "rate", 5, "{:.0f}"),
    ("saturation req/s", "saturation", 2, "{:.0f}"),
    ("proxy CPU s per 100k requests", "saturation", 6, "{:.3f}"),
    ("proxy busy % at saturation", "saturation", 7, "{:.0f}"),
]:
    off, tcp, uds = (med(n, kind, col) for n in ("off", "tcp", "uds"))
    diff = lambda x: ("x{:.2f}".format(x / off) if kind == "saturation" else ("+" + fmt).format(x - off))
    print(f"| {label} | {fmt.format(off)} | {fmt.format(tcp)} | {fmt.format(uds)} | {diff(tcp)} | {diff(uds)} |")
print()
print(f"Sidecar round trip alone (authz-probe on CPU 1, {rate} checks/s, no proxy): "
      + ", ".join(f"{label} p50 {med(n, 'probe', 3):.0f} us, p99 {med(n, 'probe', 4):.0f} us, mean {med(n, 'probe', 5):.0f} us"
                  for n, label in (("tcp", "TCP"), ("uds", "Unix socket"))))
for n, label in (("tcp", "TCP"), ("uds", "Unix socket")):
    added = med(n, "rate", 3) - med("off", "rate", 3)
    print(f"{label}: p50 added by the proxy's check {added:.0f} us = round trip {med(n, 'probe', 3):.0f} us + {added - med(n, 'probe', 3):.0f} us")
bad = [r for r in rows if r[8] != r[9]]
print()
print("non-200 answers: " + ("none" if not bad else ", ".join(f"{r[0]} {r[1]}: {int(r[9]) - int(r[8])}" for r in bad)))
print("proxy stats: " + " ".join(stats.split()))
PY
