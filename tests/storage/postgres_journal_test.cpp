// What the PostgreSQL journal adds to the contract every backend keeps
// (journal_test.cpp runs that on both): migrations shared by workers that
// start at once, surviving a server restart, errors a user can act on,
// claims that do not wait for a row another worker holds, and wake-ups by
// LISTEN/NOTIFY. Each test has a fresh database of one private cluster.
#include <libpq-fe.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include <catch2/catch.hpp>

#include "storage/journal.hpp"
#include "storage/wakeup.hpp"
#include "tests/storage/journal_samples.hpp"
#include "tests/support/pg_cluster.hpp"

using namespace cairn;
using namespace cairn::storage;
using namespace cairn::storage::samples;
using namespace std::chrono_literals;

namespace {

// A plain libpq connection, to do what no journal call does.
class raw_connection {
 public:
  explicit raw_connection(const std::string& url) : conn_(PQconnectdb(url.c_str())) {
    REQUIRE(PQstatus(conn_) == CONNECTION_OK);
  }
  ~raw_connection() { PQfinish(conn_); }
  raw_connection(const raw_connection&) = delete;
  raw_connection& operator=(const raw_connection&) = delete;

  // The first column of the first row ("" when none); throws with the server's message on failure.
  std::string exec(const std::string& sql) {
    std::unique_ptr<PGresult, decltype(&PQclear)> r(PQexec(conn_, sql.c_str()), &PQclear);
    const auto status = PQresultStatus(r.get());
    if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) throw std::runtime_error(PQresultErrorMessage(r.get()));
    return PQntuples(r.get()) > 0 ? PQgetvalue(r.get(), 0, 0) : "";
  }

 private:
  PGconn* conn_;
};

// What a group commit's member was told: nothing (kept), or the error's code.
std::optional<errc> code_of(const std::exception_ptr& e) {
  if (!e) return std::nullopt;
  try {
    std::rethrow_exception(e);
  } catch (const storage_error& err) {
    return err.code();
  }
}

// Two workers on one fresh database, both runs claimed by worker-1 (`first`),
// "taken" then taken over by worker-2 (`second`).
struct one_run_taken_over {
  const std::string url = testing::shared_pg_cluster().fresh_database();
  std::unique_ptr<journal> first = open_journal(url), second = open_journal(url);
  one_run_taken_over() {
    for (auto id : {"kept", "taken"}) {
      first->create_run(a_run(id));
      REQUIRE(first->claim_run(id, "", "worker-1"));
    }
    REQUIRE(second->claim_run("taken", "worker-1", "worker-2"));
  }
};

