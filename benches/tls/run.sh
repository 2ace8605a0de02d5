#!/usr/bin/env bash
# TLS termination, nginx and Legate side by side on this machine: full and resumed handshakes a
# second, and keep-alive requests a second over HTTP/1.1 and over HTTP/2 (ALPN h2), each with an
# ECDSA P-256 and an RSA 2048 certificate made at run time (a CA, and a leaf for localhost and
# 127.0.0.1 signed by it). One worker each (nginx `worker_processes 1`, `legate --concurrency 1`)
# pinned to CPU 1, in front of the testbed upstream; the load generators and the upstream run on
# CPU 0. nginx and Legate take turns test by test (the order alternates), so drift on the machine
# hits both. Beside each rate goes the proxy's CPU (utime+stime from /proc, master and workers)
# per 1000 handshakes or per 100k requests: on two cores the client side is often the bottleneck,
# so CPU per operation is the fair comparison, and the table marks every run where the proxy was
# under 90% busy (client-bound). Loopback only; ports 21601-21622, below the ephemeral range.
#
# Tools (all h2load, TLS 1.3 with the client's first choice TLS_AES_128_GCM_SHA256 and X25519;
# each connection of a handshake test carries one `GET /hs` answered by the proxy itself, then
# `connection: close`):
#   full handshakes     `h2load --h1 -c 200 -n 200` over and over, two loops at a time: every
#                       client is new and connects once, so it has no session to resume
#   resumed handshakes  `h2load --h1 -c 16 -n 3200` over and over, two loops at a time: each client
#                       reconnects 200 times offering the session (ticket) it holds; its first
#                       connection is a full handshake (1 in 200)
#   HTTP/1.1 keep-alive `h2load --h1 -c 32 -D DURATION` GET / through the proxy to the upstream
#   HTTP/2 keep-alive   `h2load -c 8 -m 16 -D DURATION` likewise, ALPN h2
# Why so: one client core (OpenSSL 3.0) makes about 1600 full handshakes a second this way, twice
# what four parallel `openssl s_time -new` manage; wrk and oha with `connection: close`, and
# h2load's own reconnects, always resume (they keep the session), so only fresh h2load clients give
# full handshakes; and `h2load -D` never ends once the server closes connections, hence the loops.
# Nothing is taken on trust: before measuring, each proxy must pass curl (chain and name checked,
# HTTP/1.1 and h2), openssl s_client (ALPN h2, ticket resumption with -sess_out/-sess_in, TLS 1.3
# and 1.2) and openssl s_time (-new never resumes, -reuse always does, counted per connection on
# the client); nginx also logs $ssl_session_reused for the very h2load commands above, and for
# Legate each run reads ssl_handshake / ssl_session_reused / ssl_alpn from its admin stats. Every
# run checks h2load's TLS version, ALPN and status codes.
#
# usage: benches/tls/run.sh [--only nginx|legate] [--duration SECONDS] [--keep]
#   --only       one proxy (the table then has its column only)
#   --duration   seconds per measurement (default 8; plus 1 s warm-up); whole run about 3 min
#   --keep       keep the temp dir (configs, certificates, logs, results.tsv)
#   LEGATE=path  (default target/release/legate)  UPSTREAM=path (default target/release/noop-upstream)
# The binaries are not built here: cargo build --release --bin legate &&
# cargo build --release -p testbed --bin noop-upstream. Needs nginx (1.22 or later), openssl 3,
# h2load (nghttp2), curl, taskset and two CPUs.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo"

usage() { sed -n '/^# usage:/,/^# h2load (nghttp2)/s/^# \{0,1\}//p' "$0"; }
die() { echo "error: $*" >&2; exit 1; }

LEGATE=${LEGATE:-target/release/legate}
UPSTREAM=${UPSTREAM:-target/release/noop-upstream}
duration=${DURATION:-8}
warmup=1
only=""
keep=0
while [ $# -gt 0 ]; do
  case $1 in
    --only) [ $# -ge 2 ] || die "--only needs nginx or legate"; only=$2; shift 2 ;;
    --only=*) only=${1#--only=}; shift ;;
    --duration) [ $# -ge 2 ] || die "--duration needs seconds"; duration=$2; shift 2 ;;
    --duration=*) duration=${1#--duration=}; shift ;;
    --keep) keep=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument $1" ;;
  esac
