#!/usr/bin/env bash
# User and system CPU per request, side by side: each target in turn (rounds interleaved, so
# drift on the machine hits all), one worker pinned to CPU 1, h2load and the testbed upstream on
# CPU 0, a fixed number of requests (after 20,000 to warm up). Prints, per target and protocol,
# the medians over the rounds of: req/s, user and system clock ticks per 100k requests (from
# /proc/PID/stat, all threads), and, where `perf` can read the kernel's tracepoints, system
# calls per request. All traffic is on 127.0.0.1; every process is ended by its PID.
#
#   benches/peer/cpu_split.sh [-r ROUNDS] [-n REQUESTS] [-p h1,h2c] [-f RATE] [-d DELAY_MS] TARGET...
#
# TARGET: `nginx` or `haproxy` (from PATH, with the peer bench's configs in ../shared/bench/conf,
# nginx as one process) or NAME=BINARY, a legate build with benches/peer/legate.yaml.tmpl.
# HTTP/1.1 is `h2load --h1 -c 64`, h2c `h2load -c 16 -m 4` (the peer bench's h2c load).
# `-p paced` is HTTP/1.1 at a fixed rate, as the peer bench paces wrk when oha is missing: RATE
# req/s asked (-f, 17,100 by default), each of RATE x 10.5 ms connections waiting 10 ms before
# each request, for REQUESTS / RATE seconds (wrk then counts the requests). Its `wakes` column
# is epoll_wait calls per request: how many requests a wake-up serves at partial load. `-d`
# sets another wait than 10 ms: the same rate from fewer connections (a shorter wait) or more.
# PROFILE=DIR also records where each proxy's time goes (`perf record -e cpu-clock`, sampled by
# a timer, so it works without the CPU's counters) into DIR/NAME.PROTOCOL.ROUND.data, for
# `perf report -i`; the recording costs CPU of its own, so the figures of such a run are not to
# be set beside others.
# `-p tls` (legate builds only) is HTTP/2 over TLS to `BINARY demo`, `h2load -c 16 -m 4` to
# /hello: its upstream runs in the same process, so its ticks count too (an A/B of builds).
# Needs h2load (and wrk for `paced`) and a release build of noop-upstream.
set -euo pipefail
rounds=3 requests=200000 protocols=h1,h2c rate=17100 delay=10
while getopts r:n:p:f:d: opt; do
    case $opt in
        r) rounds=$OPTARG ;; n) requests=$OPTARG ;; p) protocols=$OPTARG ;; f) rate=$OPTARG ;; d) delay=$OPTARG ;;
        *) exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -gt 0 ] || { echo "usage: $0 [-r ROUNDS] [-n REQUESTS] [-p h1,h2c] [-f RATE] [-d DELAY_MS] TARGET..." >&2; exit 2; }
repo="$(cd "$(dirname "$0")/../.." && pwd)"
source "$repo/benches/peer/proxy.sh"
if [ -n "${PROFILE:-}" ]; then
    mkdir -p "$PROFILE"
    perf record -q -e cpu-clock -o /dev/null true 2> /dev/null \
        || { echo "PROFILE: perf record -e cpu-clock does not run here" >&2; exit 1; }
fi
run=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2> /dev/null || true; done; rm -rf "$run"' EXIT
case ",$protocols," in
    *,paced,*) command -v wrk > /dev/null || { echo "wrk not found (Debian: wrk)" >&2; exit 1; } ;;
esac
perf_ok= events=raw_syscalls:sys_enter
perf stat -e raw_syscalls:sys_enter -o /dev/null true 2> /dev/null && perf_ok=1
# The event loop's waits (HAProxy may use either call), where the kernel has them.
for call in epoll_wait epoll_pwait; do
    perf stat -e "syscalls:sys_enter_$call" -o /dev/null true 2> /dev/null \
        && events="$events,syscalls:sys_enter_$call"
done
# The paced load: one request per connection every DELAY_MS (wrk can only wait whole
# milliseconds; an answer takes about 0.5 ms more), for the time that many requests take at the
# rate.
paced_connections=$(( (rate * (delay * 10 + 5) + 5000) / 10000 ))
paced_seconds=$(( (requests + rate - 1) / rate ))
paced_lua=$(paced_script "$run" "$delay")

