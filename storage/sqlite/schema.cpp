// The SQLite journal's format and its migrations.
#include "storage/sqlite/schema.hpp"

#include <iterator>

#include <fmt/format.h>

#include "storage/records.hpp"

namespace cairn::storage::sqlite {
namespace fs = std::filesystem;

namespace {

// The journal's format. `PRAGMA user_version` is the schema version: migration
// i brings version i to i + 1, all of them in one IMMEDIATE transaction. JSON
// columns hold json::dump() text. Times are milliseconds since the Unix epoch.
constexpr const char* migrations[] = {
    R"sql(
CREATE TABLE runs (
  id             TEXT PRIMARY KEY,
  agent          TEXT NOT NULL,
  input          TEXT NOT NULL,
  status         TEXT NOT NULL CHECK (status IN ('pending', 'running', 'completed', 'failed')),
  output         TEXT,                      -- when completed
  error_message  TEXT,                      -- when failed
  error_type     TEXT,
  attempts       INTEGER NOT NULL DEFAULT 0,
  max_attempts   INTEGER NOT NULL,
  owner          TEXT NOT NULL DEFAULT '',  -- engine/owner.hpp; '' when no process has it
  sandbox        TEXT NOT NULL,
  workspace      TEXT NOT NULL,
  created_at_ms  INTEGER NOT NULL,
  updated_at_ms  INTEGER NOT NULL,
  finished_at_ms INTEGER
);

CREATE TABLE steps (
  run_id         TEXT NOT NULL REFERENCES runs (id),
  seq            INTEGER NOT NULL,
  name           TEXT NOT NULL,
  kind           TEXT NOT NULL,             -- protocol step_kind
  status         TEXT NOT NULL CHECK (status IN ('ok', 'error')),
  output         TEXT,                      -- when ok
  error_message  TEXT,                      -- when error
  error_type     TEXT,
  attempt        INTEGER NOT NULL,
  duration_us    INTEGER NOT NULL,
  started_at_ms  INTEGER NOT NULL,
  finished_at_ms INTEGER NOT NULL,
  PRIMARY KEY (run_id, seq)
);

-- Steps are write-once, enforced by the database for every client. The INSERT
-- trigger closes INSERT OR REPLACE, which deletes without firing DELETE triggers.
CREATE TRIGGER steps_insert_once BEFORE INSERT ON steps
  WHEN EXISTS (SELECT 1 FROM steps WHERE run_id = NEW.run_id AND seq = NEW.seq)
  BEGIN SELECT RAISE(ABORT, 'steps are write-once: this step is already journaled'); END;
CREATE TRIGGER steps_no_update BEFORE UPDATE ON steps
  BEGIN SELECT RAISE(ABORT, 'steps are write-once: a journaled step cannot be updated'); END;
CREATE TRIGGER steps_no_delete BEFORE DELETE ON steps
  BEGIN SELECT RAISE(ABORT, 'steps are write-once: a journaled step cannot be deleted'); END;

CREATE TABLE events (
  id     INTEGER PRIMARY KEY AUTOINCREMENT,
  run_id TEXT NOT NULL REFERENCES runs (id),
  seq    INTEGER,
  kind   TEXT NOT NULL,
  data   TEXT NOT NULL,
  at_ms  INTEGER NOT NULL
);
CREATE INDEX events_by_run ON events (run_id, id);
)sql",
    // 2: the policy a run is held to, and the in_doubt status (an at-most-once
    // tool call was started but its outcome is unknown). SQLite cannot change
    // a CHECK constraint in place, so runs is rebuilt (migrate() turns foreign
    // keys off around it). waiting and cancelled are accepted for the daemon.
    R"sql(
CREATE TABLE runs_v2 (
  id             TEXT PRIMARY KEY,
  agent          TEXT NOT NULL,
  input          TEXT NOT NULL,
  status         TEXT NOT NULL CHECK (status IN ('pending', 'running', 'waiting', 'completed', 'failed',
                                                 'cancelled', 'in_doubt')),
  output         TEXT,                      -- when completed
  error_message  TEXT,                      -- when failed or in_doubt
  error_type     TEXT,
  attempts       INTEGER NOT NULL DEFAULT 0,
  max_attempts   INTEGER NOT NULL,
  owner          TEXT NOT NULL DEFAULT '',  -- engine/owner.hpp; '' when no process has it
  sandbox        TEXT NOT NULL,
  workspace      TEXT NOT NULL,
  created_at_ms  INTEGER NOT NULL,
  updated_at_ms  INTEGER NOT NULL,
  finished_at_ms INTEGER,
  policy         TEXT NOT NULL DEFAULT '{}' -- engine/policy.hpp, normalized
);
INSERT INTO runs_v2 (id, agent, input, status, output, error_message, error_type, attempts, max_attempts, owner,
                     sandbox, workspace, created_at_ms, updated_at_ms, finished_at_ms)
  SELECT id, agent, input, status, output, error_message, error_type, attempts, max_attempts, owner,
         sandbox, workspace, created_at_ms, updated_at_ms, finished_at_ms FROM runs;
DROP TABLE runs;
ALTER TABLE runs_v2 RENAME TO runs;
CREATE INDEX events_by_seq ON events (run_id, seq);
)sql",
    // 3: long-running runs. A run waits (status 'waiting', no owner) on a timer,
    // a signal or a child run; the wait columns say on what and are NULL
    // otherwise. Signals are queued here and each is delivered into exactly one
    // step (delivered_seq).
    R"sql(
ALTER TABLE runs ADD COLUMN parent_id TEXT;               -- the run that started this one; NULL for top-level
ALTER TABLE runs ADD COLUMN wait_kind TEXT CHECK (wait_kind IN ('timer', 'signal', 'child'));
ALTER TABLE runs ADD COLUMN wait_key TEXT;                -- signal name, or child run id
ALTER TABLE runs ADD COLUMN wait_seq INTEGER;             -- the step the run waits at
ALTER TABLE runs ADD COLUMN wake_at_ms INTEGER;           -- timer fires / wait times out; NULL = never
ALTER TABLE runs ADD COLUMN cancel_requested_at_ms INTEGER;
ALTER TABLE runs ADD COLUMN deadline_ms INTEGER;          -- the run's overall timeout; NULL = none
CREATE INDEX runs_by_parent ON runs (parent_id);
CREATE INDEX runs_by_wake ON runs (status, wake_at_ms);
-- The waiting runs with every column the scheduler's test reads: it scans
-- them without touching the (wide) run rows.
CREATE INDEX runs_waiting ON runs (wait_kind, wait_key, id, wake_at_ms, deadline_ms, cancel_requested_at_ms)
  WHERE status = 'waiting';

CREATE TABLE signals (
  id              INTEGER PRIMARY KEY AUTOINCREMENT,
  run_id          TEXT NOT NULL REFERENCES runs (id),
  name            TEXT NOT NULL,
  payload         TEXT NOT NULL,
  sent_at_ms      INTEGER NOT NULL,
  delivered_seq   INTEGER,                  -- the step it was delivered into; NULL while queued
  delivered_at_ms INTEGER
);
CREATE INDEX signals_undelivered ON signals (run_id, name, id) WHERE delivered_seq IS NULL;
CREATE INDEX signals_by_run ON signals (run_id, id);  -- a run's signals, delivered or not
)sql",
    // 4: fencing. Each claim of a run counts one more epoch; a process writes
    // for a run it claimed only while (owner, epoch) is still what its claim
    // set, so one that lost the run (judged dead, taken over) cannot write.
    R"sql(
