// A journal written by an older cairn opens in this one with nothing lost.
#include <catch2/catch.hpp>

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <vector>

#include <SQLiteCpp/SQLiteCpp.h>

#include "storage/journal.hpp"
#include "storage/sqlite/sqlite_journal.hpp"
#include "tests/temp_dir.hpp"

using namespace cairn;
using json = nlohmann::json;

namespace {

// Schema 7 is schema 9 without schema 9's blobs and run_blobs, then
// without runs_by_created, and with a trigger that refuses every step's
// deletion: what the tests below that make an older journal out of a
// current one undo first.
const std::string undo_schema_8 =
    "DROP INDEX events_by_kind; DROP INDEX run_blobs_by_digest; DROP TABLE run_blobs; DROP TABLE blobs; DROP INDEX runs_by_created; DROP TRIGGER steps_no_delete; CREATE TRIGGER steps_no_delete BEFORE DELETE ON "
    "steps BEGIN SELECT RAISE(ABORT, 'steps are write-once: a journaled step cannot be deleted'); END; ";

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
  auto j = storage::open_journal(dir / "cairn.db");
  auto run = j->find_run("old");
  REQUIRE(run);
  CHECK(run->status == storage::run_status::completed);
  CHECK(run->input == json{{"q", 1}});
  CHECK(run->output == "answer");
  CHECK(run->policy == json::object());
  REQUIRE(j->steps("old").size() == 1);
  CHECK(j->steps("old")[0].result.output == json{1, 2});
  CHECK(j->events("old").size() == 1);

  // The new status is accepted, and the old guarantees still hold.
  storage::new_run fresh;
  fresh.id = "new";
  fresh.agent = "/bin/agent";
  fresh.policy = {{"network", "none"}};
  j->create_run(fresh);
  CHECK(j->find_run("new")->policy == json{{"network", "none"}});
  j->finish_run("new", storage::run_status::in_doubt, nullptr, protocol::error_info{"maybe sent", "in_doubt"});
  auto doubt = j->find_run("new");
  CHECK(doubt->status == storage::run_status::in_doubt);
  CHECK_FALSE(doubt->finished_at_ms);
  storage::step_record again;
  again.run_id = "old";
  again.result.seq = 0;
  again.result.name = "plan";
  CHECK_THROWS_AS(j->append_step(again), storage::storage_error);
  SQLite::Database raw((dir / "cairn.db").string(), SQLite::OPEN_READONLY);
  CHECK(raw.execAndGet("PRAGMA user_version").getInt() == storage::sqlite::schema_version());
  SQLite::Statement fk(raw, "PRAGMA foreign_key_check");
  CHECK_FALSE(fk.executeStep());
}

namespace {

// The on-disk format of schema version 2, as cairn 0.2 wrote it: version 1
// with runs rebuilt (policy, the wider status CHECK) and events_by_seq.
constexpr const char* schema_v2 = R"sql(
CREATE TABLE runs (
  id TEXT PRIMARY KEY, agent TEXT NOT NULL, input TEXT NOT NULL,
  status TEXT NOT NULL CHECK (status IN ('pending', 'running', 'waiting', 'completed', 'failed',
                                         'cancelled', 'in_doubt')),
  output TEXT, error_message TEXT, error_type TEXT, attempts INTEGER NOT NULL DEFAULT 0,
  max_attempts INTEGER NOT NULL, owner TEXT NOT NULL DEFAULT '', sandbox TEXT NOT NULL, workspace TEXT NOT NULL,
  created_at_ms INTEGER NOT NULL, updated_at_ms INTEGER NOT NULL, finished_at_ms INTEGER,
  policy TEXT NOT NULL DEFAULT '{}');
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
CREATE INDEX events_by_seq ON events (run_id, seq);
INSERT INTO runs VALUES ('done', '/bin/agent', '{"q":1}', 'completed', '"answer"', NULL, NULL, 1, 3, '', 'bwrap',
                         '/ws/done', 1000, 2000, 2000, '{"network":"none"}');
INSERT INTO runs VALUES ('busy', '/bin/agent', '{"q":2}', 'running', NULL, NULL, NULL, 2, 3, 'host-1:4121', 'none',
                         '/ws/busy', 3000, 3500, NULL, '{}');
INSERT INTO steps VALUES ('done', 0, 'plan', 'step', 'ok', '[1,2]', NULL, NULL, 1, 50, 1000, 1001);
INSERT INTO steps VALUES ('busy', 0, 'clock', 'now', 'ok', '1700000000000', NULL, NULL, 1, 5, 3000, 3001);
INSERT INTO steps VALUES ('busy', 1, 'search', 'tool', 'error', NULL, 'timed out', 'timeout', 2, 9, 3100, 3200);
INSERT INTO events (run_id, seq, kind, data, at_ms) VALUES ('done', NULL, 'run_completed', '{}', 2000);
INSERT INTO events (run_id, seq, kind, data, at_ms) VALUES ('busy', 1, 'step_retry', '{"delay_ms":250}', 3150);
PRAGMA user_version = 2;
)sql";

}  // namespace

