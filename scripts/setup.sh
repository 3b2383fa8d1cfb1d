#!/usr/bin/env bash
# Installs what building zero.cpp needs on Debian 12 when any of it is missing (apt-get; root or sudo),
# and says in one line what is installed. Extra package names given as arguments are installed too
# (scripts/train.sh adds a downloader on a machine that has none).
#   scripts/setup.sh [PACKAGE...]
set -euo pipefail
packages=(build-essential cmake libeigen3-dev libopenmpi-dev openmpi-bin libgtest-dev libgmock-dev
          libbenchmark-dev nlohmann-json3-dev libcli11-dev libfmt-dev python3 "$@")
missing=()
for p in "${packages[@]}"; do
  # dpkg -s also succeeds for removed-but-configured packages; only "install ok installed" counts.
  [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} Debian packages zero.cpp needs are installed (${packages[*]})"
  exit 0
fi
command -v apt-get >/dev/null ||
  { echo "setup: missing ${missing[*]} and no apt-get here: install them (Debian names) by hand" >&2; exit 1; }
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null ||
    { echo "setup: missing ${missing[*]}; run as root or install sudo: apt-get install ${missing[*]}" >&2; exit 1; }
  sudo_cmd=(sudo)
fi
echo "setup: installing ${missing[*]} with apt-get"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! { "${sudo_cmd[@]}" apt-get update -qq &&
       "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
         "${missing[@]}"; } >"$log" 2>&1; then
  tail -n 20 "$log" >&2
  echo "setup: apt-get could not install ${missing[*]} (output above)" >&2
  exit 1
fi
