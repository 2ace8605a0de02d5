#!/usr/bin/env bash
# HTTP/3 against HTTP/2 over TLS on Legate itself, side by side in one run: the same listener
# (TLS 1.3, ECDSA P-256, `http3: {}`) in front of the testbed upstream, one worker pinned to
# CPU 1, the client (h3load: quinn + h3 for HTTP/3, hyper + rustls for HTTP/2, one loop, one
# core) and the upstream on CPU 0. Debian 12's nginx is 1.22, and HTTP/3 came to nginx in
# 1.25: there is no nginx HTTP/3 here to measure against.
#
# Measured, the protocols taking turns (h3, h2, then h2, h3, ...) for --rounds rounds; medians:
#   saturation   -c 8 -m 16 for DURATION: requests a second, and the proxy's CPU (utime+stime
#                from /proc) per 100k requests
#   fixed rate   --rate RATE -c 8 -m 16 (each request timed from when it was due): p50, p99,
#                p99.9 and CPU per 100k
#   handshakes   --handshakes -c 16 (a new connection, full handshake, for each request, which
#                the proxy answers itself): handshakes a second and CPU per 1000
#   idle         IDLE connections opened, one request each, then held: the RSS growth per
#                connection of a proxy started fresh for each measurement (after 50 to warm
#                it), the protocols in turn, median of --rounds
#
# usage: benches/http3/run.sh [--duration SECONDS] [--rate PER_SECOND] [--rounds N] [--idle N]
#                             [--idle-only] [--keep]
#   LEGATE=path (default target/release/legate)  UPSTREAM=path (target/release/noop-upstream)
#   H3LOAD=path (target/release/h3load)
# The binaries are not built here: cargo build --release --bin legate &&
# cargo build --release -p testbed --bin noop-upstream --bin h3load. Needs openssl, taskset and two CPUs. Loopback only;
# ports 21701-21703.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo"

die() { echo "error: $*" >&2; exit 1; }

LEGATE=${LEGATE:-target/release/legate}
UPSTREAM=${UPSTREAM:-target/release/noop-upstream}
H3LOAD=${H3LOAD:-target/release/h3load}
duration=8
rate=4000
rounds=3
idle=1000
keep=0
idle_only=0
while [ $# -gt 0 ]; do
  case $1 in
    --duration) duration=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --idle) idle=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    --idle-only) idle_only=1; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d;s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1" ;;
  esac
done
for n in "$duration" "$rate" "$rounds" "$idle"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || die "numbers above 0 only, not $n"
done
for tool in openssl taskset ss awk python3; do
  command -v "$tool" >/dev/null || die "$tool is not installed"
done
[ "$(nproc --all)" -ge 2 ] || die "needs two CPUs"
for bin in "$LEGATE" "$UPSTREAM" "$H3LOAD"; do
  [ -x "$bin" ] || die "no $bin: cargo build --release --bin legate && cargo build --release -p testbed --bin noop-upstream --bin h3load"
done

UP_PORT=21701
PORT=21702
ADMIN_PORT=21703
for port in $UP_PORT $PORT $ADMIN_PORT; do
  [ -z "$(ss -Htuln "sport = :$port" 2>/dev/null)" ] || die "port $port is in use (another run?)"
done

run="$(mktemp -d /tmp/legate-h3.XXXXXX)"
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ "$keep" = 1 ]; then echo "kept $run"; else rm -rf "$run"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
ulimit -n 20000 2>/dev/null || ulimit -n "$(ulimit -Hn)"
taskset -pc 0 $$ >/dev/null

# A P-256 leaf for localhost, signed by a CA made here.
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$run/ca.key" 2>/dev/null
openssl req -x509 -new -key "$run/ca.key" -sha256 -days 2 -subj "/CN=Legate HTTP3 bench CA" \
  -addext "basicConstraints=critical,CA:TRUE" -out "$run/ca.pem" 2>/dev/null
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$run/leaf.key" 2>/dev/null
openssl req -new -key "$run/leaf.key" -subj "/CN=localhost" -out "$run/leaf.csr" 2>/dev/null
printf '%s\n' "subjectAltName=DNS:localhost,IP:127.0.0.1" >"$run/leaf.ext"
openssl x509 -req -in "$run/leaf.csr" -CA "$run/ca.pem" -CAkey "$run/ca.key" -CAcreateserial \
  -sha256 -days 2 -extfile "$run/leaf.ext" -out "$run/leaf.pem" 2>/dev/null

cat >"$run/legate.yaml" <<EOF
concurrency: 1
drain_timeout: 1s
admin: { address: 127.0.0.1:$ADMIN_PORT }
listeners:
  - name: https
    address: 127.0.0.1:$PORT
    tls:
      certificates: [{ cert_chain: $run/leaf.pem, private_key: $run/leaf.key }]
    http3: {}
    http:
      max_concurrent_streams: 128
    routes:
      - match: { path: /hs }
        direct_response: { status: 200, body: "ok\n" }
      - match: { prefix: / }
        cluster: origin
clusters:
  - name: origin
    endpoints: [127.0.0.1:$UP_PORT]
EOF

"$UPSTREAM" --listen "127.0.0.1:$UP_PORT" >"$run/upstream.log" 2>&1 &
pids+=($!)
cp "$LEGATE" "$run/legate"
legate_pid=""
start_legate() {
  : >"$run/legate.log"
  taskset -c 1 "$run/legate" --config "$run/legate.yaml" >"$run/legate.log" 2>&1 &
  legate_pid=$!
  pids+=($legate_pid)
  for _ in $(seq 100); do
    grep -q "legate ready" "$run/legate.log" 2>/dev/null && break
    sleep 0.1
  done
  grep -q "legate ready" "$run/legate.log" || { cat "$run/legate.log"; die "legate did not start"; }
}
stop_legate() {
  kill "$legate_pid" 2>/dev/null || true
  wait "$legate_pid" 2>/dev/null || true
}
start_legate

