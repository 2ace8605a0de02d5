#!/usr/bin/env bash
# TCP relay throughput and CPU: Legate's tcp_proxy beside HAProxy (mode tcp) and nginx
# (stream), one worker each pinned to CPU 1, the client and the sink on CPU 0. Each proxy
# relays SIZE_MIB from a client (socat reading /dev/zero) to a sink (socat writing
# /dev/null), RUNS times; prints wall time, MiB/s and the proxy's CPU seconds per GiB.
# Everything is on 127.0.0.1 and stops by itself.
#
#   cargo build --release
#   apt-get install -y haproxy nginx libnginx-mod-stream socat
#   benches/tcp_proxy/run.sh [SIZE_MIB] [RUNS]      (from the repository root)
set -euo pipefail

SIZE_MIB=${1:-2048}
RUNS=${2:-3}
LEGATE=${LEGATE:-target/release/legate}
SINK_PORT=19100
PROXY_PORT=19101
WORK=$(mktemp -d)
PIDS=()

cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

wait_port() {
    for _ in $(seq 200); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.05
    done
    echo "port $1 never opened" >&2
    return 1
}

# One way (-u): the sink never ends its side first (nginx closes both ways when it does).
taskset -c 0 socat -u -b 65536 "TCP-LISTEN:$SINK_PORT,bind=127.0.0.1,reuseaddr,fork" OPEN:/dev/null &
PIDS+=($!)
wait_port "$SINK_PORT"

cat > "$WORK/legate.yaml" <<EOF
concurrency: 1
listeners:
  - name: relay
    address: 127.0.0.1:$PROXY_PORT
    tcp_proxy: { cluster: sink }
clusters:
  - name: sink
    endpoints: [127.0.0.1:$SINK_PORT]
EOF
cat > "$WORK/haproxy.cfg" <<EOF
global
    nbthread 1
defaults
    mode tcp
    timeout connect 5s
    timeout client 1h
    timeout server 1h
listen relay
    bind 127.0.0.1:$PROXY_PORT
    server sink 127.0.0.1:$SINK_PORT
EOF
cat > "$WORK/nginx.conf" <<EOF
load_module /usr/lib/nginx/modules/ngx_stream_module.so;
user root;
worker_processes 1;
daemon off;
pid $WORK/nginx.pid;
error_log $WORK/nginx.err;
events { worker_connections 1024; }
stream {
    server {
        listen 127.0.0.1:$PROXY_PORT;
        proxy_pass 127.0.0.1:$SINK_PORT;
    }
}
EOF

echo "| proxy | run | MiB | seconds | MiB/s | proxy CPU s/GiB |"
echo "|---|---|---|---|---|---|"
for proxy in legate haproxy nginx; do
    case $proxy in
        legate) taskset -c 1 "$LEGATE" -c "$WORK/legate.yaml" 2>"$WORK/legate.err" & ;;
        haproxy) taskset -c 1 haproxy -f "$WORK/haproxy.cfg" 2>"$WORK/haproxy.err" & ;;
        nginx) taskset -c 1 nginx -c "$WORK/nginx.conf" 2>"$WORK/nginx.out" & ;;
    esac
    launcher=$!
    PIDS+=("$launcher")
    wait_port "$PROXY_PORT"
    # nginx's worker is a child of its master: measure the worker.
    pid=$launcher
    if [ "$proxy" = nginx ]; then
        pid=$(pgrep -P "$launcher" | head -1)
    fi
    hz=$(getconf CLK_TCK)
    for run in $(seq "$RUNS"); do
        before=$(cpu_ticks "$pid")
        start=$(date +%s.%N)
        head -c "$((SIZE_MIB * 1024 * 1024))" /dev/zero |
            taskset -c 0 socat -b 65536 -u - "TCP:127.0.0.1:$PROXY_PORT"
        end=$(date +%s.%N)
        after=$(cpu_ticks "$pid")
        awk -v p="$proxy" -v r="$run" -v m="$SIZE_MIB" -v s="$start" -v e="$end" \
            -v c="$((after - before))" -v hz="$hz" 'BEGIN {
                t = e - s
                printf "| %s | %d | %d | %.2f | %.0f | %.2f |\n", p, r, m, t, m / t, (c / hz) / (m / 1024)
            }'
    done
    kill "$launcher"
    wait "$launcher" 2>/dev/null || true
    # The port is free again before the next proxy binds it.
    for _ in $(seq 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$PROXY_PORT") 2>/dev/null || break
        sleep 0.05
    done
done