one() { # target protocol -> a line "name protocol rps user sys syscalls wakes requests"
    local target=$1 proto=$2 name template bin=
    case "$target" in
        nginx | haproxy) name=$target ;;
        *=*) name=${target%%=*} bin=${target#*=} ;;
        *) echo "a target is nginx, haproxy or NAME=BINARY: $target" >&2; exit 2 ;;
    esac
    # Below the ephemeral range (32768 up), where the load's own connections would take it.
    local port=$((20000 + RANDOM % 12000))
    local upstream=$((port + 1)) admin=$((port + 2)) h2c=$((port + 3))
    local dir="$run/$name.$proto"
    rm -rf "$dir" && mkdir -p "$dir"
    taskset -c 0 "$repo/target/release/noop-upstream" --listen "127.0.0.1:$upstream" > "$dir/upstream.out" &
    local up=$!
    pids+=("$up")
    for _ in $(seq 50); do grep -q listening "$dir/upstream.out" && break; sleep 0.1; done
    grep -q listening "$dir/upstream.out" || { echo "the upstream did not start:" >&2; cat "$dir/upstream.out" >&2; exit 1; }
    local proxy_command
    if [ "$proto" = tls ]; then
        [ -n "${bin:-}" ] || { echo "tls is measured for legate builds only, not $name" >&2; exit 2; }
        proxy_command=("$bin" demo --port "$port" --tls-port "$h2c" --admin-port "$admin" --concurrency 1)
    else
        proxy_setup "${bin:-$name}" "$repo/benches/peer/legate.yaml.tmpl" "$dir" "$port" \
            "$upstream" "$admin" "$h2c"
    fi
    taskset -c 1 "${proxy_command[@]}" > "$dir/proxy.log" 2>&1 &
    local pid=$!
    pids+=("$pid")
    local ready=
    for _ in $(seq 100); do
        if proxy_listening "$port" "$h2c"; then
            ready=1
            break
        fi
        sleep 0.1
    done
    [ -n "$ready" ] || { echo "$name did not start listening:" >&2; cat "$dir/proxy.log" >&2; exit 1; }
    local load
    if [ "$proto" = paced ]; then
        load=(wrk -t 1 -c "$paced_connections" -d "${paced_seconds}s" --timeout 5s -s "$paced_lua"
            "http://127.0.0.1:$port/")
    elif [ "$proto" = tls ]; then
        load=(h2load -t 1 -c 16 -m 4 "https://127.0.0.1:$h2c/hello")
    elif [ "$proto" = h2c ]; then
        load=(h2load -t 1 -c 16 -m 4 "http://127.0.0.1:$h2c/")
    else
        load=(h2load --h1 -t 1 -c 64 "http://127.0.0.1:$port/")
    fi
    local warm_up=("${load[@]}" -n 20000)
    [ "$proto" != paced ] || warm_up=(h2load --h1 -t 1 -c 64 -n 20000 "http://127.0.0.1:$port/")
    taskset -c 0 "${warm_up[@]}" > "$dir/warm-up" \
        || { echo "$name $proto: the warm-up failed:" >&2; cat "$dir/warm-up" >&2; exit 1; }
    local before after perf_pid= record_pid=
    before=$(awk '{print $14, $15}' "/proc/$pid/stat")
    if [ -n "$perf_ok" ]; then
        perf stat -x, -e "$events" -p "$pid" -o "$dir/perf" &
        perf_pid=$!
        sleep 0.2
    fi
    if [ -n "${PROFILE:-}" ]; then
        perf record -q -e cpu-clock -F 4999 -p "$pid" -o "$PROFILE/$name.$proto.$round.data" &
        record_pid=$!
        sleep 0.2
    fi
    local sent=$requests
    [ "$proto" = paced ] || load+=(-n "$requests")
    taskset -c 0 "${load[@]}" > "$dir/h2load"
    after=$(awk '{print $14, $15}' "/proc/$pid/stat")
    [ -z "$perf_pid" ] || { kill -INT "$perf_pid"; wait "$perf_pid" || true; }
    [ -z "$record_pid" ] || { kill -INT "$record_pid" 2> /dev/null || true; wait "$record_pid" || true; }
    kill -TERM "$pid" "$up"; wait "$pid" "$up" 2> /dev/null || true
    pids=()
    local rps syscalls=- wakes=-
    if [ "$proto" = paced ]; then
        sent=$(paced_served "$dir/h2load") || { echo "($name $proto)" >&2; exit 1; }
        rps=$(awk '/^Requests\/sec:/ {print $2}' "$dir/h2load")
    else
        grep -q "status codes: $requests 2xx" "$dir/h2load" \
            || { echo "$name $proto: not every request succeeded:" >&2; cat "$dir/h2load" >&2; exit 1; }
        rps=$(grep -o 'finished in [^,]*, [0-9.]* req/s' "$dir/h2load" | awk '{print $4}')
    fi
    # A count perf could not take ("<not counted>") is left out, not guessed.
    if [ -n "$perf_pid" ]; then
        syscalls=$(awk -F, '$3 ~ /raw_syscalls/ && $1 ~ /^[0-9]+$/ {print $1}' "$dir/perf")
        wakes=$(awk -F, '$3 ~ /sys_enter_epoll/ && $1 ~ /^[0-9]+$/ {n += $1; seen = 1}
            END {if (seen) print n}' "$dir/perf")
    fi
    echo "$name $proto $rps $before $after ${syscalls:--} ${wakes:--} $sent"
}

for round in $(seq "$rounds"); do
    for proto in ${protocols//,/ }; do
        for target in "$@"; do
            # Not in a pipeline: `one` must run in this shell, so the trap sees its PIDs.
            one "$target" "$proto" > "$run/line"
            cat "$run/line" >> "$run/lines"
            sed "s/^/round $round: /" "$run/line" >&2
        done
    done
done
python3 - "$run/lines" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, proto, rps, u0, s0, u1, s1, calls, wakes, n = line.split()
    n = int(n)
    per = 100000 / n
    rows.setdefault((proto, name), []).append(
        (float(rps), (int(u1) - int(u0)) * per, (int(s1) - int(s0)) * per,
         None if calls == "-" else int(calls) / n, None if wakes == "-" else int(wakes) / n))
print("%-6s %-16s %9s %8s %8s %8s %9s %6s" % ("", "target", "req/s", "user", "system", "total",
                                               "syscalls", "wakes"))
for (proto, name), runs in rows.items():
    med = lambda i: statistics.median(r[i] for r in runs)
    def per_request(i):
        seen = [r[i] for r in runs if r[i] is not None]
        return "%.2f" % statistics.median(seen) if seen else "-"
    print("%-6s %-16s %9.0f %8.1f %8.1f %8.1f %9s %6s" % (
        proto, name, med(0), med(1), med(2), statistics.median(r[1] + r[2] for r in runs),
        per_request(3), per_request(4)))
print("(medians of %d rounds; user, system, total: clock ticks per 100k requests, each the "
      "median of its own, so a total may differ from user + system; syscalls, and wakes "
      "(epoll_wait calls): per request)" % len(next(iter(rows.values()))))
PY
