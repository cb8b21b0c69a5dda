#!/bin/bash
# Makes one upgrade fixture of tests/storage/journals (README.md there says
# which commit each comes from): the journal that the cairn built in BUILD
# (a build folder of that commit, with its cli/cairn and tests/agents) writes
# for three runs, made with that cairn's own CLI and test agents:
#   completed    step_agent, 3 steps
#   failed       step_agent, step 1 a terminal error
#   waiting      wait_agent: step a, then waits for signal "go", then step b
#                (schema 3 on; suspended by `cairn serve --suspend-after 0`;
#                its run_wall_seconds 10 years where the policy has it)
#   interrupted  schema 1 and 2, which cannot wait: step_agent with 4 steps,
#                its host SIGKILLed while step 2 runs (steps 0 and 1 journaled)
#
# usage: make_journal.sh BUILD OUT sqlite|postgres [waits]
#   sqlite:   OUT is the journal file, checkpointed (no -wal beside it)
#   postgres: OUT is a plain pg_dump (INSERTs) of a private cluster's database
#   waits:    "yes" (schema 3 on) or "no"
set -euo pipefail
build=$(realpath "$1") out=$(realpath -m "$2") backend=$3 waits=${4:-yes}
cairn=$build/cli/cairn
step_agent=$build/tests/agents/step_agent
wait_agent=$build/tests/agents/wait_agent
work=$(mktemp -d /tmp/cairn-journal.XXXXXX)
export CAIRN_HOME=$work/home
export CAIRN_ALLOW=sandbox-none  # read by the versions that ask for it, ignored by the older ones
unset CAIRN_DB CAIRN_CRASH_POINT
mkdir -p "$CAIRN_HOME"
cd "$work"

pg_bin=$(ls -d /usr/lib/postgresql/*/bin | tail -1)
server=
cleanup() {
  [ -n "$server" ] && su postgres -s /bin/sh -c "$pg_bin/pg_ctl -D $work/pg -m fast stop" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

if [ "$backend" = postgres ]; then
  # A private cluster, as tests/support/pg_cluster.cpp makes one: never a system service.
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  mkdir "$work/pg" && chown postgres "$work/pg" && chmod 755 "$work"
  su postgres -s /bin/sh -c "$pg_bin/initdb -D $work/pg -U cairn --auth=trust" >/dev/null
  su postgres -s /bin/sh -c "$pg_bin/pg_ctl -D $work/pg -l $work/pg/log -w -o '-p $port -k $work/pg -c listen_addresses=127.0.0.1' start" >/dev/null
  server=yes
  "$pg_bin/createdb" -h 127.0.0.1 -p "$port" -U cairn journal
  export CAIRN_DB=postgresql://cairn@127.0.0.1:$port/journal
fi

# "STATUS STEPS" of a run, read from the journal itself (every version's tables have these columns).
steps_of() {
  local sql="SELECT status || ' ' || (SELECT count(*) FROM steps WHERE run_id = '$1') FROM runs WHERE id = '$1'"
  if [ "$backend" = postgres ]; then psql -XAtq "$CAIRN_DB" -c "$sql"
  else python3 -c 'import sqlite3,sys; c=sqlite3.connect("file:"+sys.argv[1]+"?mode=ro", uri=True); r=c.execute(sys.argv[2]).fetchone(); print(r[0] if r else "")' "$CAIRN_HOME/cairn.db" "$sql"; fi
}

"$cairn" run "$step_agent" --id completed --sandbox none --input '{"steps":3}'
"$cairn" run "$step_agent" --id failed --sandbox none --max-attempts 1 --input '{"steps":3,"terminal_at":1}' || true

if [ "$waits" = yes ]; then
  # The run's wall-clock limit (schema 4 on; a day by default) at its most,
  # 10 years, so that the fixture's waiting run is still within it when a test resumes it.
  policy=()
  if grep -q run_wall_seconds "$build/../engine/policy.cpp"; then
    echo '{"limits": {"run_wall_seconds": 315360000}}' >"$work/policy.json"
    policy=(--policy "$work/policy.json")
  fi
  "$cairn" submit "$wait_agent" --id waiting --sandbox none "${policy[@]}" \
    --input '{"plan":[{"op":"step","name":"a"},{"op":"signal","name":"go"},{"op":"step","name":"b"}]}'
  "$cairn" serve --suspend-after 0 >"$work/serve.log" 2>&1 &
  serve=$!
  for i in $(seq 600); do
    [ "$(steps_of waiting)" = "waiting 1" ] && break
    sleep 0.1
  done
  kill -TERM $serve
  wait $serve || true
  [ "$(steps_of waiting)" = "waiting 1" ] || { cat "$work/serve.log"; echo "waiting did not suspend"; exit 1; }
else
  setsid "$cairn" run "$step_agent" --id interrupted --sandbox none --input '{"steps":4,"sleep_ms":1000}' \
    >"$work/interrupted.log" 2>&1 &
  host=$!
  for i in $(seq 600); do
    [ "$(steps_of interrupted)" = "running 2" ] && break
    sleep 0.1
  done
  kill -KILL -- -$host
  wait $host || true
  [ "$(steps_of interrupted)" = "running 2" ] || { cat "$work/interrupted.log"; echo "interrupted is not at step 2"; exit 1; }
fi

"$cairn" ls
if [ "$backend" = postgres ]; then
  # Plain SQL that any client runs: without the \restrict lines (psql commands) newer pg_dumps add.
  "$pg_bin/pg_dump" --inserts --no-owner --no-privileges --no-comments -h 127.0.0.1 -p "$port" -U cairn journal |
    grep -v -E '^\\(un)?restrict ' >"$out"
else
  python3 -c 'import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute("PRAGMA wal_checkpoint(TRUNCATE)"); c.close()' \
    "$CAIRN_HOME/cairn.db"
  [ ! -s "$CAIRN_HOME/cairn.db-wal" ] || { echo "the journal's WAL is not empty"; exit 1; }
  cp "$CAIRN_HOME/cairn.db" "$out"
fi
