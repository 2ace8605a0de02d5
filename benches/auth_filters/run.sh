#!/usr/bin/env bash
# What each authentication filter costs the proxy per request, against no filter: jwt_authn
# (ES256 and RS256, each without and with `jwt_cache`), rbac with 100 deny policies that the
# request must all be checked against, basic_auth, api_key_auth, ext_authz (gRPC, the
# testbed sidecar) and ext_proc (both headers, the testbed processor). Every request carries
# what its filter lets through, so each run is all 2xx.
#
# One Legate worker on CPU 1, one listener per filter; wrk, the upstream and the services
# share CPU 0. For each, interleaved over two rounds, at saturation (wrk -c 64): requests a
# second, and the proxy's CPU (utime+stime from /proc) per 100k requests, the fair figure
# when CPU 0 is the limit. With --callgrind, also the instructions the proxy executes per
# request for each (benches/callgrind/per_request.sh: two runs under valgrind, differenced).
# Loopback only; ports 21540-21559, below the ephemeral range.
#
# Needs wrk (Debian's package); --callgrind also valgrind and h2load.
#
# usage: benches/auth_filters/run.sh [--duration SECONDS] [--callgrind] [--only REGEX]
#   --only: the filters whose names match (jwt_es256, jwt_es256_cached, jwt_rs256,
#   jwt_rs256_cached, rbac_100, basic_auth, api_key_auth, ext_authz, ext_proc), beside `off`
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo"
duration=6
callgrind=false
only=.
while [ $# -gt 0 ]; do
  case "$1" in
    --duration) duration="$2"; shift 2 ;;
    --callgrind) callgrind=true; shift ;;
    --only) only="$2"; shift 2 ;;
    *) echo "usage: $0 [--duration SECONDS] [--callgrind] [--only REGEX]" >&2; exit 2 ;;
  esac
done
command -v wrk >/dev/null || { echo "wrk is not installed" >&2; exit 1; }
cargo build --release --bin legate -p legate >&2
cargo build --release -p testbed --bin noop-upstream --bin authz-sidecar --bin ext-processor >&2
dir="$(mktemp -d /tmp/legate-auth-filters.XXXXXX)"
cargo run --release -q -p legate-benches --example mint_tokens -- "$dir" >&2
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT

all=(off jwt_es256 jwt_es256_cached jwt_rs256 jwt_rs256_cached rbac_100 basic_auth api_key_auth ext_authz ext_proc)
declare -A port header
for i in "${!all[@]}"; do port[${all[$i]}]=$((21540 + i)); done
names=(off)
for name in "${all[@]:1}"; do [[ "$name" =~ $only ]] && names+=("$name"); done
upstream=21551 sidecar=21552 processor=21553 admin=21554
es256="Authorization: Bearer $(cat "$dir/es256.token")"
rs256="Authorization: Bearer $(cat "$dir/rs256.token")"
header=(
  [off]="x-bench: off" [jwt_es256]="$es256" [jwt_es256_cached]="$es256"
  [jwt_rs256]="$rs256" [jwt_rs256_cached]="$rs256" [rbac_100]="x-tenant: tenant-999"
  [basic_auth]="Authorization: Basic YWxpY2U6cGFzc3dvcmQ=" [api_key_auth]="x-api-key: k-bench"
  [ext_authz]="x-bench: authz" [ext_proc]="x-bench: ext-proc"
)

filters() { # name -> the listener's http_filters, indented for a listener
  local jwt_cache=""
  case "$1" in
    off) echo "    http_filters: []" ;;
    jwt_*)
      [[ "$1" == *_cached ]] && jwt_cache="              jwt_cache: { size: 100 }"
      cat <<YAML
    http_filters:
      - jwt_authn:
          providers:
            bench:
              issuer: https://issuer.bench
              audiences: [bench]
              local_jwks_file: $dir/jwks.json
$jwt_cache
          rules: [{ match: { prefix: / }, requires: bench }]
YAML
      ;;
    rbac_100)
      echo "    http_filters:"
      echo "      - rbac:"
      echo "          rules:"
      echo "            action: deny"
      echo "            policies:"
      for n in $(seq 1 100); do
        echo "              tenant-$n:"
        echo "                permissions: [{ and: [{ header: { name: x-tenant, exact: tenant-$n } }, { path: { prefix: /t/$n } }] }]"
        echo "                principals: [{ remote_ip: [10.$((n % 256)).0.0/16] }]"
      done
      ;;
    basic_auth)
      cat <<YAML
    http_filters:
      - basic_auth: { users: "alice:{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=" }
YAML
      ;;
    api_key_auth)
      cat <<YAML
    http_filters:
      - api_key_auth:
          credentials: [{ key: k-bench, client: bench }]
          key_sources: [{ header: x-api-key }]
YAML
      ;;
    ext_authz) echo "    http_filters: [{ ext_authz: { grpc: { address: 127.0.0.1:$sidecar } } }]" ;;
    ext_proc)
      cat <<YAML
    http_filters:
      - ext_proc:
          service: { address: 127.0.0.1:$processor }
          message_timeout: 1s
YAML
      ;;
  esac
}