ALTER TABLE runs ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;
)sql",
    // 5: payloads stored by content (payloads.hpp): the long strings of a
    // run's events, each once per run, referenced from the events' data.
    R"sql(
CREATE TABLE payloads (
  run_id TEXT NOT NULL REFERENCES runs (id),
  digest TEXT NOT NULL,
  body   TEXT NOT NULL,
  PRIMARY KEY (run_id, digest)
) WITHOUT ROWID;
)sql",
    // 6: many workers on one journal. Each `cairn serve` holds a row here
    // while its lease is current (storage/journal.hpp worker_record); a run
    // records the machine whose disk holds its workspace ('' = shared storage).
    R"sql(
ALTER TABLE runs ADD COLUMN workspace_host TEXT NOT NULL DEFAULT '';
CREATE TABLE workers (
  id                  TEXT PRIMARY KEY,         -- its owner string, engine/owner.hpp
  host                TEXT NOT NULL,
  workspace_root      TEXT NOT NULL DEFAULT '',
  started_at_ms       INTEGER NOT NULL,
  renewed_at_ms       INTEGER NOT NULL,
  lease_expires_at_ms INTEGER NOT NULL,
  fenced_writes       INTEGER NOT NULL DEFAULT 0
);
-- The runs each worker owns, without reading the finished ones.
CREATE INDEX runs_by_owner ON runs (owner) WHERE owner <> '';
)sql",
    // 7: a run's state beside its history (journal.hpp run_state): a narrow
    // row per run, so that keeping it costs no rewrite of the run's wide row.
    // journal_bytes is kept by the database as rows are inserted (what
    // bytes_of_run counted by scanning); state is the engine's JSON object,
    // NULL for the runs written before (the engine derives theirs). A
    // cancel request keeps its reason on the run.
    R"sql(
