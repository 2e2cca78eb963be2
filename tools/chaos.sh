#!/usr/bin/env bash
# The chaos suite: a three-node cluster under concurrent load while nodes are killed, paused,
# partitioned, wiped, re-membered and power-cut; every answer is checked against the
# contract (tests/chaos/chaos.py, docs/chaos.md). Needs root (network namespaces, FUSE, loop
# devices). Builds build/ first (configured on first use) unless IDEM_BIN_DIR names the binaries.
#   tools/chaos.sh [--duration S] [--seed N] [--nemesis LIST] [--workers N] [--keys N]
#                  [--policy takeover|conflict] [--out DIR]
# Exit status: 0 no violation; 1 violations (seed and history path printed); 2 the run could
# not be made; 77 this machine cannot run it.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${IDEM_BIN_DIR:-}" ]; then
  if [ ! -f build/CMakeCache.txt ]; then
    tools/setup.sh --test
    cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  fi
  cmake --build build -j "$(nproc)" >/dev/null
  export IDEM_BIN_DIR="$PWD/build/bin"
fi
# Debian's python3: the power-cut disk's FUSE layer uses its python3-fusepy.
exec /usr/bin/python3 tests/chaos/chaos.py "$@"
