#!/usr/bin/env bash
# Installs cairn into a fresh prefix, builds the out-of-tree agent in
# examples/external against it with find_package(cairn), and runs it with the
# installed `cairn`.
set -euo pipefail
build="$1"
source_dir="$2"
work="$(mktemp -d)"
chmod 755 "$work"  # the sandbox uid must be able to enter the workspace
trap 'rm -rf "$work"' EXIT

cmake --install "$build" --prefix "$work/prefix" >/dev/null
test -x "$work/prefix/bin/cairn"
test -f "$work/prefix/include/cairn/cairn.hpp"

cmake -S "$source_dir/examples/external" -B "$work/agent" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/agent" >/dev/null

cd "$work"
out="$("$work/prefix/bin/cairn" run "$work/agent/my_agent" --input '{"name":"installer"}' --id ext --json)"
echo "$out"
echo "$out" | grep -q '"status": "completed"'
grep -qx "hello, installer" "$work/.cairn/workspaces/ext/greeting.txt"
echo "installed SDK and CLI work from an outside project"
