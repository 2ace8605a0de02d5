#!/usr/bin/env bash
# Instructions the proxy executes per route change from a management server, counted by
# valgrind's callgrind: repeatable on a noisy machine, unlike the milliseconds xds-bench
# reports. Runs xds-bench twice against the proxy under callgrind (N1 and N2 flips of one
# route in a 1,001-route table beside 1,000 EDS clusters, all on 127.0.0.1) and divides the
# difference, so start-up, the initial load and the churn round cancel out.
#
#   benches/callgrind/xds_flip.sh BINARY [N1 N2]
#
# Prints the process's instructions per flip, and those of the xDS thread's handling of the
# update alone (decoding, checking, building the generation; not the workers' switch).
# Needs valgrind and a release build of xds-bench
# (cargo build --release -p testbed --bin xds-bench).
set -euo pipefail
bin=$(realpath "$1") n1=${2:-10} n2=${3:-30}
repo="$(cd "$(dirname "$0")/../.." && pwd)"
run=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$run"' EXIT
# xds-bench ends the proxy with SIGKILL, which callgrind cannot write its counts through: the
# proxy runs beside a shell that xds-bench kills, and is ended here with SIGTERM.
cat > "$run/proxy.sh" <<EOF
#!/usr/bin/env bash
valgrind --tool=callgrind --callgrind-out-file="$run/cg.\$FLIPS" "$bin" "\$@" 2>"$run/valgrind.\$FLIPS" &
echo \$! > "$run/pid.\$FLIPS"
wait
EOF
chmod +x "$run/proxy.sh"

count() { # flips -> "total apply" instructions
    FLIPS=$1 "$repo/target/release/xds-bench" --proxy legate --binary "$run/proxy.sh" \
        --flips 2 --big-flips "$1" --churn-rounds 1 > "$run/bench.$1" 2>&1 \
        || { echo "xds-bench failed:" >&2; cat "$run/bench.$1" >&2; exit 1; }
    grep -q "route flip in a" "$run/bench.$1" \
        || { echo "no route flips measured:" >&2; cat "$run/bench.$1" >&2; exit 1; }
    local pid
    pid=$(cat "$run/pid.$1")
    kill -TERM "$pid"
    while kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
    local total apply
    total=$(grep -m1 '^summary:\|^totals:' "$run/cg.$1" | awk '{print $2}')
    apply=$(callgrind_annotate --inclusive=yes --threshold=100 "$run/cg.$1" 2>/dev/null \
        | grep -F 'as xds_client::Handler>::apply::{{closure}}' | grep -v '=>' \
        | awk '{gsub(",", "", $1); v = $1 + 0; if (v > max) max = v} END {printf "%d\n", max}')
    echo "$total $apply"
}
read -r total1 apply1 < <(count "$n1")
read -r total2 apply2 < <(count "$n2")
flips=$((n2 - n1))
echo "$(( (total2 - total1) / flips )) instructions per route flip ($bin), $(( (apply2 - apply1) / flips )) of them the xDS thread's handling of the update"
[ -z "${KEEP:-}" ] || echo "callgrind outputs kept in $run"