{
  echo "concurrency: 1"
  echo "admin: { address: 127.0.0.1:$admin }"
  echo "listeners:"
  for name in "${names[@]}"; do
    echo "  - name: $name"
    echo "    address: 127.0.0.1:${port[$name]}"
    filters "$name"
    echo "    routes: [{ match: { prefix: / }, cluster: origin }]"
  done
  echo "clusters: [{ name: origin, endpoints: [127.0.0.1:$upstream] }]"
} > "$dir/legate.yaml"

taskset -c 0 target/release/noop-upstream --listen 127.0.0.1:$upstream >/dev/null 2>&1 &
pids+=($!)
taskset -c 0 target/release/authz-sidecar --listen 127.0.0.1:$sidecar >/dev/null 2>&1 &
pids+=($!)
taskset -c 0 target/release/ext-processor --listen 127.0.0.1:$processor >/dev/null 2>&1 &
pids+=($!)
for p in $upstream $sidecar $processor; do
  for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null && break; sleep 0.1; done
done
target/release/legate validate -c "$dir/legate.yaml" >&2
taskset -c 1 target/release/legate -c "$dir/legate.yaml" 2>"$dir/legate.log" &
proxy=$!
pids+=($proxy)
for _ in $(seq 50); do grep -q "legate ready" "$dir/legate.log" && break; sleep 0.1; done
grep -q "legate ready" "$dir/legate.log" || { cat "$dir/legate.log" >&2; exit 1; }

cpu_ticks() { awk '{print $14 + $15}' "/proc/$proxy/stat"; }
hz=$(getconf CLK_TCK)
results="$dir/results.tsv"
: > "$results"
measure() { # name
  local name=$1 before after start end out
  before=$(cpu_ticks); start=$(date +%s.%N)
  out=$(taskset -c 0 wrk -t 1 -c 64 -d "${duration}s" -H "${header[$name]}" "http://127.0.0.1:${port[$name]}/")
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
  tail -1 "$results" | awk -F'\t' '{printf "  %-17s %9.0f req/s  CPU %.3f s/100k  busy %3.0f%%  requests %d, not 2xx %d\n", $1, $2, $3, $4, $5, $6}' >&2
}
# Warm up every listener (connections to the upstream and the services; each check passes).
for name in "${names[@]}"; do
  taskset -c 0 wrk -t 1 -c 16 -d 1s -H "${header[$name]}" "http://127.0.0.1:${port[$name]}/" >/dev/null
done
reversed=()
for ((i = ${#names[@]} - 1; i >= 0; i--)); do reversed+=("${names[$i]}"); done
for round in 1 2; do
  echo "== round $round" >&2
  for name in "${names[@]}"; do measure "$name"; done
  for name in "${reversed[@]}"; do measure "$name"; done
done

instructions="$dir/instructions.tsv"
: > "$instructions"
if $callgrind; then
  kill "$proxy"; wait "$proxy" 2>/dev/null || true
  for name in "${names[@]}"; do
    {
      echo "concurrency: {workers}"
      echo "admin: { address: 127.0.0.1:{admin_port} }"
      echo "listeners:"
      echo "  - name: $name"
      echo "    address: 127.0.0.1:{listen_port}"
      filters "$name"
      echo "    routes: [{ match: { prefix: / }, cluster: origin }]"
      echo "clusters: [{ name: origin, endpoints: [127.0.0.1:{upstream_port}] }]"
    } > "$dir/$name.yaml.tmpl"
    line=$(HEADER="${header[$name]}" benches/callgrind/per_request.sh target/release/legate "$dir/$name.yaml.tmpl" 1000 5000)
    echo "  $name: $line" >&2
    printf '%s\t%s\n' "$name" "${line%% *}" >> "$instructions"
  done
fi

python3 - "$results" "$instructions" "$duration" <<'PY'
import sys, statistics
path, instr_path, duration = sys.argv[1:]
rows = [l.rstrip("\n").split("\t") for l in open(path) if l.strip()]
instr = dict(l.rstrip("\n").split("\t") for l in open(instr_path) if l.strip())
names = list(dict.fromkeys(r[0] for r in rows))
def med(name, col):
    return statistics.median(float(r[col]) for r in rows if r[0] == name)
off_cpu = med("off", 2)
print(f"## authentication filters: one worker on CPU 1; wrk, upstream and services on CPU 0 ({duration} s a run, medians of 4)\n")
cols = "| filter | req/s | proxy CPU s per 100k | µs CPU per request over none |"
line = "|---|---:|---:|---:|"
if instr:
    cols += " instructions per request | over none |"
    line += "---:|---:|"
print(cols)
print(line)
for n in names:
    cpu = med(n, 2)
    row = f"| {n} | {med(n, 1):.0f} | {cpu:.3f} | {(cpu - off_cpu) * 10:+.1f} |"
    if instr:
        i = int(instr.get(n, 0))
        row += f" {i} | {i - int(instr.get('off', 0)):+d} |"
    print(row)
bad = sum(int(r[5]) for r in rows)
print(f"\nresponses not 2xx across all runs: {bad}")
PY
