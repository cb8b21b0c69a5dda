// A journal written by an older cairn opens in this one with nothing lost.
#include <catch2/catch.hpp>

#include <SQLiteCpp/SQLiteCpp.h>

#include "storage/journal.hpp"
#include "tests/temp_dir.hpp"

using namespace cairn;
using json = nlohmann::json;

namespace {

// The on-disk format of schema version 1, as cairn 0.1 wrote it.
constexpr const char* schema_v1 = R"sql(
CREATE TABLE runs (
  id TEXT PRIMARY KEY, agent TEXT NOT NULL, input TEXT NOT NULL,
  status TEXT NOT NULL CHECK (status IN ('pending', 'running', 'completed', 'failed')),
  output TEXT, error_message TEXT, error_type TEXT, attempts INTEGER NOT NULL DEFAULT 0,
  max_attempts INTEGER NOT NULL, owner TEXT NOT NULL DEFAULT '', sandbox TEXT NOT NULL, workspace TEXT NOT NULL,
  created_at_ms INTEGER NOT NULL, updated_at_ms INTEGER NOT NULL, finished_at_ms INTEGER);
CREATE TABLE steps (
  run_id TEXT NOT NULL REFERENCES runs (id), seq INTEGER NOT NULL, name TEXT NOT NULL, kind TEXT NOT NULL,
  status TEXT NOT NULL CHECK (status IN ('ok', 'error')), output TEXT, error_message TEXT, error_type TEXT,
  attempt INTEGER NOT NULL, duration_us INTEGER NOT NULL, started_at_ms INTEGER NOT NULL,
  finished_at_ms INTEGER NOT NULL, PRIMARY KEY (run_id, seq));
CREATE TRIGGER steps_insert_once BEFORE INSERT ON steps
  WHEN EXISTS (SELECT 1 FROM steps WHERE run_id = NEW.run_id AND seq = NEW.seq)
  BEGIN SELECT RAISE(ABORT, 'steps are write-once: this step is already journaled'); END;
CREATE TRIGGER steps_no_update BEFORE UPDATE ON steps
  BEGIN SELECT RAISE(ABORT, 'steps are write-once: a journaled step cannot be updated'); END;
CREATE TRIGGER steps_no_delete BEFORE DELETE ON steps
  BEGIN SELECT RAISE(ABORT, 'steps are write-once: a journaled step cannot be deleted'); END;
CREATE TABLE events (
  id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL REFERENCES runs (id), seq INTEGER,
  kind TEXT NOT NULL, data TEXT NOT NULL, at_ms INTEGER NOT NULL);
CREATE INDEX events_by_run ON events (run_id, id);
INSERT INTO runs VALUES ('old', '/bin/agent', '{"q":1}', 'completed', '"answer"', NULL, NULL, 1, 3, '', 'bwrap',
                         '/ws/old', 1000, 2000, 2000);
INSERT INTO steps VALUES ('old', 0, 'plan', 'step', 'ok', '[1,2]', NULL, NULL, 1, 50, 1000, 1001);
INSERT INTO events (run_id, seq, kind, data, at_ms) VALUES ('old', NULL, 'run_completed', '{}', 2000);
PRAGMA user_version = 1;
)sql";

}  // namespace

TEST_CASE("a version 1 journal is migrated in place: runs, steps and events kept, write-once still enforced") {
  testing::temp_dir dir;
  {
    SQLite::Database raw((dir / "cairn.db").string(), SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
    raw.exec(schema_v1);
  }
  storage::journal j(dir / "cairn.db");
  auto run = j.find_run("old");
  REQUIRE(run);
  CHECK(run->status == storage::run_status::completed);
  CHECK(run->input == json{{"q", 1}});
  CHECK(run->output == "answer");
  CHECK(run->policy == json::object());
  REQUIRE(j.steps("old").size() == 1);
  CHECK(j.steps("old")[0].result.output == json{1, 2});
  CHECK(j.events("old").size() == 1);

  // The new status is accepted, and the old guarantees still hold.
  storage::new_run fresh;
  fresh.id = "new";
  fresh.agent = "/bin/agent";
  fresh.policy = {{"network", "none"}};
  j.create_run(fresh);
  CHECK(j.find_run("new")->policy == json{{"network", "none"}});
  j.finish_run("new", storage::run_status::in_doubt, nullptr, protocol::error_info{"maybe sent", "in_doubt"});
  auto doubt = j.find_run("new");
  CHECK(doubt->status == storage::run_status::in_doubt);
  CHECK_FALSE(doubt->finished_at_ms);
  storage::step_record again;
  again.run_id = "old";
  again.result.seq = 0;
  again.result.name = "plan";
  CHECK_THROWS_AS(j.append_step(again), storage::storage_error);
  SQLite::Database raw((dir / "cairn.db").string(), SQLite::OPEN_READONLY);
  CHECK(raw.execAndGet("PRAGMA user_version").getInt() == storage::journal::schema_version());
  SQLite::Statement fk(raw, "PRAGMA foreign_key_check");
  CHECK_FALSE(fk.executeStep());
}