TEST_CASE("a version 2 journal is migrated in place: runs, steps and events kept, and runs can wait") {
  testing::temp_dir dir;
  {
    SQLite::Database raw((dir / "cairn.db").string(), SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
    raw.exec(schema_v2);
  }
  auto j = storage::open_journal(dir / "cairn.db");
  auto done = j->find_run("done");
  REQUIRE(done);
  CHECK(done->status == storage::run_status::completed);
  CHECK(done->output == "answer");
  CHECK(done->policy == json{{"network", "none"}});
  CHECK(done->finished_at_ms == std::optional<std::int64_t>(2000));
  auto busy = j->find_run("busy");
  REQUIRE(busy);
  CHECK(busy->status == storage::run_status::running);
  CHECK(busy->owner == "host-1:4121");
  CHECK(busy->attempts == 2);
  CHECK(busy->input == json{{"q", 2}});
  // The new columns start empty: no parent, no wait, no cancel, no deadline.
  CHECK(busy->parent_id.empty());
  CHECK_FALSE(busy->wait);
  CHECK_FALSE(busy->cancel_requested_at_ms);
  CHECK_FALSE(busy->deadline_ms);

  auto steps = j->steps("busy");
  REQUIRE(steps.size() == 2);
  CHECK(steps[0].result.kind == protocol::step_kind::now);
  CHECK(steps[0].result.output == 1700000000000);
  CHECK_FALSE(steps[1].result.ok);
  CHECK(steps[1].result.error.type == "timeout");
  CHECK(steps[1].result.attempt == 2);
  CHECK(j->steps("done").size() == 1);
  auto retry = j->events_at("busy", 1);
  REQUIRE(retry.size() == 1);
  CHECK(retry[0].data == json{{"delay_ms", 250}});
  CHECK(j->events("done").size() == 1);

  // A migrated run can wait for a signal and be found by the scheduler once it comes.
  j->suspend_run("busy", {"signal", "approval", 2, std::nullopt});
  CHECK(j->schedulable(storage::now_ms()).empty());
  j->enqueue_signal("busy", "approval", {{"ok", true}});
  auto ready = j->schedulable(storage::now_ms());
  REQUIRE(ready.size() == 1);
  CHECK(ready[0].id == "busy");
  try {
    j->enqueue_signal("done", "approval", 1);
    FAIL("a finished run accepted a signal");
  } catch (const storage::storage_error& e) {
    CHECK(e.code() == storage::errc::finished);
  }
  CHECK(j->signals("done").empty());

  SQLite::Database raw((dir / "cairn.db").string(), SQLite::OPEN_READWRITE);
  CHECK(raw.execAndGet("PRAGMA user_version").getInt() == storage::sqlite::schema_version());
  SQLite::Statement fk(raw, "PRAGMA foreign_key_check");
  CHECK_FALSE(fk.executeStep());
  CHECK_THROWS_WITH(raw.exec("UPDATE steps SET output = '1'"), Catch::Contains("write-once"));
}

TEST_CASE("a version 3 journal is migrated in place: every run starts at epoch 0 and claims fence from there") {
  testing::temp_dir dir;
  {
    auto current = storage::open_journal(dir / "cairn.db");
    storage::new_run r;
    r.id = "busy";
    r.agent = "/bin/agent";
    r.sandbox = "none";
    r.owner = "host-1:1b4e28ba-2fa1-11d2-883f-0016d3cca427:4121:987654";
    current->create_run(r);
    storage::step_record step;
    step.run_id = "busy";
    step.result.name = "plan";
    step.result.output = json{1};
    current->append_step(step);
    // Schema 3 is schema 8 without schema 8's and 7's, then runs.epoch, the payloads table and schema 6's additions.
    SQLite::Database raw((dir / "cairn.db").string(), SQLite::OPEN_READWRITE);
    raw.exec(undo_schema_8 + "DROP TRIGGER runs_state; DROP TRIGGER steps_bytes; DROP TRIGGER events_bytes; DROP TRIGGER payloads_bytes; "
             "DROP TABLE run_states; ALTER TABLE runs DROP COLUMN cancel_reason; DROP TABLE journal_info; "
             "DROP TABLE payloads; ALTER TABLE runs DROP COLUMN epoch; DROP TABLE workers; DROP INDEX runs_by_owner; "
             "ALTER TABLE runs DROP COLUMN workspace_host; PRAGMA user_version = 3");
  }
  auto a = storage::open_journal(dir / "cairn.db");
  auto busy = a->find_run("busy");
  REQUIRE(busy);
  CHECK(busy->epoch == 0);
  CHECK(busy->owner == "host-1:1b4e28ba-2fa1-11d2-883f-0016d3cca427:4121:987654");
  CHECK(a->steps("busy").size() == 1);

  REQUIRE(a->claim_run("busy", busy->owner, "host-2:a:1:1"));
  CHECK(a->find_run("busy")->epoch == 1);
  auto b = storage::open_journal(dir / "cairn.db");
  REQUIRE(b->claim_run("busy", "host-2:a:1:1", "host-3:b:2:2"));
  try {
    a->append_event("busy", "late", json::object());
    FAIL("a journal that lost the run wrote to it");
  } catch (const storage::storage_error& e) {
    CHECK(e.code() == storage::errc::fenced);
  }
  b->append_event("busy", "on_time", json::object());
  CHECK(b->events("busy").size() == 1);

  SQLite::Database raw((dir / "cairn.db").string(), SQLite::OPEN_READONLY);
  CHECK(raw.execAndGet("PRAGMA user_version").getInt() == storage::sqlite::schema_version());
  CHECK(storage::sqlite::schema_version() == 9);
}

TEST_CASE("a version 5 journal is migrated in place: its runs keep their workspace on shared storage, no worker yet") {
  testing::temp_dir dir;
  {
    auto current = storage::open_journal(dir / "cairn.db");
    storage::new_run r;
    r.id = "old";
    r.agent = "/bin/agent";
    r.sandbox = "none";
    r.workspace = "/ws/old";
    r.owner = "host-1:a:1:1";
    current->create_run(r);
    // Schema 5 is schema 8 without schema 8's and 7's, then the workers table, its index and runs.workspace_host.
    SQLite::Database raw((dir / "cairn.db").string(), SQLite::OPEN_READWRITE);
    raw.exec(undo_schema_8 + "DROP TRIGGER runs_state; DROP TRIGGER steps_bytes; DROP TRIGGER events_bytes; DROP TRIGGER payloads_bytes; "
             "DROP TABLE run_states; ALTER TABLE runs DROP COLUMN cancel_reason; DROP TABLE journal_info; "
             "DROP TABLE workers; DROP INDEX runs_by_owner; ALTER TABLE runs DROP COLUMN workspace_host; "
             "PRAGMA user_version = 5");
  }
  auto j = storage::open_journal(dir / "cairn.db");
  auto old = j->find_run("old");
  REQUIRE(old);
  CHECK(old->workspace == "/ws/old");
  CHECK(old->workspace_host.empty());
  CHECK(j->workers().empty());
  j->register_worker({"host-1:a:1:1", "host-1", "", 1, 1, storage::now_ms() + 60'000, 0, 0});
  CHECK(j->find_worker("host-1:a:1:1")->runs == 1);
}

TEST_CASE("a version 6 journal is migrated in place: its runs' bytes are counted once, their cancel reasons kept") {
  testing::temp_dir dir;
  std::uint64_t bytes_before = 0;
  {
    auto current = storage::open_journal(dir / "cairn.db");
    storage::new_run r;
    r.id = "old";
    r.agent = "/bin/agent";
    r.sandbox = "none";
    current->create_run(r);
    storage::step_record step;
    step.run_id = "old";
    step.result.name = "plan";
    step.result.output = json{{"text", std::string(5000, 'x')}};  // long enough to be a payload
    current->append_step(step);
    current->append_event("old", "cancel_requested", {{"reason", "enough of it"}});
    current->append_event("old", "note", {{"long", std::string(3000, 'y')}});
    bytes_before = current->bytes_of_run("old");
    // Schema 6 is schema 8 without schema 8's, then the run_states table, its triggers, runs.cancel_reason and journal_info.
    SQLite::Database raw((dir / "cairn.db").string(), SQLite::OPEN_READWRITE);
    raw.exec(undo_schema_8 + "DROP TRIGGER runs_state; DROP TRIGGER steps_bytes; DROP TRIGGER events_bytes; DROP TRIGGER "
             "payloads_bytes; DROP TABLE run_states; ALTER TABLE runs DROP COLUMN cancel_reason; DROP TABLE journal_info; "
             "UPDATE runs SET cancel_requested_at_ms = 1; PRAGMA user_version = 6");
  }
  auto j = storage::open_journal(dir / "cairn.db");
  CHECK(j->bytes_of_run("old") == bytes_before);
  CHECK(j->find_run("old")->cancel_reason == "enough of it");
  CHECK_FALSE(j->run_state("old"));  // written before the journal kept state: the ledger derives it
  // Made by an older cairn, written now by this one.
  CHECK(j->versions().created_by == "a cairn before 0.1.0 (schema 6)");
  CHECK(j->versions().last_written_by == storage::writer_name());
  // What the run writes from now on is counted as it is written.
  j->append_event("old", "later", {{"n", 1}});
  storage::step_record step;
  step.run_id = "old";
  step.result.seq = 1;
  step.result.name = "next";
  step.result.output = json{2};
  j->append_step(step);
  CHECK(j->bytes_of_run("old") == bytes_before + std::string("later").size() + json{{"n", 1}}.dump().size() +
                                      std::string("next").size() + json{2}.dump().size());
  // A run created now keeps its state from the start.
  storage::new_run r;
  r.id = "new";
  r.agent = "/bin/agent";
  r.sandbox = "none";
  j->create_run(r);
  CHECK(j->run_state("new") == json::object());
}

TEST_CASE("processes opening a new journal at the same instant all open it (two workers starting together)") {
  // Every child waits at a barrier (a pipe the parent closes), then opens the
  // same new file: SQLite meets them in rollback mode, where it answers a
  // would-be deadlock with SQLITE_BUSY without waiting.
  for (int round = 0; round < 8; ++round) {
    cairn::testing::temp_dir dir;
    const auto path = dir / "cairn.db";
    int barrier[2];
    REQUIRE(pipe(barrier) == 0);
    std::vector<pid_t> children;
    for (int i = 0; i < 4; ++i) {
      const pid_t pid = fork();
      REQUIRE(pid >= 0);
      if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(barrier[1]);
        char c;
        (void)!read(barrier[0], &c, 1);
        try {
          auto j = cairn::storage::open_journal(path);
          j->create_run({.id = "r" + std::to_string(i), .agent = "/bin/true"});
          _exit(0);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "child %d: %s\n", i, e.what());
          _exit(1);
        }
      }
      children.push_back(pid);
    }
    close(barrier[0]);
    close(barrier[1]);
    for (pid_t pid : children) {
      int status = 0;
      REQUIRE(waitpid(pid, &status, 0) == pid);
      CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
    }
    CHECK(cairn::storage::open_journal(path)->list_runs().size() == 4);
  }
}