CREATE TABLE run_states (
  run_id        TEXT PRIMARY KEY REFERENCES runs (id),
  journal_bytes INTEGER NOT NULL DEFAULT 0,
  state         TEXT
) WITHOUT ROWID;
INSERT INTO run_states (run_id, journal_bytes)
  SELECT id,
    (SELECT coalesce(sum(length(CAST(name AS BLOB)) + coalesce(length(CAST(output AS BLOB)), 0)
       + coalesce(length(CAST(error_message AS BLOB)), 0) + coalesce(length(CAST(error_type AS BLOB)), 0)), 0)
       FROM steps WHERE run_id = runs.id)
    + (SELECT coalesce(sum(length(CAST(kind AS BLOB)) + length(CAST(data AS BLOB))), 0)
       FROM events WHERE run_id = runs.id)
    + (SELECT coalesce(sum(length(digest) + length(CAST(body AS BLOB))), 0) FROM payloads WHERE run_id = runs.id)
  FROM runs;
CREATE TRIGGER runs_state AFTER INSERT ON runs
  BEGIN INSERT INTO run_states (run_id, state) VALUES (NEW.id, '{}'); END;
CREATE TRIGGER steps_bytes AFTER INSERT ON steps BEGIN
  UPDATE run_states SET journal_bytes = journal_bytes + length(CAST(NEW.name AS BLOB))
    + coalesce(length(CAST(NEW.output AS BLOB)), 0) + coalesce(length(CAST(NEW.error_message AS BLOB)), 0)
    + coalesce(length(CAST(NEW.error_type AS BLOB)), 0)
  WHERE run_id = NEW.run_id;
END;
CREATE TRIGGER events_bytes AFTER INSERT ON events BEGIN
  UPDATE run_states SET journal_bytes = journal_bytes + length(CAST(NEW.kind AS BLOB)) + length(CAST(NEW.data AS BLOB))
  WHERE run_id = NEW.run_id;
END;
CREATE TRIGGER payloads_bytes AFTER INSERT ON payloads BEGIN
  UPDATE run_states SET journal_bytes = journal_bytes + length(NEW.digest) + length(CAST(NEW.body AS BLOB))
  WHERE run_id = NEW.run_id;
END;

ALTER TABLE runs ADD COLUMN cancel_reason TEXT;
UPDATE runs SET cancel_reason = (
  SELECT json_extract(data, '$.reason') FROM events
  WHERE run_id = runs.id AND kind = 'cancel_requested' AND json_valid(data)
    AND json_type(data, '$.reason') = 'text'
  ORDER BY id DESC LIMIT 1)
WHERE cancel_requested_at_ms IS NOT NULL;

