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
# The Python SDK sandboxes are given carries its bytecode (a sandbox cannot write it).
for module in "$work/prefix/share/cairn/sdk/python/cairn/"*.py; do
  name="$(basename "$module" .py)"
  if ! compgen -G "$work/prefix/share/cairn/sdk/python/cairn/__pycache__/$name.cpython-*.pyc" >/dev/null; then
    echo "the installed Python SDK has no bytecode for $name" >&2
    exit 1
  fi
done

cmake -S "$source_dir/examples/external" -B "$work/agent" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/agent" >/dev/null

cd "$work"
out="$("$work/prefix/bin/cairn" run "$work/agent/my_agent" --input '{"name":"installer"}' --id ext --json)"
echo "$out"
echo "$out" | grep -q '"status": "completed"'
grep -qx "hello, installer" "$work/.cairn/workspaces/ext/greeting.txt"

# The agent is static-pie: no dynamic loader, no shared library to load at
# each start, its addresses still randomized; unless its target asks for the
# shared runtime (CAIRN_DYNAMIC_RUNTIME).
needs_libstdcxx() { readelf -d "$1" | grep -q 'NEEDED.*libstdc++'; }
if readelf -d "$work/agent/my_agent" | grep -q NEEDED || readelf -l "$work/agent/my_agent" | grep -q INTERP ||
  ! readelf -h "$work/agent/my_agent" | grep -q 'DYN (Position-Independent Executable'; then
  echo "my_agent is not a static position-independent executable; the SDK should link it so:" >&2
  readelf -hld "$work/agent/my_agent" >&2
  exit 1
fi
mkdir "$work/dynamic"
cat > "$work/dynamic/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.25)
project(dynamic_agent LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 20)
find_package(cairn REQUIRED)
add_executable(dynamic_agent $source_dir/examples/external/main.cpp)
target_link_libraries(dynamic_agent PRIVATE cairn::sdk)
set_target_properties(dynamic_agent PROPERTIES CAIRN_DYNAMIC_RUNTIME ON)
EOF
cmake -S "$work/dynamic" -B "$work/dynamic/build" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/dynamic/build" >/dev/null
if ! needs_libstdcxx "$work/dynamic/build/dynamic_agent"; then
  echo "dynamic_agent (CAIRN_DYNAMIC_RUNTIME ON) does not load libstdc++.so" >&2
  exit 1
fi
"$work/prefix/bin/cairn" run "$work/dynamic/build/dynamic_agent" --input '{"name":"shared"}' --id dyn --json |
  grep -q '"status": "completed"'
# The installed cairn says its version, as the package does: find_package(cairn 0.1) takes it, a
# project that needs another minor version is told it cannot.
version="$("$work/prefix/bin/cairn" --version --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["cairn"])')"
grep -q "^project(cairn VERSION $version " "$source_dir/CMakeLists.txt"
next_minor="$(echo "$version" | cut -d. -f1).$(( $(echo "$version" | cut -d. -f2) + 1 ))"
mkdir "$work/newer"
cat > "$work/newer/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.25)
project(newer LANGUAGES CXX)
find_package(cairn $next_minor REQUIRED)
EOF
if cmake -S "$work/newer" -B "$work/newer/build" -DCMAKE_PREFIX_PATH="$work/prefix" >"$work/newer.log" 2>&1; then
  echo "find_package(cairn) accepted version $version for a project that asks for $next_minor" >&2
  exit 1
fi
grep -q "version: $version" "$work/newer.log"
# The service: its unit, system user and config are installed, and the unit is one systemd
# accepts (systemd-analyze verify, with the unit pointed at this prefix's files).
for file in lib/systemd/system/cairn.service lib/sysusers.d/cairn.conf etc/cairn/cairn.toml share/doc/cairn/README.md; do
  test -f "$work/prefix/$file" || { echo "not installed: $file" >&2; exit 1; }
done
if command -v systemd-analyze >/dev/null; then
  configured_prefix="$(sed -n 's|^ExecStart=\(.*\)/bin/cairn .*|\1|p' "$work/prefix/lib/systemd/system/cairn.service")"
  mkdir "$work/unit"
  sed "s|$configured_prefix/|$work/prefix/|g" "$work/prefix/lib/systemd/system/cairn.service" >"$work/unit/cairn.service"
  systemd-analyze verify "$work/unit/cairn.service"
  # The config file it names is one cairn serve reads.
  "$work/prefix/bin/cairn" --config "$work/prefix/etc/cairn/cairn.toml" serve --help >/dev/null
fi
# The man pages, cairn(1) and one per subcommand, are installed and show every option their
# --help names (packaging/: they are written from it).
render_man() {
  if command -v man >/dev/null; then
    man -l "$1"
  else
    zcat "$1" | groff -man -Tutf8 -P-cbou  # -P-cbou: plain text, without bold or underline
  fi
}
for sub in "" serve; do
  page="$work/prefix/share/man/man1/cairn${sub:+-$sub}.1.gz"
  test -f "$page" || { echo "not installed: ${page#"$work/prefix/"}" >&2; exit 1; }
  rendered="$(render_man "$page")"
  for option in $("$work/prefix/bin/cairn" $sub --help | grep -o -- '--[a-z][a-z-]*' | sort -u); do
    if ! grep -q -- "$option" <<<"$rendered"; then
      echo "man page ${page##*/} does not show $option, which \`cairn $sub --help\` names:" >&2
      echo "$rendered" >&2
      exit 1
    fi
  done
done
# The bash completion completes subcommands, their options and a file where one is asked for.
completions() {  # the words of a command line, the last the one being completed
  bash -c 'source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _cairn; printf "%s\n" "${COMPREPLY[@]}"' \
    completion "$work/prefix/share/bash-completion/completions/cairn" "$@"
}
expect_completion() {  # the completion expected, then the command line
  local expected="$1" offered
  shift
  # Taken whole first: `completions | grep -q` under pipefail fails whenever
  # grep stops reading before bash has written its last line (SIGPIPE).
  offered="$(completions "$@")"
  if ! grep -qx -- "$expected" <<<"$offered"; then
    echo "bash completion of '$*' does not offer $expected; it offers:" >&2
    echo "$offered" >&2
    exit 1
  fi
}
expect_completion serve cairn se
expect_completion --max-concurrent cairn serve --max
touch "$work/policy.toml"
expect_completion "$work/policy.toml" cairn run --policy "$work/pol"
# The zsh completion is installed, and is zsh if zsh is here to say.
zsh_completion="$work/prefix/share/zsh/vendor-completions/_cairn"
test -f "$zsh_completion" || { echo "not installed: share/zsh/vendor-completions/_cairn" >&2; exit 1; }
if command -v zsh >/dev/null; then
  zsh -n "$zsh_completion"
fi
echo "installed SDK and CLI work from an outside project"
