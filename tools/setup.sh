#!/usr/bin/env bash
# Installs every Debian package idemd needs to build, test and benchmark.
# Idempotent: does nothing (and needs no network) when everything is present.
# Usage: tools/setup.sh            (as root, or with sudo available)
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  libraft-dev liblz4-dev libuv1-dev
  libprotobuf-c-dev protobuf-c-compiler
  libssl-dev libyaml-dev libjansson-dev libxxhash-dev
  libh2o-dev
  libsystemd-dev
  libcmocka-dev
  clang libclang-rt-14-dev
  python3
  openssl
  systemd
  e2fsprogs
  python3-fusepy
  nftables
  stress-ng
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
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