-- Which cairn created the journal and which last opened it to write
-- (created_by, last_written_by; written by migrate() and at each open).
CREATE TABLE journal_info (
  key   TEXT PRIMARY KEY,
  value TEXT NOT NULL
) WITHOUT ROWID;
)sql",
    // 8: retention (journal.hpp delete_run). A step stays write-once while
    // its run has not ended; the run's deletion takes its steps with it.
    // runs_by_created pages `cairn ls` and finds the oldest runs for `cairn
    // gc` without sorting every run (its rowid breaks ties). The file also
    // switches to auto_vacuum = INCREMENTAL, which needs a VACUUM outside
    // any transaction: connection.cpp does it once after the migration.
    R"sql(
DROP TRIGGER steps_no_delete;
CREATE TRIGGER steps_no_delete BEFORE DELETE ON steps
  WHEN (SELECT status FROM runs WHERE id = OLD.run_id) NOT IN ('completed', 'failed', 'cancelled')
  BEGIN SELECT RAISE(ABORT, 'steps are write-once: a journaled step cannot be deleted while its run has not ended');
  END;
CREATE INDEX runs_by_created ON runs (created_at_ms);
)sql",
    // 9: workspace checkpoints (engine/workspace_checkpoints.hpp): pieces of
    // workspace files by content, shared by every run, and which runs use
    // each, so a run's deletion takes the pieces no other run uses.
    R"sql(
CREATE TABLE blobs (
  digest TEXT PRIMARY KEY,
  size   INTEGER NOT NULL,
  data   BLOB NOT NULL
);
CREATE TABLE run_blobs (
  run_id TEXT NOT NULL REFERENCES runs (id),
  digest TEXT NOT NULL,
  PRIMARY KEY (run_id, digest)
) WITHOUT ROWID;
CREATE INDEX run_blobs_by_digest ON run_blobs (digest);
-- What an attempt reads as it begins (journal.hpp events_of_kinds).
CREATE INDEX events_by_kind ON events (run_id, kind, id);
)sql",
};
constexpr int latest = static_cast<int>(std::size(migrations));

}  // namespace

int latest_version() { return latest; }

int user_version(SQLite::Database& db) { return db.execAndGet("PRAGMA user_version").getInt(); }

void check_not_too_new(int version, const fs::path& path) {
  if (version > latest) throw detail::schema_too_new_error(path.string(), version, latest);
}

// Runs with foreign keys off (a rebuilt table is briefly missing, as SQLite's
// ALTER TABLE guide prescribes) and checks them before the commit.
void migrate(SQLite::Database& db, const fs::path& path) {
  check_not_too_new(user_version(db), path);
  if (user_version(db) == latest) return;
  db.exec("PRAGMA foreign_keys = OFF");
  SQLite::Transaction tx(db, SQLite::TransactionBehavior::IMMEDIATE);
  // Read again under the write lock: another process may have migrated meanwhile.
  const int version = user_version(db);
  check_not_too_new(version, path);
  for (int v = version; v < latest; ++v) db.exec(migrations[v]);
  SQLite::Statement broken(db, "PRAGMA foreign_key_check");
  if (broken.executeStep())
    throw storage_error(errc::corrupt, fmt::format("journal {}: migrating to schema {} left a row in {} without its "
                                                   "run; restore the journal from a backup",
                                                   path.string(), latest, broken.getColumn(0).getString()));
  SQLite::Statement created(db, "INSERT OR IGNORE INTO journal_info (key, value) VALUES ('created_by', ?)");
  created.bind(1, detail::created_by(version));
  created.exec();
  db.exec(fmt::format("PRAGMA user_version = {}", latest));
  tx.commit();
}

void note_writer(SQLite::Database& db) {
  const auto me = writer_name();
  SQLite::Statement last(db, "SELECT value FROM journal_info WHERE key = 'last_written_by'");
  if (last.executeStep() && last.getColumn(0).getString() == me) return;
  last.reset();
  SQLite::Transaction tx(db, SQLite::TransactionBehavior::IMMEDIATE);
  SQLite::Statement note(db, "INSERT INTO journal_info (key, value) VALUES ('last_written_by', ?) "
                             "ON CONFLICT (key) DO UPDATE SET value = excluded.value");
  note.bind(1, me);
  note.exec();
  tx.commit();
}


}  // namespace cairn::storage::sqlite