done
case $only in
  "") proxies=(nginx legate) ;;
  nginx | legate) proxies=("$only") ;;
  *) die "--only takes nginx or legate, not $only" ;;
esac
[[ $duration =~ ^[1-9][0-9]*$ ]] || die "--duration takes whole seconds, not $duration"
for tool in openssl h2load curl taskset pgrep ss awk; do
  command -v "$tool" >/dev/null || die "$tool is not installed"
done
[[ " ${proxies[*]} " == *" nginx "* ]] && { command -v nginx >/dev/null || die "nginx is not installed"; }
[ "$(nproc --all)" -ge 2 ] || die "needs two CPUs (proxy on CPU 1, client on CPU 0)"
[ -x "$UPSTREAM" ] || die "no upstream at $UPSTREAM: cargo build --release -p testbed --bin noop-upstream"
if [[ " ${proxies[*]} " == *" legate "* ]]; then
  [ -x "$LEGATE" ] || die "no legate at $LEGATE: cargo build --release --bin legate (or set LEGATE, or --only nginx)"
fi

UP_PORT=21601
NGINX_PORT=21610
LEGATE_PORT=21620
ADMIN_PORT=21622
for port in $UP_PORT $NGINX_PORT $LEGATE_PORT $ADMIN_PORT; do
  [ -z "$(ss -Hltn "sport = :$port" 2>/dev/null)" ] || die "port $port is in use (another run?)"
done

run="$(mktemp -d /tmp/legate-tls.XXXXXX)"
pids=()
forget() { local p keep_=(); for p in "${pids[@]}"; do [ "$p" = "$1" ] || keep_+=("$p"); done; pids=("${keep_[@]}"); }
stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; forget "$1"; }
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ "$keep" = 1 ]; then echo "kept $run"; else rm -rf "$run"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
ulimit -n 20000 2>/dev/null || ulimit -n "$(ulimit -Hn)"
# Everything this script starts runs on CPU 0 unless started with taskset -c 1 (the proxies).
taskset -pc 0 $$ >/dev/null

# A copy, so that a rebuild during the run cannot swap the binary between certificates.
legate_bin=""
if [[ " ${proxies[*]} " == *" legate "* ]]; then
  cp "$LEGATE" "$run/legate"
  legate_bin="$run/legate"
fi

log="$run/commands.log"
quiet() { "$@" >>"$log" 2>&1 || { echo "failed: $*" >&2; tail -20 "$log" >&2; return 1; }; }

# --- certificates -------------------------------------------------------------------------
make_cert() { # kind: ecdsa | rsa -> $run/KIND/{ca.pem,leaf.pem,leaf.key}
  local d="$run/$1" alg ku=digitalSignature
  case $1 in
    ecdsa) alg=(-algorithm EC -pkeyopt ec_paramgen_curve:P-256) ;;
    rsa) alg=(-algorithm RSA -pkeyopt rsa_keygen_bits:2048) ku=digitalSignature,keyEncipherment ;;
  esac
  mkdir -p "$d"
  quiet openssl genpkey "${alg[@]}" -out "$d/ca.key"
  quiet openssl req -x509 -new -key "$d/ca.key" -sha256 -days 2 -subj "/CN=Legate TLS bench CA ($1)" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" -out "$d/ca.pem"
  quiet openssl genpkey "${alg[@]}" -out "$d/leaf.key" # PKCS#8
  quiet openssl req -new -key "$d/leaf.key" -subj "/CN=localhost" -out "$d/leaf.csr"
  printf '%s\n' "basicConstraints=critical,CA:FALSE" "keyUsage=critical,$ku" "extendedKeyUsage=serverAuth" \
    "subjectAltName=DNS:localhost,IP:127.0.0.1" >"$d/leaf.ext"
  quiet openssl x509 -req -in "$d/leaf.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial -sha256 \
    -days 2 -extfile "$d/leaf.ext" -out "$d/leaf.pem"
  quiet openssl verify -CAfile "$d/ca.pem" "$d/leaf.pem"
}

