// What the in-memory journal models beyond the contract every journal keeps
// (journal_test.cpp runs that on it too): what a power cut keeps, faults at
// commit, and the unsafe switch the simulator's proofs use.
#include "storage/memory/memory_journal.hpp"

#include <functional>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/storage/journal_samples.hpp"

using namespace cairn::storage;
using namespace cairn::storage::samples;

namespace {

using write_fn = std::function<void(journal&)>;

std::vector<std::exception_ptr> together(journal& j, std::vector<write_fn> writes, bool sync_later) {
  return j.write_together(writes, sync_later);
}

}  // namespace

TEST_CASE("a power cut keeps what was synced and forgets the commits made since") {
  memory::database db;
  auto j = db.open();
  j->create_run(a_run("r"));
  j->append_step(ok_step("r", 0, "synced"));
  REQUIRE(db.unsynced_commits() == 0);

  // Committed, seen by everyone, but not synced.
  together(*j, {[](journal& w) { w.append_step(ok_step("r", 1, "later")); }}, true);
  CHECK(db.open()->step_count("r") == 2);
  CHECK(db.unsynced_commits() == 1);

  db.lose_power();
  auto after = db.open();
  CHECK(after->step_count("r") == 1);
  CHECK(after->steps("r").at(0).result.output == "synced");
}

TEST_CASE("a synced commit makes every commit before it durable, another connection's too") {
  memory::database db;
  auto a = db.open();
  auto b = db.open();
  a->create_run(a_run("r"));
  together(*a, {[](journal& w) { w.append_step(ok_step("r", 0, "unsynced")); }}, true);
  b->append_event("r", "note", {{"n", 1}});  // synced: takes the earlier commit with it
  db.lose_power();
  CHECK(db.open()->step_count("r") == 1);
}

TEST_CASE("with sync_mode normal nothing a connection commits survives a power cut by itself") {
  memory::database db;
  db.open()->create_run(a_run("r"));
  auto normal = db.open({.sync = sync_mode::normal});
  normal->append_step(ok_step("r", 0, "x"));
  normal->finish_run("r", run_status::completed, "x", std::nullopt);
  db.lose_power();
  auto after = db.open();
  CHECK(after->step_count("r") == 0);
  CHECK(after->find_run("r")->status == run_status::pending);
  CHECK(after->events("r").empty());
}

TEST_CASE("a power cut undoes an unsynced claim: the old epoch holds again") {
  memory::database db;
  auto j = db.open();
  j->create_run(a_run("r"));
  together(*j, {[](journal& w) { REQUIRE(w.claim_run("r", "", "me")); }}, true);
  CHECK(db.open()->find_run("r")->epoch == 1);
  db.lose_power();
  auto after = db.open()->find_run("r");
  CHECK(after->epoch == 0);
  CHECK(after->owner.empty());
  CHECK(after->status == run_status::pending);
}

TEST_CASE("a fault at commit keeps nothing of the transaction and leaves the database usable") {
  memory::database db;
  auto j = db.open();
  j->create_run(a_run("r"));
  db.inject_faults([](memory::fault_point at) {
    if (at == memory::fault_point::commit) throw storage_error(errc::disk_full, "disk full (injected)");
  });
  auto errors = together(*j,
                         {[](journal& w) { w.append_step(ok_step("r", 0, "a")); },
                          [](journal& w) { w.append_event("r", "note", {}); }},
                         false);
  REQUIRE(errors.size() == 2);
  for (const auto& e : errors) {
    REQUIRE(e);
    try {
      std::rethrow_exception(e);
    } catch (const storage_error& err) {
      CHECK(err.code() == errc::disk_full);
    }
  }
  try {
    j->begin_attempt("r");
    FAIL("the fault did not fail a single write");
  } catch (const storage_error& err) {
    CHECK(err.code() == errc::disk_full);
  }
  db.inject_faults({});
  CHECK(j->step_count("r") == 0);
  CHECK(j->events("r").empty());
  CHECK(j->find_run("r")->attempts == 0);
  CHECK(j->begin_attempt("r") == 1);
}

TEST_CASE("a write refused inside a group is undone alone; the others commit") {
  memory::database db;
  auto j = db.open();
  j->create_run(a_run("r"));
  j->append_step(ok_step("r", 0, "first"));
  auto errors = together(*j,
                         {[](journal& w) {
                            w.append_event("r", "half", {});
                            w.append_step(ok_step("r", 0, "again"));  // conflict: rolls back the event too
                          },
                          [](journal& w) { w.append_step(ok_step("r", 1, "second")); }},
                         false);
  CHECK(errors[0]);
  CHECK_FALSE(errors[1]);
  CHECK(j->step_count("r") == 2);
  CHECK(j->events("r").empty());
}

TEST_CASE("with never_sync (the unsafe switch) a power cut forgets even synced commits") {
  memory::database db;
  db.never_sync(true);
  auto j = db.open();
  j->create_run(a_run("r"));
  j->append_step(ok_step("r", 0, "acknowledged"));
  db.lose_power();
  CHECK_FALSE(db.open()->find_run("r"));
}

TEST_CASE("the in-memory journal's times come from its clock") {
  std::int64_t now = 1'000;
  memory::database db("clocked", [&] { return now; });
  auto j = db.open();
  j->create_run(a_run("r"));
  now = 5'000;
  j->begin_attempt("r");
  j->append_event("r", "note", {});
  auto r = j->find_run("r");
  CHECK(r->created_at_ms == 1'000);
  CHECK(r->updated_at_ms == 5'000);
  CHECK(j->events("r").at(0).at_ms == 5'000);
  CHECK(j->path() == "memory:clocked");
}
