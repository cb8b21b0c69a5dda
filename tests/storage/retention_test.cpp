// Retention in the journal (storage/journal.hpp delete_run, space,
// reclaim_space), on every backend.
#include <catch2/catch.hpp>

#include <functional>

#include <SQLiteCpp/SQLiteCpp.h>

#include "storage/journal.hpp"
#include "tests/storage/journal_samples.hpp"
#include "tests/support/noise.hpp"
#include "tests/support/test_db.hpp"

using namespace cairn;
using namespace cairn::storage;
using namespace cairn::storage::samples;

namespace {

std::optional<errc> code_of(const std::function<void()>& f) {
  auto e = error_from(f);
  return e ? std::optional(e->code()) : std::nullopt;
}

std::string message_of(const std::function<void()>& f) {
  auto e = error_from(f);
  return e ? e->what() : "";
}

// A run with two steps, events that share a long payload, a delivered and
// a queued signal and a kept state; ended as `status` (pending: left as is).
void a_full_run(journal& j, const std::string& id, run_status status = run_status::completed,
                const std::string& parent = "") {
  auto r = a_run(id);
  r.parent_id = parent;
  j.create_run(r);
  const std::string conversation = testing::noise(4000, 1);
  j.append_step(ok_step(id, 0, {{"said", conversation}}));
  j.append_event(id, "tool_started", {{"messages", json::array({conversation})}}, 1);
  j.append_event(id, "tool_started", {{"messages", json::array({conversation, "and more"})}}, 1);
  const auto signal = j.enqueue_signal(id, "go", {{"why", "because"}});
  auto delivered = ok_step(id, 1, {{"payload", "because"}});
  j.deliver_signal(signal.id, delivered);
  j.enqueue_signal(id, "later", nullptr);
  j.put_run_state(id, {{"tokens", 12}});
  if (status == run_status::pending) return;
  j.finish_run(id, status, status == run_status::completed ? json{{"done", true}} : json(),
               status == run_status::completed ? std::nullopt
                                               : std::optional(protocol::error_info{"stopped", "cancelled"}));
}

void check_untouched(journal& j, const std::string& id) {
  CHECK(j.find_run(id));
  CHECK(j.steps(id).size() == 2);
  CHECK(j.events(id).size() == 2);
  CHECK(j.events(id)[1].data["messages"][0] == testing::noise(4000, 1));
  CHECK(j.signals(id).size() == 2);
  CHECK(j.run_state(id) == json{{"tokens", 12}});
  CHECK(j.bytes_of_run(id) > 3000);  // the conversation once, compressed
}

}  // namespace

TEST_CASE("delete_run removes an ended run and everything kept for it alone, and nothing of another run") {
  ON_EACH_BACKEND(where);
  auto j = where.open();
  a_full_run(*j, "gone", GENERATE(run_status::completed, run_status::failed, run_status::cancelled));
  a_full_run(*j, "kept");  // the same payloads: stored per run, so they stay with it

  const auto removed = j->delete_run("gone");
  CHECK(removed.id == "gone");
  CHECK(removed.workspace == "/tmp/ws-gone");

  CHECK_FALSE(j->find_run("gone"));
  CHECK(j->steps("gone").empty());
  CHECK(j->events("gone").empty());
  CHECK(j->signals("gone").empty());
  CHECK(j->bytes_of_run("gone") == 0);
  CHECK(code_of([&] { j->run_state("gone"); }) == errc::not_found);
  CHECK(j->list_runs().size() == 1);
  check_untouched(*j, "kept");

  // Gone for every connection, and the id may be used again.
  auto other = where.open();
  CHECK_FALSE(other->find_run("gone"));
  CHECK(other->create_run(a_run("gone")).second);
  CHECK(other->steps("gone").empty());
}