# --- configs ------------------------------------------------------------------------------
# /hs is answered by the proxy itself (the handshake tests); / goes to the upstream. nginx 1.22
# has no `http2 on` (1.25.1), hence `listen ... ssl http2`. /hs-log logs $ssl_session_reused and
# is used only to check the tools before measuring.
nginx_conf() { # kind
  local d="$run/nginx"
  mkdir -p "$d"
  cat <<EOF
daemon off;
worker_processes 1;
worker_rlimit_nofile 20000;
pid $d/nginx-$1.pid;
error_log $d/error-$1.log warn;
events { worker_connections 10000; }
http {
    access_log off;
    server_tokens off;
    keepalive_timeout 300s;
    keepalive_requests 1000000;      # no forced reconnects (HTTP/1.1 and h2)
    client_body_temp_path $d/body;
    proxy_temp_path $d/proxy;
    fastcgi_temp_path $d/fastcgi;
    uwsgi_temp_path $d/uwsgi;
    scgi_temp_path $d/scgi;
    log_format reuse '\$ssl_session_reused \$ssl_protocol \$server_protocol';

    ssl_certificate $run/$1/leaf.pem;
    ssl_certificate_key $run/$1/leaf.key;
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_session_tickets on;
    ssl_session_cache shared:SSL:10m;

    upstream origin {
        server 127.0.0.1:$UP_PORT;
        keepalive 128;
        keepalive_requests 1000000;
        keepalive_timeout 300s;
    }
    server {
        listen 127.0.0.1:$NGINX_PORT ssl http2 backlog=4096;
        location / {
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
        location = /hs { return 200 "ok\n"; }
        location = /hs-log { access_log $d/reuse.log reuse; return 200 "ok\n"; }
    }
}
EOF
}

legate_conf() { # kind
  cat <<EOF
concurrency: 1
drain_timeout: 1s
admin: { address: 127.0.0.1:$ADMIN_PORT }
listeners:
  - name: https
    address: 127.0.0.1:$LEGATE_PORT
    tls:
      certificates:
        - cert_chain: $run/$1/leaf.pem
          private_key: $run/$1/leaf.key
      # alpn [h2, http/1.1], session tickets and cache: the defaults
    routes:
      - match: { path: /hs }
        direct_response: { status: 200, body: "ok\n" }
      - match: { prefix: / }
        cluster: origin
clusters:
  - name: origin
    lb_policy: round_robin
    endpoints: [127.0.0.1:$UP_PORT]
    protocol: http1
    connect_timeout: 1s
EOF
}

# --- processes ----------------------------------------------------------------------------
wait_for_line() { # file pattern pid seconds
  local i
  for ((i = 0; i < $4 * 10; i++)); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    kill -0 "$3" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
wait_https() { # port kind pid: a TLS request answered 200, within 10 s
  local i
  for ((i = 0; i < 100; i++)); do
    kill -0 "$3" 2>/dev/null || return 1
    [ "$(curl -s -o /dev/null -w '%{http_code}' --cacert "$run/$2/ca.pem" \
      --resolve "localhost:$1:127.0.0.1" "https://localhost:$1/hs" || true)" = 200 ] && return 0
    sleep 0.1
  done
  return 1
}

declare -A proxy_pid proxy_port=([nginx]=$NGINX_PORT [legate]=$LEGATE_PORT)

start_proxy() { # name kind
  local conf out="$run/$1-$2.log" pid
  case $1 in
    nginx)
      conf="$run/nginx-$2.conf"
      nginx_conf "$2" >"$conf"
      quiet nginx -t -q -p "$run/nginx" -e stderr -c "$conf"
      taskset -c 1 nginx -p "$run/nginx" -e stderr -c "$conf" 2>>"$out" &
      pid=$!
      ;;
    legate)
      conf="$run/legate-$2.yaml"
      legate_conf "$2" >"$conf"
      "$legate_bin" validate -c "$conf" >>"$out" 2>&1 || { cat "$out" >&2; die "legate rejects $conf"; }
      taskset -c 1 "$legate_bin" -c "$conf" --concurrency 1 2>>"$out" &
      pid=$!
      pids+=("$pid")
      wait_for_line "$out" "legate ready" "$pid" 15 || { cat "$out" >&2; die "legate did not get ready"; }
      ;;
  esac
  [[ " ${pids[*]} " == *" $pid "* ]] || pids+=("$pid")
  proxy_pid[$1]=$pid
  wait_https "${proxy_port[$1]}" "$2" "$pid" || { cat "$out" >&2; die "$1 does not answer https://localhost:${proxy_port[$1]}/hs"; }
}

# --- sampling -----------------------------------------------------------------------------
proc_ticks() { # pid: utime+stime of it and its children (nginx master and worker), clock ticks
  local p f t=0
  for p in "$1" $(pgrep -P "$1" || true); do
    f=$(cat "/proc/$p/stat" 2>/dev/null) || continue
    f=${f##*) }
    set -- $f
    t=$((t + ${12} + ${13}))
  done
  echo "$t"
}
core_ticks() { # cpu -> "busy total" from /proc/stat
  awk -v c="cpu$1" '$1 == c { b = $2 + $3 + $4 + $7 + $8 + $9; print b, b + $5 + $6 }' /proc/stat
}
legate_stats() { # -> "handshakes resumed alpn_h2 alpn_h1" (merged over workers)
  curl -s --max-time 5 "http://127.0.0.1:$ADMIN_PORT/stats?filter=%5Essl_" | awk '
    /worker=/ { next }
    { v = $NF }
    /^ssl_handshake[{:]/ { hs += v }
    /^ssl_session_reused[{:]/ { re += v }
    /^ssl_alpn[{]/ && /protocol="h2"/ { h2 += v }
    /^ssl_alpn[{]/ && /protocol="http\/1.1"/ { h1 += v }
    END { print hs + 0, re + 0, h2 + 0, h1 + 0 }'
}

# --- load ---------------------------------------------------------------------------------
# h2load's summary -> "ok bad tls cipher kx alpn"; ok = 2xx responses, bad = the rest of -n/-D.
h2load_summary() {
  awk '
    /^requests:/ { total = $2 }
    /^status codes:/ { ok = $3 }
    /^TLS Protocol:/ { tls = $3 }
    /^Cipher:/ { cipher = $2 }
    /^Server Temp Key:/ { kx = $4 }
    /^Application protocol:/ { alpn = $3 }
    END {
      bad = total - ok # -n: the requests asked for; -D: those done (errors and non-2xx included)
      printf "%d %d %s %s %s %s\n", ok, bad, tls ? tls : "-", cipher ? cipher : "-", kx ? kx : "-", alpn ? alpn : "-"
    }'
}
hs_loop() { # seconds port clients requests out: repeat one h2load until the time is up
  local end=$(($(date +%s%N) + $1 * 1000000000)) ok=0 bad=0 runs=0 s last="0 0 - - - -"
  while [ "$(date +%s%N)" -lt "$end" ]; do
    s=$(timeout 60 h2load --h1 -H 'connection: close' -c "$3" -n "$4" --connect-to="127.0.0.1:$2" \
      "https://localhost:$2/hs" 2>&1 | h2load_summary) || true
    set -- "$1" "$2" "$3" "$4" "$5" $s
    [ "$6" -gt 0 ] 2>/dev/null || set -- "$1" "$2" "$3" "$4" "$5" 0 "$4" - - - -
    ok=$((ok + $6)) bad=$((bad + $7)) runs=$((runs + 1)) last="$8 $9 ${10} ${11}"
  done
  echo "$ok $bad $runs $last" >"$5"
}
# One test, printing "ok bad full_handshakes_by_client tls cipher kx alpn".
load() { # test seconds port
  local a b s
  case $1 in
    full | resumed)
      local clients=200 requests=200
      [ "$1" = resumed ] && clients=16 requests=3200
      hs_loop "$2" "$3" $clients $requests "$run/loop.a" & a=$!
      hs_loop "$2" "$3" $clients $requests "$run/loop.b" & b=$!
      pids+=("$a" "$b")
      wait "$a" "$b" || true
      forget "$a"; forget "$b"
      cat "$run/loop.a" "$run/loop.b" | awk -v c=$clients -v full="$1" '
        { ok += $1; bad += $2; runs += $3; tls = $4; cipher = $5; kx = $6; alpn = $7 }
        END { print ok, bad, (full == "full" ? ok : runs * c), tls, cipher, kx, alpn }'
      ;;
    h1) s=$(timeout $(($2 + 30)) h2load --h1 -c 32 -D "$2" --connect-to="127.0.0.1:$3" \
          "https://localhost:$3/" 2>&1 | h2load_summary) || true
        set -- $s; echo "$1 $2 - $3 $4 $5 $6" ;;
    h2) s=$(timeout $(($2 + 30)) h2load -c 8 -m 16 -D "$2" --connect-to="127.0.0.1:$3" \
          "https://localhost:$3/" 2>&1 | h2load_summary) || true
        set -- $s; echo "$1 $2 - $3 $4 $5 $6" ;;
  esac
}

clk=$(getconf CLK_TCK)
declare -A test_name=([full]="full handshakes" [resumed]="resumed handshakes" [h1]="HTTP/1.1 keep-alive" [h2]="HTTP/2 keep-alive")
declare -A test_alpn=([full]=http/1.1 [resumed]=http/1.1 [h1]=http/1.1 [h2]=h2)

measure() { # proxy kind test
  local proxy=$1 kind=$2 test=$3 port=${proxy_port[$1]} pid=${proxy_pid[$1]}
  local c0 c1 b0 t0 b1 t1 p0 q0 p1 q1 w0 w1 s0="" s1="" res notes=""
  load "$test" "$warmup" "$port" >/dev/null
  [ "$proxy" = legate ] && s0=$(legate_stats)
  read -r b0 t0 < <(core_ticks 0); read -r p0 q0 < <(core_ticks 1)
  c0=$(proc_ticks "$pid"); w0=$(date +%s%N)
  res=$(load "$test" "$duration" "$port")
  w1=$(date +%s%N); c1=$(proc_ticks "$pid")
  read -r b1 t1 < <(core_ticks 0); read -r p1 q1 < <(core_ticks 1)
  [ "$proxy" = legate ] && s1=$(legate_stats)
  kill -0 "$pid" 2>/dev/null || die "$proxy exited during $test ($kind); see $run/$proxy-$kind.log (--keep)"
  set -- $res # ok bad client_full tls cipher kx alpn
  local ok=$1 bad=$2 cfull=$3 tls=$4 cipher=$5 kx=$6 alpn=$7
  [ "$alpn" = "${test_alpn[$test]}" ] || notes+=" ALPN=$alpn(expected ${test_alpn[$test]})"
  [ "$tls" = TLSv1.3 ] || notes+=" TLS=$tls"
  [ "$bad" -eq 0 ] || notes+=" errors=$bad"
  if [ "$proxy" = legate ]; then
    read -r h r a2 a1 <<<"$(paste -d' ' <(echo "$s1") <(echo "$s0") | awk '{print $1-$5, $2-$6, $3-$7, $4-$8}')"
    case $test in
      full | resumed) notes+=" server:handshakes=$h,resumed=$r" ;;
      *) notes+=" server:alpn_h2=$a2,alpn_http/1.1=$a1" ;;
    esac
    if [ "$test" = full ] && [ "$r" -gt 0 ]; then notes+=" UNEXPECTED-RESUMPTION"; fi
    if [[ $test == full || $test == resumed ]] && [ "$h" -eq 0 ]; then notes+=" NO-SSL-STATS"; fi
    if [ "$test" = resumed ] && [ "$h" -gt 0 ] && [ $((r * 100 / h)) -lt 95 ]; then notes+=" LOW-RESUMPTION"; fi
  fi
  [ "$test" = resumed ] && notes+=" client_full_handshakes<=$cfull"
  printf '%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n' "$kind" "$test" "$proxy" "$ok" "$bad" \
    $((w1 - w0)) $((c1 - c0)) $((b1 - b0)) $((t1 - t0)) $((p1 - p0)) $((q1 - q0)) "$cipher" "$kx" "${notes# }" \
    >>"$run/results.tsv"
  tail -1 "$run/results.tsv" | awk -F'\t' -v clk="$clk" '{
      secs = $6 / 1e9; cpu = $7 / clk; per = ($2 ~ /full|resumed/) ? 1000 : 100000
      unit = (per == 1000) ? "s/1k hs " : "s/100k rq"
      printf "  %-6s %-8s %9.0f/s  CPU %6.3f %s  proxy busy %3d%%  CPU0 %3.0f%%  CPU1 %3.0f%%  %s %s %s\n",
        $3, $2, $4 / secs, $4 ? cpu * per / $4 : 0, unit, int(100 * cpu / secs),
        $9 ? 100 * $8 / $9 : 0, $11 ? 100 * $10 / $11 : 0, $12, $13, $14 }'
}

