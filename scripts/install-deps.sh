#!/usr/bin/env bash
# Installs the Debian packages cairn builds and runs with, only those missing.
# Uses sudo when not root. Safe to run repeatedly.
set -euo pipefail

packages=(
  build-essential clang-15 cmake pkg-config help2man
  libsqlite3-dev libsqlitecpp-dev nlohmann-json3-dev libboost1.81-dev libboost-url1.81-dev
  catch2 bubblewrap libseccomp-dev libcli11-dev libfmt-dev
  libssl-dev libzstd-dev libarchive-dev ca-certificates e2fsprogs fuse2fs fuse3
  procps util-linux sqlite3
  # make deb (CPack reads shared library dependencies with dpkg-shlibdeps) and its test in a clean root
  dpkg-dev mmdebstrap
  python3 python3-venv python3-setuptools python3-mypy
  libpq-dev postgresql-15
  qemu-system-x86 busybox-static cpio
  # make test-sanitize and make fuzz: libFuzzer and the sanitizers' runtimes
  # (Debian 12 has them here; clang-15 depends on it), llvm-symbolizer for
  # their reports' file and line.
  libclang-common-15-dev llvm-15
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
# The tests start private PostgreSQL clusters of their own: the package's
# system service must not start (policy-rc.d refuses it during this install).
policy=""
if [[ " ${missing[*]} " == *" postgresql-15 "* && ! -e /usr/sbin/policy-rc.d ]]; then
  policy=/usr/sbin/policy-rc.d
  printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
  $sudo chmod 755 "$policy"
fi
status=0
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" || status=$?
[ -n "$policy" ] && $sudo rm -f "$policy"
exit $status
