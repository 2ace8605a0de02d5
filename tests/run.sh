#!/usr/bin/env bash
# The workspace's tests on a fresh machine: installs what they need and is missing, then runs
# `cargo test --workspace` (arguments are passed on, e.g. `tests/run.sh -- --nocapture`).
set -euo pipefail
cd "$(dirname "$0")/.."

# tests/dashboard.rs drives the admin dashboard in headless Chromium (Debian's package).
if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
    echo "tests/run.sh: installing Chromium for tests/dashboard.rs" >&2
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
fi

exec cargo test --workspace "$@"
