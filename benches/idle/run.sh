#!/usr/bin/env bash
# Idle memory per connection, HTTP/1.1 (8900 connections) and h2c (1000), for nginx, HAProxy and
# Legate side by side (h2c also on hyper's HTTP/2 codec, `legate-hyper`), each a fresh process with one worker in front of the testbed upstream,
# configured from ../shared/bench/conf and benches/peer. Ports stay below the ephemeral range
# so that client sockets in TIME_WAIT never hold them. Needs nginx, haproxy, python3. The lines
# also go to idle-DATE.txt here, and a bar chart of them to idle-DATE.png. LEGATE_BEFORE=BINARY
# adds another build of Legate (`legate-before`), to compare a change side by side.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
conf="$repo/../shared/bench/conf"
run="$(mktemp -d /tmp/legate-idle.XXXXXX)"
cd "$repo" && cargo build --release --bin legate && cargo build --release -p testbed --bin noop-upstream
ulimit -n 20000
render() { # template listen h2c admin
  sed -e "s#{listen_port}#$2#g; s#{h2c_port}#$3#g; s#{admin_port}#$4#g; s#{upstream_port}#21081#g; s#{workers}#1#g; s#{max_conns}#9500#g; s#{nofile}#20000#g; s#{run_dir}#$run#g" "$1"
}
render "$conf/nginx.conf.tmpl" 21100 21101 0 > "$run/nginx.conf"
render "$conf/haproxy.cfg.tmpl" 21200 21201 0 > "$run/haproxy.cfg"
render "$repo/benches/peer/legate.yaml.tmpl" 21300 21301 21302 > "$run/legate.yaml"
render "$repo/benches/peer/legate-hyper-h2.yaml.tmpl" 21300 21301 21302 > "$run/legate-hyper.yaml"
"$repo/target/release/noop-upstream" --listen 127.0.0.1:21081 >/dev/null 2>&1 &
upstream=$!
trap 'kill $upstream 2>/dev/null || true' EXIT
sleep 0.5
measure() { # name h1|h2 connections
  local name=$1 proto=$2 n=$3 master pid port
  case $name in
    nginx) nginx -p "$run" -e stderr -c "$run/nginx.conf" 2>/dev/null & master=$!; sleep 1
           pid=$(pgrep -P "$master" | head -1); port=21100 ;;
    haproxy) haproxy -db -f "$run/haproxy.cfg" >/dev/null 2>&1 & master=$!; pid=$master; port=21200 ;;
    legate) "$repo/target/release/legate" -c "$run/legate.yaml" 2>/dev/null & master=$!; pid=$master; port=21300 ;;
    # hyper's HTTP/2 codec (`http.http2_codec: hyper`), to fall back on.
    legate-hyper) "$repo/target/release/legate" -c "$run/legate-hyper.yaml" 2>/dev/null & master=$!; pid=$master; port=21300 ;;
    # Another build (LEGATE_BEFORE=BINARY), to compare a change side by side.
    legate-before) "$LEGATE_BEFORE" -c "$run/legate.yaml" 2>/dev/null & master=$!; pid=$master; port=21300 ;;
  esac
  sleep 1
  if [ "$proto" = h2 ]; then port=$((port + 1)); fi
  printf '%-8s %s: ' "$name" "$proto"
  H2=$([ "$proto" = h2 ] && echo 1 || echo 0) python3 "$repo/benches/idle/idle_client.py" 127.0.0.1 "$port" "$n" "$pid"
  kill "$master"; wait "$master" 2>/dev/null || true; sleep 1
}
out="$repo/idle-$(date -u +%Y%m%d-%H%M%S).txt"
{
  before=${LEGATE_BEFORE:+legate-before}
  for name in nginx haproxy legate $before legate-hyper; do measure "$name" h2 1000; done
  for name in nginx haproxy legate $before; do measure "$name" h1 8900; done
} | tee "$out"
rm -rf "$run"
bash "$repo/benches/plot/plot.sh" idle "$out" "${out%.txt}.png"