# --- checks before measuring --------------------------------------------------------------
check() { # description result: "ok", or what went wrong (fatal)
  if [ "$2" = ok ]; then printf '    ok   %s\n' "$1"; else printf '    FAIL %s: %s\n' "$1" "$2"; die "check failed: $1"; fi
}
warn_check() { # description result: like check, but only reported
  if [ "$2" = ok ]; then printf '    ok   %s\n' "$1"; else printf '    WARN %s: %s\n' "$1" "$2"; fi
}
s_time_markers() { # s_time output -> "resumed total": one character per connection, r = resumed
  grep -E '^[rt3*]+$' | tr -d '\n' | awk '{ n = length($0); r = gsub(/r/, ""); print r + 0, n + 0 } END { if (NR == 0) print 0, 0 }'
}
verify_proxy() { # proxy kind
  local proxy=$1 kind=$2 port=${proxy_port[$1]} ca="$run/$2/ca.pem" out v r n m
  local curl_=(curl -sS --cacert "$ca" --resolve "localhost:$port:127.0.0.1" --max-time 10)
  echo "  $proxy, $kind:"
  : >"$run/body"
  v=$("${curl_[@]}" --http1.1 -o "$run/body" -w '%{http_version} %{http_code}' "https://localhost:$port/" 2>&1 || true)
  [ "$v" = "1.1 200" ] && [ "$(wc -c <"$run/body")" -eq 100 ] && r=ok || r="got '$v', $(wc -c <"$run/body") bytes"
  check "curl https://localhost (chain and name verified), HTTP/1.1, 100-byte body from the upstream" "$r"
  : >"$run/body"
  v=$(curl -sS --cacert "$ca" --max-time 10 --http2 -o "$run/body" -w '%{http_version} %{http_code}' "https://127.0.0.1:$port/" 2>&1 || true)
  [ "$v" = "2 200" ] && [ "$(wc -c <"$run/body")" -eq 100 ] && r=ok || r="got '$v'"
  check "curl https://127.0.0.1 (IP SAN verified), ALPN h2, 100-byte body" "$r"
  out=$(timeout 10 openssl s_client -connect "127.0.0.1:$port" -servername localhost -CAfile "$ca" \
    -verify_hostname localhost -verify_return_error -alpn h2,http/1.1 </dev/null 2>&1 | tr -d '\0' || true)
  v=$(awk '/^ALPN protocol:/ { a = $3 } /^Peer signature type:/ { s = $4 } /^Server Temp Key:/ { k = $4 }
    /^New, / { p = $2 } /Verify return code: 0 / { ok = 1 }
    END { v = sprintf("%s %s %s %s %s", ok ? "verified" : "unverified", p, a, s, k); gsub(/,/, "", v); print v }' <<<"$out")
  [[ $v == "verified TLSv1.3 h2 "* ]] && r=ok || r="$v"
  check "openssl s_client: TLS 1.3, ALPN h2 (offered h2,http/1.1), chain verified [${v#verified }]" "$r"
  local t
  for t in -tls1_3 -tls1_2; do
    rm -f "$run/sess"
    out=$(printf 'GET /hs HTTP/1.0\r\nHost: localhost\r\n\r\n' | timeout 10 openssl s_client -connect "127.0.0.1:$port" \
      -servername localhost -CAfile "$ca" -alpn http/1.1 $t -sess_out "$run/sess" -ign_eof 2>&1 || true)
    n=$(grep -c "^Post-Handshake New Session Ticket" <<<"$out" || true)
    out=$(printf 'GET /hs HTTP/1.0\r\nHost: localhost\r\n\r\n' | timeout 10 openssl s_client -connect "127.0.0.1:$port" \
      -servername localhost -CAfile "$ca" -alpn http/1.1 $t -sess_in "$run/sess" -ign_eof 2>&1 || true)
    v=$(grep -m1 -E "^(New|Reused), " <<<"$out" | cut -d, -f1,2)
    m=$(grep -c "^Post-Handshake New Session Ticket" <<<"$out" || true)
    [[ $v == "Reused, "* ]] && r=ok || r="second connection: '$v'"
    if [ "$t" = -tls1_3 ]; then
      check "openssl s_client -sess_out / -sess_in: TLS 1.3 session resumed (tickets sent: $n after a full handshake, $m after a resumed one)" "$r"
    else # not measured here, so only reported
      warn_check "openssl s_client -sess_out / -sess_in: TLS 1.2 session resumed" "$r"
    fi
  done
  read -r r n < <(timeout 10 openssl s_time -connect "127.0.0.1:$port" -new -time 1 -www /hs 2>&1 | s_time_markers)
  [ "$n" -gt 0 ] && [ "$r" -eq 0 ] && v=ok || v="$r of $n resumed"
  check "openssl s_time -new: $r of $n connections resumed" "$v"
  read -r r n < <(timeout 10 openssl s_time -connect "127.0.0.1:$port" -reuse -time 1 -www /hs 2>&1 | s_time_markers)
  [ "$n" -gt 0 ] && [ "$r" -eq "$n" ] && v=ok || v="$r of $n resumed"
  check "openssl s_time -reuse: $r of $n connections resumed" "$v"
}
# The measuring commands, run once against nginx's /hs-log: nginx itself says which connections
# resumed and which protocol each request used.
verify_tools_nginx() {
  echo "  the h2load commands, checked in nginx's log (\$ssl_session_reused, \$server_protocol):"
  local f="$run/nginx/reuse.log" v r base=(--connect-to="127.0.0.1:$NGINX_PORT" "https://localhost:$NGINX_PORT/hs-log")
  tally() { sleep 0.2; awk '{ n++; if ($1 == "r") r++; p[$2 " " $3]++ } END { printf "%d %d", n, r; for (k in p) printf " [%s]", k }' "$f"; }
  : >"$f"; h2load --h1 -H 'connection: close' -c 200 -n 200 "${base[@]}" >/dev/null 2>&1 || true
  v=$(tally); [[ $v == "200 0 [TLSv1.3 HTTP/1.1]" ]] && r=ok || r="$v"
  check "nginx log: the full-handshake h2load (-c 200 -n 200): 200 connections, 0 resumed" "$r"
  : >"$f"; h2load --h1 -H 'connection: close' -c 16 -n 3200 "${base[@]}" >/dev/null 2>&1 || true
  v=$(tally); [[ $v == "3200 3184 [TLSv1.3 HTTP/1.1]" ]] && r=ok || r="$v"
  check "nginx log: the resumed-handshake h2load (-c 16 -n 3200): 3184 of 3200 resumed" "$r"
  : >"$f"; h2load --h1 -c 32 -n 3200 "${base[@]}" >/dev/null 2>&1 || true
  v=$(tally); [[ $v == "3200 0 [TLSv1.3 HTTP/1.1]" ]] && r=ok || r="$v"
  check "nginx log: the HTTP/1.1 keep-alive h2load: 3200 requests over HTTP/1.1" "$r"
  : >"$f"; h2load -c 8 -m 16 -n 3200 "${base[@]}" >/dev/null 2>&1 || true
  v=$(tally); [[ $v == "3200 0 [TLSv1.3 HTTP/2.0]" ]] && r=ok || r="$v"
  check "nginx log: the HTTP/2 keep-alive h2load: 3200 requests over HTTP/2" "$r"
  : >"$f"
}

# --- run ----------------------------------------------------------------------------------
echo "TLS termination: ${proxies[*]}; ${duration} s a test; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc --all) CPUs"
[[ " ${proxies[*]} " == *" nginx "* ]] && echo "  $(nginx -v 2>&1 | sed 's/^nginx version: //') ($(nginx -V 2>&1 | grep -o 'running with OpenSSL [0-9.]*' || nginx -V 2>&1 | grep -o 'built with OpenSSL [0-9.]*'))"
[ -n "$legate_bin" ] && echo "  $("$legate_bin" --version) ($LEGATE)"
echo "  client: $(h2load --version | head -1), $(openssl version | cut -d' ' -f1-2)"
taskset -c 0 "$UPSTREAM" --listen "127.0.0.1:$UP_PORT" >"$run/upstream.log" 2>&1 &
pids+=($!)
wait_for_line "$run/upstream.log" "listening" $! 10 || { cat "$run/upstream.log" >&2; die "the upstream did not start"; }
: >"$run/results.tsv"
tests=(full resumed h1 h2)
for kind in ecdsa rsa; do
  make_cert "$kind"
  echo "== $kind: leaf $(openssl x509 -in "$run/$kind/leaf.pem" -noout -text | awk '
    /Public Key Algorithm:/ { a = $NF } /Public-Key:/ { b = $2 " " $3 } /NIST CURVE:/ { c = " " $3 }
    END { printf "%s %s%s", a, b, c }'), signed by a CA of the same kind; checks"
  for proxy in "${proxies[@]}"; do
    start_proxy "$proxy" "$kind"
    verify_proxy "$proxy" "$kind"
  done
  [[ " ${proxies[*]} " == *" nginx "* ]] && verify_tools_nginx
  echo "== $kind: measurements"
  i=0
  for test in "${tests[@]}"; do
    order=("${proxies[@]}")
    if [ $((i % 2)) = 1 ] && [ ${#proxies[@]} = 2 ]; then order=("${proxies[1]}" "${proxies[0]}"); fi
    for proxy in "${order[@]}"; do measure "$proxy" "$kind" "$test"; done
    i=$((i + 1))
  done
  for proxy in "${proxies[@]}"; do stop "${proxy_pid[$proxy]}"; done
done

# --- table --------------------------------------------------------------------------------
echo
echo "## TLS termination, one worker on CPU 1, client and upstream on CPU 0 (${duration} s a test)"
echo
awk -F'\t' -v clk="$clk" -v cols="${proxies[*]}" '
  BEGIN {
    names["full"] = "full handshakes/s (CPU s per 1k)"; names["resumed"] = "resumed handshakes/s (CPU s per 1k)"
    names["h1"] = "HTTP/1.1 keep-alive req/s (CPU s per 100k)"; names["h2"] = "HTTP/2 keep-alive req/s (CPU s per 100k)"
    split("full resumed h1 h2", tests, " "); split("ecdsa rsa", kinds, " ")
    certs["ecdsa"] = "ECDSA P-256"; certs["rsa"] = "RSA 2048"
    both = (cols == "nginx legate")
  }
  {
    k = $1 SUBSEP $2 SUBSEP $3; secs = $6 / 1e9; cpu = $7 / clk; per = ($2 ~ /full|resumed/) ? 1000 : 100000
    seen[k] = 1; rate[k] = $4 / secs; cpuop[k] = $4 ? cpu * per / $4 : 0; busy[k] = 100 * cpu / secs; bad[k] = $5
    other[k] = ($11 ? 100 * $10 / $11 : 0) - busy[k] # CPU 1 busy with something else than the proxy
  }
  function cell_rate(k) { return seen[k] ? sprintf("%.0f%s", rate[k], bad[k] ? sprintf(" (%d errors)", bad[k]) : "") : "-" }
  function cell_busy(k) {
    if (!seen[k]) return "-"
    return sprintf("%d%%%s%s", int(busy[k]), busy[k] < 90 ? " client-bound" : "", other[k] > 10 ? sprintf(" (noisy: CPU 1 +%d%% other)", other[k]) : "")
  }
  function ratio(a, b) { return (a > 0 && b > 0) ? sprintf("%.2f", a / b) : "-" }
  END {
    print "| measurement | cert | nginx | Legate | Legate/nginx | nginx CPU/op | Legate CPU/op | Legate/nginx CPU | nginx busy | Legate busy |"
    print "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    for (i = 1; i <= 4; i++) for (j = 1; j <= 2; j++) {
      t = tests[i]; c = kinds[j]; n = c SUBSEP t SUBSEP "nginx"; l = c SUBSEP t SUBSEP "legate"
      printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", names[t], certs[c],
        cell_rate(n), cell_rate(l), ratio(rate[l], rate[n]),
        seen[n] ? sprintf("%.3f", cpuop[n]) : "-", seen[l] ? sprintf("%.3f", cpuop[l]) : "-", ratio(cpuop[l], cpuop[n]),
        cell_busy(n), cell_busy(l)
    }
  }' "$run/results.tsv"
echo
echo "CPU/op: the proxy's utime+stime (all its processes or threads) per 1000 handshakes or per 100k"
echo "requests, over the same window as the rate. \"client-bound\": the proxy was under 90% busy, so the"
echo "rate says more about the client on CPU 0 than about the proxy; compare CPU/op there. Legate/nginx"
echo "CPU under 1 means Legate spends less per operation. Each handshake carries one GET answered by the"
echo "proxy; keep-alive requests go through to the upstream (100-byte body). \"noisy\": something else"
echo "used CPU 1 during the run (/proc/stat, beyond the proxy's own time): run again on a quiet machine."