TEST_CASE("workspace pieces are shared by the runs that use them, and go with the last of them") {
  ON_EACH_BACKEND(where);
  auto j = where.open();
  a_full_run(*j, "a");
  a_full_run(*j, "b");
  const std::string bytes = testing::noise(3000, 2);  // a piece's stored bytes, binary
  const blob shared{"sha256:" + std::string(64, '1'), 3000, "r" + bytes};
  const blob own{"sha256:" + std::string(64, '2'), 3, "rabc"};
  const std::vector<std::string> a_uses{shared.digest, own.digest};
  const std::vector<blob> a_blobs{shared, own};
  j->put_blobs("a", a_blobs, a_uses);
  // b uses the shared piece without storing it again; storing a held one changes nothing.
  j->put_blobs("b", std::span<const blob>(&shared, 1), std::vector<std::string>{shared.digest});
  REQUIRE(j->find_blob(shared.digest));
  CHECK(j->find_blob(shared.digest)->data == "r" + bytes);
  CHECK(j->find_blob(shared.digest)->size == 3000);
  CHECK_FALSE(j->find_blob("sha256:" + std::string(64, '3')));
  CHECK(code_of([&] { j->put_blobs("nobody", a_blobs, a_uses); }) == errc::not_found);

  j->delete_run("a");
  CHECK(j->find_blob(shared.digest));  // b still uses it
  CHECK_FALSE(j->find_blob(own.digest));
  j->delete_run("b");
  CHECK_FALSE(j->find_blob(shared.digest));
}

TEST_CASE("delete_run refuses an unknown run, one that has not ended and one a process holds; nothing goes") {
  ON_EACH_BACKEND(where);
  auto j = where.open();
  CHECK(code_of([&] { j->delete_run("nobody"); }) == errc::not_found);

  a_full_run(*j, "pending", run_status::pending);
  CHECK(code_of([&] { j->delete_run("pending"); }) == errc::unfinished);
  CHECK_THAT(message_of([&] { j->delete_run("pending"); }), Catch::Contains("cairn cancel pending"));

  a_full_run(*j, "waiting", run_status::pending);
  j->suspend_run("waiting", {"signal", "approve", 2, std::nullopt});
  CHECK(code_of([&] { j->delete_run("waiting"); }) == errc::unfinished);

  a_full_run(*j, "doubt", run_status::pending);
  j->finish_run("doubt", run_status::in_doubt, nullptr, protocol::error_info{"in doubt", "in_doubt"});
  CHECK(code_of([&] { j->delete_run("doubt"); }) == errc::unfinished);

  a_full_run(*j, "held", run_status::pending);
  auto worker = where.open();
  REQUIRE(worker->claim_run("held", "", "worker-7"));
  CHECK(code_of([&] { j->delete_run("held"); }) == errc::unfinished);
  CHECK_THAT(message_of([&] { j->delete_run("held"); }), Catch::Contains("held by worker-7"));

  for (const char* id : {"pending", "waiting", "doubt", "held"}) check_untouched(*j, id);
  // The holder writes on: nothing of its run went.
  worker->append_step(ok_step("held", 2, "on"));
  CHECK(j->steps("held").size() == 3);
}

TEST_CASE("delete_run and children: an unfinished child keeps its parent; an ended child outlives it as a run of its own") {
  ON_EACH_BACKEND(where);
  auto j = where.open();
  a_full_run(*j, "parent");
  a_full_run(*j, "running-child", run_status::pending, "parent");
  a_full_run(*j, "child", run_status::completed, "parent");

  // The unfinished child would outlive the run it reports to.
  CHECK(code_of([&] { j->delete_run("parent"); }) == errc::unfinished);
  CHECK_THAT(message_of([&] { j->delete_run("parent"); }), Catch::Contains("running-child"));
  j->finish_run("running-child", run_status::cancelled, nullptr, protocol::error_info{"cancelled", "cancelled"});

  j->delete_run("parent");
  CHECK_FALSE(j->find_run("parent"));
  check_untouched(*j, "child");
  CHECK(j->find_run("child")->parent_id == "parent");  // where it came from, though that run is gone
  j->delete_run("child");
  CHECK_FALSE(j->find_run("child"));

  // A child whose parent has not ended stays: the parent may still wait for it or read it.
  a_full_run(*j, "live-parent", run_status::pending);
  a_full_run(*j, "done-child", run_status::completed, "live-parent");
  CHECK(code_of([&] { j->delete_run("done-child"); }) == errc::unfinished);
  CHECK_THAT(message_of([&] { j->delete_run("done-child"); }), Catch::Contains("live-parent"));
  check_untouched(*j, "done-child");
}

