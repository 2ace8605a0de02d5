#!/usr/bin/env bash
# Handshake CPU of a listener with 10 and with 1,000 filter chains picked by SNI: the chain
# is found by a map lookup, so the cost per handshake should not grow with the chains. One
# Legate worker pinned to CPU 1; Python clients on CPU 0 make full TLS 1.3 handshakes (a new
# session each, no resumption), each with a random SNI name among the chains', and read one
# response. Prints handshakes a second and the proxy's CPU (utime+stime from /proc) per
# 1,000 handshakes, for each chain count, in turns (RUNS rounds). Loopback only, port 19201;
# everything stops by itself.
#
#   cargo build --release
#   benches/filter_chains/run.sh [HANDSHAKES_PER_RUN] [RUNS]     (from the repository root)
#   CHAINS="10 1000" (the chain counts compared), NAMES=N (the clients use the first N names only)
# Needs openssl (for the certificate), python3 and taskset.
set -euo pipefail

HANDSHAKES=${1:-4000}
RUNS=${2:-3}
LEGATE=${LEGATE:-target/release/legate}
PORT=19201
CLIENTS=4
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

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -subj "/CN=bench" -addext "subjectAltName=DNS:*.bench.test" \
    -keyout "$WORK/key.pem" -out "$WORK/cert.pem" 2>/dev/null

config() { # CHAINS
    printf 'concurrency: 1\nadmin: { enabled: false }\nlisteners:\n  - name: edge\n    address: 127.0.0.1:%s\n    chains:\n' "$PORT"
    for i in $(seq "$1"); do
        printf '      - name: c%s\n        match: { server_names: [c%s.bench.test] }\n' "$i" "$i"
        printf '        tls: { certificates: [{ cert_chain: %s, private_key: %s }] }\n' "$WORK/cert.pem" "$WORK/key.pem"
        printf '        routes: [{ match: { prefix: / }, direct_response: { status: 200, body: "c%s" } }]\n' "$i"
    done
}

cat > "$WORK/client.py" <<'PY'
import random, socket, ssl, sys
port, chains, count = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
# NAMES: how many of the chains' names the clients use (all by default).
import os
chains = min(chains, int(os.environ.get("NAMES", chains)))
ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
ctx.minimum_version = ssl.TLSVersion.TLSv1_3
for _ in range(count):
    name = f"c{random.randint(1, chains)}.bench.test"
    with socket.create_connection(("127.0.0.1", port)) as raw:
        with ctx.wrap_socket(raw, server_hostname=name) as tls:
            tls.sendall(f"GET / HTTP/1.1\r\nhost: {name}\r\nconnection: close\r\n\r\n".encode())
            answer = b""
            while chunk := tls.recv(4096):
                answer += chunk
            want = name.split(".")[0].encode()
            if not answer.startswith(b"HTTP/1.1 200") or not answer.endswith(want):
                sys.exit(f"wrong answer for {name}: {answer[:80]!r}")
PY

hz=$(getconf CLK_TCK)
printf '%-8s %-4s %12s %18s\n' chains run handshakes/s "CPU ms/1000 hs"
for run in $(seq "$RUNS"); do
    for chains in ${CHAINS:-10 1000}; do
        config "$chains" > "$WORK/legate.yaml"
        taskset -c 1 "$LEGATE" -c "$WORK/legate.yaml" 2> "$WORK/legate.log" &
        pid=$!
        PIDS+=("$pid")
        wait_port "$PORT"
        # The port opens before every chain is built: measured from "ready", and after a
        # second of idling, so start-up work is not counted.
        for _ in $(seq 600); do grep -q "legate ready" "$WORK/legate.log" && break; sleep 0.05; done
        grep -q "legate ready" "$WORK/legate.log" || { echo "legate never ready" >&2; exit 1; }
        sleep 1
        per=$((HANDSHAKES / CLIENTS))
        before=$(cpu_ticks "$pid")
        start=$(date +%s.%N)
        clients=()
        for _ in $(seq "$CLIENTS"); do
            taskset -c 0 python3 "$WORK/client.py" "$PORT" "$chains" "$per" &
            clients+=($!)
        done
        for c in "${clients[@]}"; do wait "$c"; done
        end=$(date +%s.%N)
        after=$(cpu_ticks "$pid")
        kill "$pid"
        wait "$pid" 2>/dev/null || true
        awk -v n=$((per * CLIENTS)) -v s="$start" -v e="$end" -v t=$((after - before)) -v hz="$hz" -v c="$chains" -v r="$run" \
            'BEGIN { printf "%-8s %-4s %12.0f %18.1f\n", c, r, n / (e - s), t / hz * 1000 / n * 1000 }'
    done
done
