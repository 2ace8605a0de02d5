# Sourced by the benchmark scripts that start one proxy under test themselves (per_request.sh,
# cpu_split.sh, pgo/train.sh): its config from a template and the command that runs it in the
# foreground with one worker. nginx and HAProxy use the peer bench's templates
# (../shared/bench/conf beside the repository), nginx as one process (`master_process off`:
# the master's work is not the request path's).

# proxy_setup PROXY TEMPLATE DIR PORT UPSTREAM ADMIN H2C
# PROXY is nginx, haproxy (TEMPLATE is then theirs, and ignored) or a legate binary. Writes
# DIR/proxy.conf and sets the array `proxy_command`.
proxy_setup() {
    local proxy=$1 template=$2 dir=$3 port=$4 upstream=$5 admin=$6 h2c=$7
    local peer_conf
    peer_conf="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/../shared/bench/conf"
    case "$proxy" in
        nginx) template="$peer_conf/nginx.conf.tmpl" ;;
        haproxy) template="$peer_conf/haproxy.cfg.tmpl" ;;
    esac
    sed -e "s/{listen_port}/$port/g; s/{upstream_port}/$upstream/g; s/{h2c_port}/$h2c/g" \
        -e "s/{admin_port}/$admin/g; s/{workers}/1/g; s|{run_dir}|$dir|g" \
        -e "s/{max_conns}/4096/g; s/{nofile}/16384/g" "$template" > "$dir/proxy.conf"
    case "$proxy" in
        nginx) sed -i 's/^daemon off;/daemon off;\nmaster_process off;/' "$dir/proxy.conf"
               proxy_command=(nginx -p "$dir" -e stderr -c "$dir/proxy.conf") ;;
        haproxy) proxy_command=(haproxy -db -f "$dir/proxy.conf") ;;
        *) proxy_command=("$proxy" -c "$dir/proxy.conf") ;;
    esac
}

# proxy_listening PORT...: each port takes a connection (one, closed at once).
proxy_listening() {
    local p
    for p in "$@"; do
        (exec 3<> "/dev/tcp/127.0.0.1/$p") 2> /dev/null || return 1
    done
}

# paced_script DIR [DELAY_MS]: writes DIR/paced.lua, the wrk script of the peer bench's fixed
# rate when oha is missing (each connection waits 10 ms before each request; wrk waits whole
# milliseconds only), and prints its path. DELAY_MS, if given, is another wait.
paced_script() {
    printf 'delay = function() return %d end\n' "${2:-10}" > "$1/paced.lua"
    echo "$1/paced.lua"
}

# paced_served OUTPUT: the requests wrk counted in OUTPUT, or a failure when any was not
# answered (wrk says nothing of its answers when they were all 2xx/3xx and no socket failed).
paced_served() {
    local served
    served=$(awk '/ requests in / {print $1}' "$1")
    if grep -q -e 'Non-2xx' -e 'Socket errors' "$1" || [ -z "$served" ] || [ "$served" -eq 0 ]; then
        echo "not every request succeeded:" >&2
        cat "$1" >&2
        return 1
    fi
    echo "$served"
}