TEST_CASE("delete_run in a group commit: a refused run fails alone, the others go") {
  ON_EACH_BACKEND(where);
  auto j = where.open();
  a_full_run(*j, "a");
  a_full_run(*j, "live", run_status::pending);
  a_full_run(*j, "b");
  const std::vector<std::function<void(journal&)>> writes = {
      [](journal& w) { w.delete_run("a"); },
      [](journal& w) { w.delete_run("live"); },
      [](journal& w) { w.delete_run("nobody"); },
      [](journal& w) { w.delete_run("b"); },
  };
  const auto errors = j->write_together(writes);
  CHECK_FALSE(errors[0]);
  CHECK(code_of([&] { std::rethrow_exception(errors[1]); }) == errc::unfinished);
  CHECK(code_of([&] { std::rethrow_exception(errors[2]); }) == errc::not_found);
  CHECK_FALSE(errors[3]);
  CHECK_FALSE(j->find_run("a"));
  CHECK_FALSE(j->find_run("b"));
  check_untouched(*j, "live");
}

TEST_CASE("a step stays write-once while its run has not ended, whoever asks the database") {
  testing::temp_dir dir;
  const auto db = dir / "cairn.db";
  auto j = open_journal(db);
  a_full_run(*j, "live", run_status::pending);
  SQLite::Database raw(db.string(), SQLite::OPEN_READWRITE);
  CHECK_THROWS_WITH(raw.exec("DELETE FROM steps WHERE run_id = 'live'"), Catch::Contains("write-once"));
  CHECK(j->steps("live").size() == 2);
}

TEST_CASE("SQLite gives the space of deleted runs back to the file system, in slices") {
  testing::temp_dir dir;
  const auto db = dir / "cairn.db";
  {
    auto j = open_journal(db);
    SQLite::Database raw(db.string(), SQLite::OPEN_READONLY);
    CHECK(raw.execAndGet("PRAGMA auto_vacuum").getInt() == 2);  // incremental, from the start
    for (int i = 0; i < 40; ++i) {
      const auto id = "r" + std::to_string(i);
      j->create_run(a_run(id));
      for (int s = 0; s < 5; ++s) j->append_step(ok_step(id, s, testing::noise(30'000, i * 5 + s)));
      j->finish_run(id, run_status::completed, nullptr, std::nullopt);
    }
    const auto full = j->space();
    CHECK(full.bytes > 4'000'000);
    for (int i = 0; i < 40; ++i) j->delete_run("r" + std::to_string(i));
    const auto deleted = j->space();
    CHECK(deleted.bytes == full.bytes);  // freed, not yet given back
    CHECK(deleted.free_bytes > 3'000'000);

    const auto slice = j->reclaim_space(1 << 20);  // about 1 MiB a slice
    CHECK(slice.free_bytes < deleted.free_bytes);
    CHECK(slice.free_bytes > 0);
    for (auto left = slice; left.free_bytes > 0;) left = j->reclaim_space(1 << 20);
    CHECK(j->space().bytes < full.bytes / 4);
  }
  CHECK(std::filesystem::file_size(db) < 1'000'000);  // the file itself, once the last connection closed
}

TEST_CASE("space and reclaim_space answer on every backend") {
  ON_EACH_BACKEND(where);
  auto j = where.open();
  a_full_run(*j, "a");
  j->delete_run("a");
  const auto left = j->reclaim_space(1 << 20);
  CHECK(left.free_bytes == 0);
  if (where_backend != "memory") CHECK(j->space().bytes > 0);
}

TEST_CASE("others_wrote: SQLite tells another connection's commits from its own") {
  testing::temp_dir dir;
  const auto db = dir / "cairn.db";
  auto gc = open_journal(db);
  auto other = open_journal(db);
  CHECK_FALSE(gc->others_wrote());  // nothing since it opened
  a_full_run(*gc, "mine");
  gc->delete_run("mine");
  CHECK_FALSE(gc->others_wrote());  // its own commits do not count
  other->create_run(a_run("theirs"));
  CHECK(gc->others_wrote());
  CHECK_FALSE(gc->others_wrote());  // since it last asked
  CHECK(other->others_wrote());     // gc's commits, for the other
}

TEST_CASE("others_wrote answers true where the backend cannot tell") {
  ON_EACH_BACKEND(where);
  if (where_backend == "sqlite") return;
  auto j = where.open();
  CHECK(j->others_wrote());
}
