#!/usr/bin/env bash
# Draws a benchmark's picture with plot.py, installing matplotlib with pip when it is missing:
#   benches/plot/plot.sh peer|idle INPUT OUT.png
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python3 -c "import matplotlib" 2>/dev/null ||
    python3 -m pip install --quiet --disable-pip-version-check matplotlib==3.11.2
python3 "$here/plot.py" "$@"
echo "picture: $3"
