#!/usr/bin/env bash
# `make demo`: runs real agents in bwrap sandboxes. A research agent fetches
# its sources and asks a model through the host (tools under its policy; a
# local OpenAI-compatible mock stands in for the LLM, so no network or API key
# is needed); a flaky agent crashes and is retried; the host process of a run
# is killed with SIGKILL mid-run and the run resumed from the journal; the
# research agent again, in Python; an agent built with the OpenAI Agents SDK
# (TypeScript/JavaScript) calls two tools and hands off. Then
# the daemon, `cairn serve`: a refund waits for a human's approval (a signal),
# a lead agent fans work out to child agents, a run and its children are
# cancelled, and the daemon stops gracefully on SIGTERM.
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
    # A fresh private folder, never a fixed name another user could make first;
    # 0711: the sandbox uid passes through to its workspace, nobody may list it.
    CAIRN_HOME="$(mktemp -d /var/tmp/cairn-demo.XXXXXX)"
    chmod 711 "$CAIRN_HOME"
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
serve_pid=""
waiting_runs=()  # this demo's runs that could be left waiting if it stops early
cleanup() {
  if [ -n "$serve_pid" ] && kill -0 "$serve_pid" 2>/dev/null; then
    kill -TERM "$serve_pid" 2>/dev/null
    for _ in $(seq 1 100); do kill -0 "$serve_pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$serve_pid" 2>/dev/null || true
  fi
  # Nothing of an interrupted demo may wait for a signal in the journal (a
  # later `cairn resume --all` would follow it). Ended runs refuse the cancel.
  for run in "${waiting_runs[@]}"; do "$cairn" cancel --no-wait "$run" >/dev/null 2>&1 || true; done
  [ -n "$mock_pid" ] && kill "$mock_pid" 2>/dev/null
  [ -z "${agents_mock_pid:-}" ] || kill "$agents_mock_pid" 2>/dev/null || true
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

step "The same research agent in Python (examples/python/research_agent.py), under the same policy"
echo "(a script agent runs from a read-only bind of its folder; the sandbox imports cairn's Python SDK)"
show "$cairn" run "$here/python/research_agent.py" --policy "$here/research_agent.policy.json" \
  --input "{\"topic\":\"SQLite WAL for durable agents\",\"sources\":$sources}" --id "research-py-$tag"
echo "--- the first lines of its report:"
show "$cairn" workspace "research-py-$tag" report.md | head -n 6

step "The host dies just after a mail went out, before the result was journaled"
echo "(cairn's crash-test hook CAIRN_CRASH_POINT kills the host at exactly that point)"
input="{\"topic\":\"SQLite WAL\",\"sources\":$sources,\"notify\":\"team@example.com\"}"
echo "\$ CAIRN_CRASH_POINT=tool_returned.send_email cairn run research_agent ... --id mail-$tag"
# (in braces, so that bash's own "Killed" notice goes to /dev/null too)
{ ( CAIRN_CRASH_POINT=tool_returned.send_email "$cairn" run "$build/examples/research_agent" \
  --policy "$here/research_agent.policy.json" --input "$input" --id "mail-$tag" >/dev/null 2>&1 ); } 2>/dev/null || true
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
{ kill -9 "$host"; wait "$host"; } 2>/dev/null || true   # braces: bash's "Killed" notice too
rm -f "$out"
show "$cairn" ls
show "$cairn" resume --all
show "$cairn" show "killed-$tag"

step "An agent built with the OpenAI Agents SDK: its model calls and tool bodies journaled, in the sandbox"
echo "(examples/js/openai_agents: two function tools and a handoff; a second mock plays its model)"
"$build/examples/mock_llm/cairn-mock-llm" --port 0 --port-file "$scratch/agents-port" --require-key "$key" \
  --script "$here/js/openai_agents/mock_script.json" >"$scratch/agents-mock.log" 2>&1 &
agents_mock_pid=$!
for _ in $(seq 1 100); do [ -s "$scratch/agents-port" ] && break; sleep 0.1; done
CAIRN_LLM_BASE_URL="http://127.0.0.1:$(cat "$scratch/agents-port")/v1" \
  show "$cairn" run "$here/js/openai_agents/agent.mjs" --policy "$here/js/openai_agents/agent.policy.json" \
  --id "agents-$tag"
kill "$agents_mock_pid" 2>/dev/null || true
agents_mock_pid=""
echo "--- the tool bodies that ran, from its workspace:"
show "$cairn" workspace "agents-$tag" tool_calls.log

# The status of run $1, from `cairn ls`.
status_of() { "$cairn" ls | awk -v id="$1" '$1 == id { print $2 }'; }
# Waits until run $1 has status $2: at most $3 seconds (default 20), then the demo fails.
await() {
  local deadline=$((SECONDS + ${3:-20}))
  until [ "$(status_of "$1")" = "$2" ]; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "demo: run $1 is '$(status_of "$1")', not $2, after ${3:-20} s; the daemon's log:" >&2
      cat "$scratch/serve.log" >&2
      exit 1
    fi
    sleep 0.1
  done
}
# Waits until run $1 has journaled at least $2 steps (at most 20 s).
await_steps() {
  local deadline=$((SECONDS + 20))
  until [ "$("$cairn" ls | awk -v id="$1" '$1 == id { print $4 }')" -ge "$2" ] 2>/dev/null; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "demo: run $1 has not journaled $2 steps after 20 s; the daemon's log:" >&2
      cat "$scratch/serve.log" >&2
      exit 1
    fi
    sleep 0.1
  done
}
# `cairn ls`, only the header and the rows of runs whose id starts with $1.
ls_runs() {
  printf '$ cairn ls   # the header and the rows of %s*\n' "$1"
  "$cairn" ls | awk -v p="$1" 'NR == 1 || index($1, p) == 1'
}

step "The daemon: cairn serve runs what is submitted, fires timers, delivers signals"
echo "\$ cairn serve --max-concurrent 4 --warm 2 >serve.log &"
"$cairn" serve --max-concurrent 4 --warm 2 >"$scratch/serve.log" 2>&1 &
serve_pid=$!
for _ in $(seq 1 100); do [ -s "$scratch/serve.log" ] && break; sleep 0.1; done
cat "$scratch/serve.log"
kill -0 "$serve_pid" 2>/dev/null || { echo "demo: cairn serve did not start (see above)" >&2; exit 1; }
echo "--- the workers serving this journal (more serves may share it, each under a lease):"
show "$cairn" workers

step "A refund that a human must approve: the run waits for a signal, holding no sandbox"
refund="refund-$tag"
waiting_runs+=("$refund")
show "$cairn" submit "$build/examples/approval_agent" --id "$refund" \
  --input '{"order":"A-1042","customer":"ada@example.com","amount":120,"currency":"EUR","reason":"parcel arrived damaged","cool_down_s":1}'
await "$refund" waiting
ls_runs "$refund"
show "$cairn" show "$refund"
echo "--- an approver decides:"
show "$cairn" signal "$refund" approval --data '{"approved":true,"by":"maria","note":"photo of the damage attached"}'
await "$refund" completed
show "$cairn" show "$refund"
echo "--- its audit log and the refund it issued, in its workspace:"
cat "$CAIRN_HOME/workspaces/$refund/audit.log" "$CAIRN_HOME/workspaces/$refund/refunds/A-1042.json"

step "A lead agent fans a task out to three worker agents (child runs) and merges what they return"
team="team-$tag"
show "$cairn" submit "$build/examples/team_agent" --id "$team" --input '{"workers":3,"fail_part":2}'
await "$team" completed
ls_runs "$team"
show "$cairn" show "$team"

step "Cancel a run: its children are cancelled with it"
crew="crew-$tag"
waiting_runs+=("$crew")
echo "(each worker pauses 60 s between its steps, with ctx.sleep)"
show "$cairn" submit "$build/examples/team_agent" --id "$crew" --input '{"workers":2,"pause_ms":60000}'
for run in "$crew" "$crew.1" "$crew.2"; do await "$run" waiting; done
ls_runs "$crew"
show "$cairn" cancel "$crew" --reason "the task was withdrawn"
ls_runs "$crew"

step "SIGTERM stops the daemon gracefully: a run in flight is suspended, nothing is lost"
late="refund-late-$tag"
waiting_runs+=("$late")
show "$cairn" submit "$build/examples/approval_agent" --id "$late" \
  --input '{"order":"A-1043","customer":"bob@example.com","amount":80,"currency":"EUR","reason":"ordered twice"}'
await_steps "$late" 1   # its proposal is drafted; it waits for a decision, its sandbox still alive
echo "\$ kill -TERM $serve_pid   # cairn serve"
kill -TERM "$serve_pid"
for _ in $(seq 1 150); do kill -0 "$serve_pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$serve_pid" 2>/dev/null; then echo "demo: cairn serve did not stop within 15 s" >&2; exit 1; fi
serve_rc=0
wait "$serve_pid" || serve_rc=$?
serve_pid=""
echo "--- the daemon's log (it exited with $serve_rc):"
cat "$scratch/serve.log"
ls_runs "$late"
echo "--- no daemon now: the run waits in the journal; a signal, and cairn resume finishes it in this process"
show "$cairn" signal "$late" approval --data '{"approved":false,"by":"lee","note":"duplicate of A-1042"}'
show "$cairn" resume "$late"
