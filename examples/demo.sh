#!/usr/bin/env bash
# `make demo`: runs real agents in bwrap sandboxes, crashes one, kills the host
# process of another with SIGKILL mid-run, and resumes it from the journal.
set -euo pipefail

build="${1:-build}"
cairn="$build/cli/cairn"
# True when every folder from / down to $1 may be entered by other users.
others_may_enter() {
  local d="$1" perms
  while [ "$d" != "/" ]; do
    perms="$(stat -c %A "$d")"
    [[ "${perms:9:1}" == [xt] ]] || return 1
    d="$(dirname "$d")"
  done
}

if [ -z "${CAIRN_HOME:-}" ]; then
  CAIRN_HOME="$PWD/.cairn"
  # As root, sandboxes run as an unprivileged uid that must reach the workspaces.
  if [ "$(id -u)" -eq 0 ] && ! others_may_enter "$PWD"; then
    CAIRN_HOME="/var/tmp/cairn-demo"
    echo "note: $PWD is closed to other users, so the demo keeps its journal in $CAIRN_HOME"
  fi
fi
export CAIRN_HOME
tag="$(date +%H%M%S)"

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
show() { printf '$ %s\n' "$*"; "$@"; }

step "Can this machine sandbox agents?"
show "$cairn" doctor

step "A research agent: plans, runs commands in its sandbox, writes a report into /workspace"
show "$cairn" run "$build/examples/research_agent" --input '{"topic":"sqlite wal"}' --id "research-$tag"
show "$cairn" show "research-$tag"
echo "--- the report it wrote, collected from its workspace on the host:"
head -n 12 "$CAIRN_HOME/workspaces/research-$tag/report.md"

step "A flaky agent: its first attempt aborts mid-run; cairn retries it from the journal"
show "$cairn" run "$build/examples/flaky_agent" --id "flaky-$tag"
echo "--- what really executed (batches 1-2 ran once, before the crash):"
cat "$CAIRN_HOME/workspaces/flaky-$tag/progress.log"

step "Kill -9 the host process mid-run, then resume"
out="$(mktemp)"
"$cairn" run "$build/examples/research_agent" --input '{"topic":"durable agent workflows","pace_ms":400}' \
  --id "killed-$tag" >"$out" 2>&1 &
host=$!
for _ in $(seq 1 100); do
  [ "$(grep -c ' ok ' "$out" || true)" -ge 2 ] && break
  sleep 0.1
done
cat "$out"
echo "\$ kill -9 $host   # the cairn host process, with the agent mid-step"
kill -9 "$host"
wait "$host" 2>/dev/null || true
rm -f "$out"
show "$cairn" ls
show "$cairn" resume --all
show "$cairn" show "killed-$tag"
