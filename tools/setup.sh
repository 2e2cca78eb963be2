#!/usr/bin/env bash
# Installs the Debian packages idemd needs. Idempotent: does nothing, prints nothing and
# needs no network when everything is present.
# Usage: tools/setup.sh          what it takes to build and run idemd (tools/quickstart.sh)
#        tools/setup.sh --test   that, and what the tests need too (tools/test.sh, CI)
# As root, or with sudo available.
set -euo pipefail

usage() { sed -n '4,6p' "$0" | sed 's/^# //'; }
tests=0
for arg in "$@"; do
  case "$arg" in
    --test) tests=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "setup: unknown argument $arg" >&2; usage >&2; exit 2 ;;
  esac
done

# Building and running. Every build compiles the unit tests too, so cmocka is needed here
# (CMakeLists.txt requires it); lowdown renders the man pages (without it they are left
# out); openssl makes tools/quickstart.sh --tls's certificates; systemd runs the unit.
packages=(
  build-essential cmake pkg-config git
  libraft-dev liblz4-dev libuv1-dev
  libisal-dev
  libprotobuf-c-dev protobuf-c-compiler
  libssl-dev libyaml-dev libjansson-dev libxxhash-dev
  libh2o-dev
  libsystemd-dev
  libcmocka-dev
  lowdown
  openssl
  systemd
)

# The tests only (each names what it uses).
test_packages=(
  python3                       # the integration, chaos and lint tests; tools/test.sh
  python3-yaml                  # test_kubernetes.py, test_monitoring.py, openapi_check.py
  python3-jsonschema            # docs/openapi.yaml checked against the gateway (openapi_check.py)
  clang libclang-rt-14-dev      # tools/test.sh's clang build and its libFuzzer targets
  e2fsprogs python3-fusepy      # stalled and power-cut disks (test_stalled_disk.py, chaos)
  iproute2 nftables             # the chaos suite's network (tests/chaos/net.py)
  stress-ng                     # a loaded machine (test_tls_bench.py)
  groff-base                    # the man pages rendered (test_install.py)
  prometheus                    # promtool (test_monitoring.py: the alert rules)
  golang-go                     # the Go client's tests (client/go; tests/client/go_unit.sh)
)
if [ "$tests" = 1 ]; then
  packages+=("${test_packages[@]}")
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "setup: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup: need root (or sudo) to install packages" >&2; exit 1; }
  sudo_cmd=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
# Only promtool is wanted from the prometheus package: on a host run by systemd, its
# package starts a Prometheus server (port 9090); stop it and keep it from starting again.
if [[ " ${missing[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
  "${sudo_cmd[@]}" systemctl disable --now prometheus.service >/dev/null 2>&1 || true
fi
