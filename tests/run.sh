#!/usr/bin/env bash
# The workspace's tests on a fresh machine: installs what they need and is missing, then runs
# `cargo test --workspace` (arguments are passed on, e.g. `tests/run.sh -- --nocapture`).
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian's packages: Chromium (tests/dashboard.rs drives the admin dashboard headless) and
# Redis (tests/global_rate_limit.rs runs Envoy's rate limit service on it).
missing=()
command -v chromium >/dev/null || command -v chromium-browser >/dev/null || missing+=(chromium)
command -v redis-server >/dev/null || missing+=(redis-server)
if [ ${#missing[@]} -gt 0 ]; then
    echo "tests/run.sh: installing ${missing[*]}" >&2
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# aioquic (PyPI, pinned): the HTTP/3 client of tests/http3.rs.
if ! python3 -c 'import aioquic' 2>/dev/null; then
    echo "tests/run.sh: installing aioquic" >&2
    python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore aioquic==1.7.2
fi

# envoyproxy/ratelimit (a Go module, pinned) for tests/global_rate_limit.rs, built once into
# target/tools. Without Go, or if it does not build, that test says so and skips.
ratelimit_version=v1.4.1-0.20260122083618-3fb702589d36
if [ -z "${RATELIMIT_BIN:-}" ] && command -v go >/dev/null; then
    tools="$PWD/target/tools"
    if [ ! -x "$tools/service_cmd" ]; then
        echo "tests/run.sh: building envoyproxy/ratelimit $ratelimit_version" >&2
        GOBIN="$tools" go install \
            "github.com/envoyproxy/ratelimit/src/service_cmd@$ratelimit_version" ||
            echo "tests/run.sh: envoyproxy/ratelimit did not build; its test will skip" >&2
    fi
    if [ -x "$tools/service_cmd" ]; then
        export RATELIMIT_BIN="$tools/service_cmd"
    fi
fi

exec cargo test --workspace "$@"
