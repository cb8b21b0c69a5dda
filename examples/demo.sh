#!/usr/bin/env bash
# `make demo`: runs real agents in bwrap sandboxes. A research agent fetches
# its sources and asks a model through the host (tools under its policy; a
# local OpenAI-compatible mock stands in for the LLM, so no network or API key
# is needed); a flaky agent crashes and is retried; the host process of a run
# is killed with SIGKILL mid-run and the run resumed from the journal.
set -euo pipefail

build="${1:-build}"
cairn="$build/cli/cairn"
here="$(cd "$(dirname "$0")" && pwd)"
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

step "A local OpenAI-compatible server stands in for the LLM and the web (loopback only)"
scratch="$(mktemp -d)"
mock_pid=""
cleanup() {
  [ -n "$mock_pid" ] && kill "$mock_pid" 2>/dev/null
  rm -rf "$scratch"
}
trap cleanup EXIT
key="demo-key-$RANDOM$RANDOM"
"$build/examples/mock_llm/cairn-mock-llm" --port 0 --port-file "$scratch/port" --require-key "$key" \
  --script "$here/mock_llm/research_script.json" --pages "$here/mock_llm/pages" >"$scratch/mock.log" 2>&1 &
mock_pid=$!
for _ in $(seq 1 100); do [ -s "$scratch/port" ] && break; sleep 0.1; done
[ -s "$scratch/port" ] || { cat "$scratch/mock.log"; echo "demo: the mock LLM server did not start" >&2; exit 1; }
port="$(cat "$scratch/port")"
# The key lives in the host's environment only; the sandbox never sees it.
export CAIRN_LLM_BASE_URL="http://127.0.0.1:$port/v1" CAIRN_LLM_API_KEY="$key" CAIRN_LLM_MODEL="mock-1"
echo "CAIRN_LLM_BASE_URL=$CAIRN_LLM_BASE_URL (for a real model: set CAIRN_LLM_BASE_URL, CAIRN_LLM_API_KEY, CAIRN_LLM_MODEL)"

step "A research agent: fetches sources and asks the model through the host, under its policy"
sources="[\"http://127.0.0.1:$port/pages/wal.html\",\"http://127.0.0.1:$port/pages/durability.html\",\"https://example.com/\"]"
show "$cairn" run "$build/examples/research_agent" --policy "$here/research_agent.policy.json" \
  --input "{\"topic\":\"SQLite WAL for durable agents\",\"sources\":$sources,\"notify\":\"team@example.com\"}" \
  --id "research-$tag"
show "$cairn" show "research-$tag"
echo "--- the report it wrote, collected from its workspace on the host:"
head -n 16 "$CAIRN_HOME/workspaces/research-$tag/report.md"
echo "--- the mail the send_email tool queued on the host:"
ls "$CAIRN_HOME/outbox/"

step "The host dies just after a mail went out, before the result was journaled"
echo "(cairn's crash-test hook CAIRN_CRASH_POINT kills the host at exactly that point)"
input="{\"topic\":\"SQLite WAL\",\"sources\":$sources,\"notify\":\"team@example.com\"}"
echo "\$ CAIRN_CRASH_POINT=tool_returned.send_email cairn run research_agent ... --id mail-$tag"
( CAIRN_CRASH_POINT=tool_returned.send_email "$cairn" run "$build/examples/research_agent" \
  --policy "$here/research_agent.policy.json" --input "$input" --id "mail-$tag" >/dev/null 2>&1 ) 2>/dev/null || true
echo "send_email is at-most-once: cairn will not guess whether the mail went out"
show "$cairn" resume "mail-$tag" || true
echo "--- the operator checks the outbox: the mail is there"
ls "$CAIRN_HOME/outbox/" | grep "mail-$tag"
show "$cairn" settle "mail-$tag" 11 --result "{\"queued\":true,\"message_id\":\"mail-$tag/11\"}"
show "$cairn" resume "mail-$tag"

step "A flaky agent: its first attempt aborts mid-run; cairn retries it from the journal"
show "$cairn" run "$build/examples/flaky_agent" --id "flaky-$tag"
echo "--- what really executed (batches 1-2 ran once, before the crash):"
cat "$CAIRN_HOME/workspaces/flaky-$tag/progress.log"

step "Kill -9 the host process mid-run, then resume"
out="$(mktemp)"
"$cairn" run "$build/examples/research_agent" --policy "$here/research_agent.policy.json" \
  --input "{\"topic\":\"SQLite WAL\",\"sources\":$sources,\"pace_ms\":400}" --id "killed-$tag" >"$out" 2>&1 &
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