template <class F>
bool eventually(F&& condition, std::chrono::seconds deadline = 60s) {
  const auto until = std::chrono::steady_clock::now() + deadline;
  while (std::chrono::steady_clock::now() < until) {
    if (condition()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return condition();
}

}  // namespace

TEST_CASE("postgres: a postgresql:// or postgres:// URL names a PostgreSQL journal") {
  CHECK(is_postgres_url("postgresql://cairn@127.0.0.1:5432/db"));
  CHECK(is_postgres_url("postgres://db.example/cairn"));
  CHECK_FALSE(is_postgres_url("/var/lib/cairn/postgresql://x"));
  CHECK_FALSE(is_postgres_url("cairn.db"));
}

TEST_CASE("postgres: workers opening a fresh database at once create the schema once") {
  auto& cluster = testing::shared_pg_cluster();
  for (int round = 0; round < 3; ++round) {
    const auto url = cluster.fresh_database();
    std::atomic<int> opened{0};
    std::mutex failures_mutex;
    std::vector<std::string> failures;
    std::vector<std::thread> workers;
    for (int w = 0; w < 4; ++w)
      workers.emplace_back([&, w] {
        try {
          auto j = open_journal(url);
          j->create_run(a_run("r" + std::to_string(w)));
          ++opened;
        } catch (const std::exception& e) {
          std::lock_guard lock(failures_mutex);
          failures.push_back(e.what());
        }
      });
    for (auto& t : workers) t.join();
    for (const auto& f : failures) FAIL_CHECK(f);
    CHECK(opened == 4);
    raw_connection raw(url);
    CHECK(raw.exec("SELECT count(*) FROM cairn_schema") == "1");
    CHECK(open_journal(url)->list_runs().size() == 4);
  }
}

TEST_CASE("postgres: a schema newer than this cairn is refused; a read-only journal never creates one") {
  auto& cluster = testing::shared_pg_cluster();
  const auto empty = cluster.fresh_database();
  auto none = error_from([&] { auto j = open_journal(empty, {.read_only = true}); });
  REQUIRE(none);
  CHECK(none->code() == errc::not_found);
  CHECK_THAT(none->what(), Catch::Contains("no cairn journal in"));
  raw_connection raw(empty);
  CHECK(raw.exec("SELECT to_regclass('cairn_schema') IS NULL") == "t");

  const auto url = cluster.fresh_database();
  { auto j = open_journal(url); j->create_run(a_run("r")); }
  {
    auto reader = open_journal(url, {.read_only = true});
    CHECK(reader->list_runs().size() == 1);
    auto refused = error_from([&] { reader->append_event("r", "x", {}); });
    REQUIRE(refused);
    CHECK(refused->code() == errc::read_only);
    CHECK(reader->events("r").empty());
  }
  raw_connection(url).exec("UPDATE cairn_schema SET version = 999");
  for (bool read_only : {false, true}) {
    auto newer = error_from([&] { auto j = open_journal(url, {.read_only = read_only}); });
    REQUIRE(newer);
    CHECK(newer->code() == errc::schema_too_new);
    CHECK_THAT(newer->what(), Catch::Contains("999") && Catch::Contains("upgrade cairn"));
  }
}

TEST_CASE("postgres: a version 7 journal is migrated in place: its runs' bytes are counted once, their cancel "
          "reasons kept") {
  const auto url = testing::shared_pg_cluster().fresh_database();
  std::uint64_t bytes_before = 0;
  {
    auto j = open_journal(url);
    j->create_run(a_run("old"));
    j->append_step(ok_step("old", 0, std::string(5000, 'x')));  // long enough to be a payload
    j->append_event("old", "cancel_requested", {{"reason", "enough of it"}});
    j->append_event("old", "note", {{"long", std::string(3000, 'y')}});
    bytes_before = j->bytes_of_run("old");
  }
  // Version 7 is version 10 without version 10's blobs and run_blobs, then without version 9's (runs_by_created, the trigger that lets an ended run's steps
  // go), then without run_states, its triggers and functions, and runs.cancel_reason.
  raw_connection(url).exec(
      "DROP INDEX events_by_kind; DROP TABLE run_blobs; DROP TABLE blobs; DROP INDEX runs_by_created; DROP TRIGGER steps_no_delete ON steps; DROP FUNCTION "
      "cairn_steps_go_with_their_ended_run(); DROP TRIGGER steps_no_update ON steps; CREATE TRIGGER steps_no_update "
      "BEFORE UPDATE OR DELETE ON steps FOR EACH ROW EXECUTE FUNCTION cairn_steps_are_write_once(); "
      "DROP TRIGGER runs_state ON runs; DROP TRIGGER steps_bytes ON steps; DROP TRIGGER events_bytes ON events; "
      "DROP TRIGGER payloads_bytes ON payloads; DROP FUNCTION cairn_run_state_row(); DROP FUNCTION "
      "cairn_step_bytes(); DROP FUNCTION cairn_event_bytes(); DROP FUNCTION cairn_payload_bytes(); DROP TABLE "
      "run_states; ALTER TABLE runs DROP COLUMN cancel_reason; DROP TABLE journal_info; UPDATE runs SET "
      "cancel_requested_at_ms = 1; "
      "UPDATE cairn_schema SET version = 7");
  auto j = open_journal(url);
  CHECK(j->bytes_of_run("old") == bytes_before);
  CHECK(j->find_run("old")->cancel_reason == "enough of it");
  CHECK_FALSE(j->run_state("old"));
  CHECK(j->versions().created_by == "a cairn before 0.1.0 (schema 7)");
  CHECK(j->versions().last_written_by == writer_name());
  j->append_event("old", "later", {{"n", 1}});
  CHECK(j->bytes_of_run("old") == bytes_before + std::string("later").size() + json{{"n", 1}}.dump().size());
  j->create_run(a_run("new"));
  CHECK(j->run_state("new") == json::object());
  CHECK(raw_connection(url).exec("SELECT version FROM cairn_schema") == "10");
}

TEST_CASE("postgres: a server that is not there is an io error naming host and port and what to check") {
  auto refused = error_from([] { auto j = open_journal("postgresql://cairn@127.0.0.1:1/none"); });
  REQUIRE(refused);
  CHECK(refused->code() == errc::io);
  CHECK_THAT(refused->what(), Catch::Contains("127.0.0.1:1") && Catch::Contains("is the server running? check --db"));

  auto& cluster = testing::shared_pg_cluster();
  auto missing = error_from([&] { auto j = open_journal(cluster.url("no_such_database")); });
  REQUIRE(missing);
  CHECK(missing->code() == errc::io);
  CHECK_THAT(missing->what(), Catch::Contains("no_such_database"));
  auto unknown_user = error_from([&] {
    auto j = open_journal("postgresql://nobody_here@127.0.0.1:" + std::to_string(cluster.port()) + "/postgres");
  });
  REQUIRE(unknown_user);
  CHECK(unknown_user->code() == errc::io);
  CHECK_THAT(unknown_user->what(), Catch::Contains("as user nobody_here"));
}

TEST_CASE("postgres: no message shows the password of --db, in the URL's credentials or as ?password=") {
  CHECK(without_password("postgresql://cairn:s3cret@db:5432/cairn") == "postgresql://cairn:***@db:5432/cairn");
  CHECK(without_password("postgresql://cairn@db/cairn?sslmode=require&password=s3cret&x=1") ==
        "postgresql://cairn@db/cairn?sslmode=require&password=***&x=1");
  CHECK(without_password("postgresql://db/cairn?password=s3cret") == "postgresql://db/cairn?password=***");
  CHECK(without_password("/var/lib/cairn/cairn.db") == "/var/lib/cairn/cairn.db");
  for (const std::string url : {"postgresql://cairn:s3cret@127.0.0.1:1/none", "postgresql://cairn@127.0.0.1:1/none?password=s3cret"}) {
    auto refused = error_from([&] { auto j = open_journal(url); });
    REQUIRE(refused);
    CHECK_THAT(refused->what(), !Catch::Contains("s3cret") && Catch::Contains("***"));
  }
}

TEST_CASE("postgres: a journaled step is final, for the journal and for any other client") {
  const auto url = testing::shared_pg_cluster().fresh_database();
  auto j = open_journal(url);
  j->create_run(a_run("r"));
  j->append_step(ok_step("r", 0, {{"n", 1}}));
  auto again = error_from([&] { j->append_step(ok_step("r", 0, {{"n", 1}})); });
  REQUIRE(again);
  CHECK(again->code() == errc::conflict);
  CHECK_THAT(again->what(), Catch::Contains("r/0 is already journaled"));

  raw_connection raw(url);
  CHECK_THROWS_WITH(raw.exec("UPDATE steps SET name = 'x'"), Catch::Contains("write-once"));
  CHECK_THROWS_WITH(raw.exec("DELETE FROM steps"), Catch::Contains("write-once"));
  CHECK_THROWS_WITH(raw.exec("TRUNCATE steps"), Catch::Contains("write-once"));
  CHECK_THROWS(raw.exec("INSERT INTO steps SELECT * FROM steps ON CONFLICT (run_id, seq) DO UPDATE SET name = 'x'"));
  REQUIRE(j->steps("r").size() == 1);
  CHECK(j->steps("r")[0].result.name == "step-0");
}

TEST_CASE("postgres: a run another worker claimed fences every write of the one that lost it") {
  const auto url = testing::shared_pg_cluster().fresh_database();
  auto first = open_journal(url);
  auto second = open_journal(url);
  first->create_run(a_run("r"));
  REQUIRE(first->claim_run("r", "", "worker-1"));
  first->append_step(ok_step("r", 0, {{"n", 1}}));
  REQUIRE(second->claim_run("r", "worker-1", "worker-2"));

  for (auto write : std::vector<std::function<void()>>{
           [&] { first->append_step(ok_step("r", 1, {{"n", 1}})); },
           [&] { first->append_event("r", "late", {}); },
           [&] { first->begin_attempt("r"); },
           [&] { first->finish_run("r", run_status::completed, "done", std::nullopt); },
       }) {
    auto fenced = error_from(write);
    REQUIRE(fenced);
    CHECK(fenced->code() == errc::fenced);
    CHECK_THAT(fenced->what(), Catch::Contains("worker-2"));
  }
  CHECK(second->step_count("r") == 1);
  CHECK(second->find_run("r")->status == run_status::running);
  second->append_step(ok_step("r", 1, {{"n", 1}}));
  CHECK(second->step_count("r") == 2);
}

TEST_CASE("postgres: claim_run does not wait for a run another worker is holding this moment") {
  const auto url = testing::shared_pg_cluster().fresh_database();
  auto j = open_journal(url, {.busy_timeout = 30s});
  j->create_run(a_run("r"));
  raw_connection other(url);
  other.exec("BEGIN");
  other.exec("SELECT 1 FROM runs WHERE id = 'r' FOR UPDATE");
  const auto before = std::chrono::steady_clock::now();
  CHECK_FALSE(j->claim_run("r", "", "worker-1"));
  CHECK(std::chrono::steady_clock::now() - before < 10s);  // far below busy_timeout: it did not wait
  other.exec("ROLLBACK");
  CHECK(j->claim_run("r", "", "worker-1"));
}

TEST_CASE("postgres: in a group commit one refused write fails alone and the others commit together") {
  const auto url = testing::shared_pg_cluster().fresh_database();
  auto j = open_journal(url);
  for (auto id : {"a", "b", "c"}) j->create_run(a_run(id));
  j->append_step(ok_step("b", 0, {{"n", 1}}));
  std::vector<std::function<void(journal&)>> writes = {
      [](journal& w) { w.append_step(ok_step("a", 0, {{"n", 1}})); },
      [](journal& w) {
        w.append_event("b", "before_conflict", {});
        w.append_step(ok_step("b", 0, {{"n", 1}}));
      },
      [](journal& w) { w.append_step(ok_step("c", 0, {{"n", 1}})); },
      [](journal& w) { w.append_step(ok_step("nope", 0, {{"n", 1}})); },
  };
  auto errors = j->write_together(writes);
  REQUIRE(errors.size() == 4);
  CHECK_FALSE(errors[0]);
  CHECK_FALSE(errors[2]);
  CHECK(code_of(errors[1]) == errc::conflict);
  CHECK(code_of(errors[3]) == errc::not_found);
  CHECK(j->step_count("a") == 1);
  CHECK(j->step_count("c") == 1);
  CHECK(j->events("b").empty());  // rolled back with its member
}

TEST_CASE_METHOD(one_run_taken_over, "postgres: a group commit in which a run was taken over fences that writer alone") {
  // The group goes to the server in one pipeline with its COMMIT; the fence
  // refusing one member must not lose the others, nor keep anything of it.
  std::vector<std::function<void(journal&)>> writes = {
      [](journal& w) { w.append_step(ok_step("kept", 0, {{"n", 1}})); },
      [](journal& w) {
        w.append_event("taken", "late", {});
        w.append_step(ok_step("taken", 0, {{"n", 1}}));
      },
      [](journal& w) { w.append_step(ok_step("kept", 1, {{"n", 2}})); },
  };
  auto errors = first->write_together(writes);
  REQUIRE(errors.size() == 3);
  CHECK_FALSE(errors[0]);
  CHECK_FALSE(errors[2]);
  REQUIRE(errors[1]);
  try {
    std::rethrow_exception(errors[1]);
  } catch (const storage_error& e) {
    CHECK(e.code() == errc::fenced);
    CHECK_THAT(e.what(), Catch::Contains("worker-2"));
  }
  CHECK(second->step_count("kept") == 2);
  CHECK(second->step_count("taken") == 0);
  CHECK(second->events("taken").empty());

  // And a group in which every member is right commits every member.
  std::vector<std::function<void(journal&)>> fine = {
      [](journal& w) { w.append_step(ok_step("kept", 2, {{"n", 3}})); },
      [](journal& w) { w.append_event("kept", "note", {{"k", "v"}}); },
  };
  for (const auto& e : first->write_together(fine)) CHECK_FALSE(e);
  CHECK(second->step_count("kept") == 3);
  CHECK(second->events("kept").size() == 1);
}

TEST_CASE_METHOD(one_run_taken_over,
                 "postgres: a group commit of one write (a step's, the usual case) keeps it or refuses it whole") {
  // Sent without BEGIN and COMMIT: the statement commits alone.
  auto alone = [&](std::function<void(journal&)> write) {
    auto errors = first->write_together({&write, 1});
    REQUIRE(errors.size() == 1);
    return code_of(errors[0]);
  };
  CHECK(alone([](journal& w) { w.append_step(ok_step("kept", 0, {{"n", 1}})); }) == std::nullopt);
  CHECK(alone([](journal& w) { w.append_step(ok_step("kept", 0, {{"n", 2}})); }) == errc::conflict);
  CHECK(alone([](journal& w) { w.append_step(ok_step("taken", 0, {{"n", 1}})); }) == errc::fenced);
  CHECK(alone([](journal& w) { w.append_step(ok_step("nope", 0, {{"n", 1}})); }) == errc::not_found);
  CHECK(alone([](journal& w) { w.append_event("kept", "note", {{"k", "v"}}); }) == std::nullopt);
  CHECK(second->step_count("kept") == 1);
  CHECK(second->steps("kept").at(0).result.output == json{{"n", 1}});
  CHECK(second->step_count("taken") == 0);
  CHECK(second->events("kept").size() == 1);
  // The connection is left outside any transaction: the next group starts clean.
  CHECK(alone([](journal& w) { w.append_step(ok_step("kept", 1, {{"n", 3}})); }) == std::nullopt);
  CHECK(second->step_count("kept") == 2);
}

TEST_CASE("postgres: after a server restart the journal reconnects, and nothing committed is lost") {
  auto& cluster = testing::shared_pg_cluster();
  const auto url = cluster.fresh_database();
  auto j = open_journal(url);
  j->create_run(a_run("r"));
  REQUIRE(j->claim_run("r", "", "worker-1"));
  j->append_step(ok_step("r", 0, {{"n", 1}}));

  std::uint64_t seq = 1;
  for (bool fast : {true, false}) {
    INFO((fast ? "fast" : "immediate") << " shutdown");
    cluster.stop(fast);
    auto down = error_from([&] { j->append_step(ok_step("r", seq, {{"n", 1}})); });
    REQUIRE(down);
    CHECK(down->code() == errc::io);
    CHECK_THAT(down->what(), Catch::Contains("check --db"));
    cluster.start();
    // The call after a failed one succeeds: the journal reconnected.
    CHECK(j->step_count("r") == seq);
    j->append_step(ok_step("r", seq++, {{"n", 1}}));
    CHECK(j->step_count("r") == seq);
    j->append_event("r", "still_held", {});  // the claim outlives the connection

    // The same through a group commit, whose BEGIN goes with its first statement.
    cluster.stop(fast);
    const std::function<void(journal&)> write = [&](journal& w) { w.append_step(ok_step("r", seq, {{"n", 1}})); };
    auto errors = j->write_together({&write, 1});
    REQUIRE(errors[0]);
    CHECK(error_from([&] { std::rethrow_exception(errors[0]); })->code() == errc::io);
    cluster.start();
    errors = j->write_together({&write, 1});
    CHECK_FALSE(errors[0]);
    CHECK(j->step_count("r") == ++seq);
  }
  // A call that finds the connection lost before it wrote anything (a read,
  // or a transaction's first statement) reconnects and runs at once.
  cluster.restart();
  CHECK(j->step_count("r") == seq);
  cluster.restart();
  j->finish_run("r", run_status::completed, "done", std::nullopt);
  CHECK(open_journal(url)->find_run("r")->status == run_status::completed);
}

TEST_CASE("postgres: a wake_listener hears the journal's changes at commit, and again after a restart") {
  auto& cluster = testing::shared_pg_cluster();
  const auto url = cluster.fresh_database();
  auto j = open_journal(url);
  std::mutex mutex;
  std::vector<std::pair<std::string, change>> heard;
  auto heard_has = [&](const std::string& id, change what) {
    std::lock_guard lock(mutex);
    return std::find(heard.begin(), heard.end(), std::pair{id, what}) != heard.end();
  };
  wake_listener listener(url, [&](const std::string& id, change what) {
    std::lock_guard lock(mutex);
    heard.emplace_back(id, what);
  });
  notify(url, "r", change::submitted);  // a no-op: the journal notifies

  j->create_run(a_run("parent"));
  auto child = a_run("child");
  child.parent_id = "parent";
  j->create_run(child);
  CHECK(eventually([&] { return heard_has("parent", change::submitted) && heard_has("child", change::submitted); }));
  j->enqueue_signal("parent", "go", {{"x", 1}});
  CHECK(eventually([&] { return heard_has("parent", change::signalled); }));
  j->request_cancel("parent", "test");
  CHECK(eventually([&] { return heard_has("parent", change::cancel_requested); }));
  REQUIRE(j->claim_run("child", "", "worker-1"));
  j->finish_run("child", run_status::completed, "ok", std::nullopt);
  CHECK(eventually([&] { return heard_has("child", change::ended) && heard_has("parent", change::child_ended); }));
  REQUIRE(j->claim_run("parent", "", "worker-1"));
  j->suspend_run("parent", {"timer", "", 0, now_ms() + 60'000});
  CHECK(eventually([&] { return heard_has("parent", change::waiting); }));
  REQUIRE(j->claim_run("parent", "", "worker-1"));
  j->release_run("parent");
  CHECK(eventually([&] { return heard_has("parent", change::released); }));

  // A refused change is never heard.
  auto refused = error_from([&] { j->enqueue_signal("child", "late", {}); });
  REQUIRE(refused);
  CHECK(refused->code() == errc::finished);

  cluster.restart();
  CHECK(eventually([&] { return heard_has("", change::submitted); }));  // "re-read everything"
  eventually([&] { return !error_from([&] { j->create_run(a_run("after")); }); });
  CHECK(eventually([&] { return heard_has("after", change::submitted); }));
  CHECK_FALSE(heard_has("child", change::signalled));
}