cpu() { awk '{print $14 + $15}' "/proc/$legate_pid/stat"; }
rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$legate_pid/status"; }
ticks=$(getconf CLK_TCK)
field() { python3 -c "import json,sys; print(json.loads(sys.argv[1])['$1'])" "$2"; }

# One measurement: prints "per_second cpu_per_unit p50 p99 p999" (cpu per 100k requests, or
# per 1000 for handshakes).
measure() { # proto unit args...
  local proto=$1 unit=$2; shift 2
  local before after out
  before=$(cpu)
  out=$("$H3LOAD" "127.0.0.1:$PORT" --proto "$proto" --server-name localhost "$@" 2>>"$run/h3load.log")
  after=$(cpu)
  local answered failed
  answered=$(field answered "$out")
  failed=$(field failed "$out")
  [ "$failed" = 0 ] && [ "$(field not_2xx "$out")" = 0 ] || die "$proto $*: $failed failed: $out"
  [ "$answered" -gt 0 ] || die "$proto $*: nothing answered"
  awk -v b="$before" -v a="$after" -v n="$answered" -v t="$ticks" -v u="$unit" \
    -v r="$(field per_second "$out")" -v p50="$(field p50_us "$out")" \
    -v p99="$(field p99_us "$out")" -v p999="$(field p999_us "$out")" \
    'BEGIN { printf "%.0f %.3f %s %s %s\n", r, (a - b) / t / n * u, p50, p99, p999 }'
}

echo "# checks: both protocols answer through the proxy"
for proto in h3 h2; do
  measure "$proto" 100000 -c 1 -m 1 --duration 1 >/dev/null
done

declare -A results
order=(h3 h2)
[ "$idle_only" = 1 ] && rounds_load=0 || rounds_load=$rounds
for round in $(seq "$rounds_load"); do
  for proto in "${order[@]}"; do
    results[sat_$proto]+="$(measure "$proto" 100000 -c 8 -m 16 --duration "$duration")"$'\n'
    results[fixed_$proto]+="$(measure "$proto" 100000 -c 8 -m 16 --rate "$rate" --duration "$duration")"$'\n'
    results[hs_$proto]+="$(measure "$proto" 1000 -c 16 --handshakes --path /hs --duration "$duration")"$'\n'
  done
  order=("${order[1]}" "${order[0]}")
  echo "# round $round done"
done

median() { # column: median of that column over the rounds
  sort -g -k"$1","$1" | awk -v c="$1" '{v[NR] = $c} END {print v[int((NR + 1) / 2)]}'
}
echo
echo "| measure | HTTP/3 | HTTP/2 over TLS | h3 / h2 |"
echo "|---|---:|---:|---:|"
row() { # name key column
  local h3 h2
  h3=$(printf '%s' "${results[$2_h3]}" | median "$3")
  h2=$(printf '%s' "${results[$2_h2]}" | median "$3")
  awk -v n="$1" -v a="$h3" -v b="$h2" 'BEGIN { printf "| %s | %s | %s | %.2fx |\n", n, a, b, (b > 0 ? a / b : 0) }'
}
if [ "$idle_only" = 0 ]; then
  row "saturation, requests/s (-c 8 -m 16)" sat 1
  row "saturation, proxy CPU s / 100k" sat 2
  row "fixed $rate/s, proxy CPU s / 100k" fixed 2
  row "fixed $rate/s, p50 µs" fixed 3
  row "fixed $rate/s, p99 µs" fixed 4
  row "fixed $rate/s, p99.9 µs" fixed 5
  row "full handshakes/s (-c 16, one request each)" hs 1
  row "proxy CPU s / 1000 handshakes" hs 2
fi

# Idle: RSS growth per connection held, on a proxy started for it (memory freed by earlier
# work would take new connections without growing RSS); the first connections' growth
# (pools, tables) is taken out by a warm-up of 50 first.
idle_bytes() { # proto
  "$H3LOAD" "127.0.0.1:$PORT" --proto "$1" --server-name localhost -c 50 --idle --duration 1 \
    >/dev/null 2>>"$run/h3load.log"
  sleep 1
  local before after fifo="$run/idle-$1" pid
  before=$(rss_kib)
  rm -f "$fifo"
  "$H3LOAD" "127.0.0.1:$PORT" --proto "$1" --server-name localhost -c "$idle" --idle \
    --duration 30 >/dev/null 2>"$fifo" &
  pid=$!
  for _ in $(seq 600); do
    grep -q "ready" "$fifo" 2>/dev/null && break
    sleep 0.1
  done
  grep -q "ready: $idle connections" "$fifo" || { kill "$pid"; die "idle $1: $(cat "$fifo")"; }
  sleep 2
  after=$(rss_kib)
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  awk -v a="$after" -v b="$before" -v n="$idle" 'BEGIN { printf "%.0f", (a - b) * 1024 / n }'
}
order=(h3 h2)
for round in $(seq "$rounds"); do
  for proto in "${order[@]}"; do
    stop_legate
    start_legate
    results[idle_$proto]+="$(idle_bytes "$proto")"$'\n'
  done
  order=("${order[1]}" "${order[0]}")
done
row "bytes per idle connection ($idle held, RSS)" idle 1
