// Workers, their leases and the workspaces assigned at first execution
// (storage/journal.hpp), on both backends.
#include <catch2/catch.hpp>

#include <functional>
#include <set>

#include "storage/journal.hpp"
#include "tests/storage/journal_samples.hpp"
#include "tests/support/test_db.hpp"

using namespace cairn;
using namespace cairn::storage;

namespace {

worker_record a_worker(const std::string& id, std::int64_t lease_ms) {
  const auto now = now_ms();
  return {id, "host-" + id, "", now, now, now + lease_ms, 0, 0};
}

// A run with no workspace yet (one a worker assigns at first execution), owned by `owner`.
new_run a_run(const std::string& id, const std::string& owner = "") {
  new_run r = samples::a_run(id);
  r.workspace = "";
  r.owner = owner;
  return r;
}

errc code_of(const std::function<void()>& f) {
  auto e = samples::error_from(f);
  REQUIRE(e);
  return e->code();
}

}  // namespace

TEST_CASE("a registered worker is listed with its lease and the runs it owns") {
  ON_EACH_BACKEND(where);
  auto j = where.open();
  const std::string p;
  auto w = a_worker(p + "w1", 60'000);
  w.workspace_root = "/mnt/shared";
  j->register_worker(w);
  j->create_run(a_run(p + "r1", p + "w1"));
  j->create_run(a_run(p + "r2"));
  REQUIRE(j->claim_run(p + "r2", "", p + "w1"));
  j->create_run(a_run(p + "r3", p + "someone-else"));

  auto found = j->find_worker(p + "w1");
  REQUIRE(found);
  CHECK(found->host == "host-" + p + "w1");
  CHECK(found->workspace_root == "/mnt/shared");
  CHECK(found->started_at_ms == w.started_at_ms);
  CHECK(found->lease_expires_at_ms == w.lease_expires_at_ms);
  CHECK(found->fenced_writes == 0);
  CHECK(found->runs == 2);
  CHECK_FALSE(j->find_worker(p + "nobody"));

  // A finished run is no longer owned.
  j->finish_run(p + "r2", run_status::completed, 1, std::nullopt);
  CHECK(j->find_worker(p + "w1")->runs == 1);

  j->register_worker(a_worker(p + "w2", -1'000));  // its lease has expired: still listed
  bool saw_w1 = false, saw_w2 = false;
  for (const auto& listed : j->workers()) {
    saw_w1 = saw_w1 || listed.id == p + "w1";
    saw_w2 = saw_w2 || (listed.id == p + "w2" && listed.lease_expires_at_ms < now_ms());
  }
  CHECK(saw_w1);
  CHECK(saw_w2);
}

TEST_CASE("workers expired for over 5 minutes and holding no run are forgotten when a worker registers") {
  ON_EACH_BACKEND(where);
  auto j = where.open();
  const auto hour = journal::forgotten_worker_ms;
  j->create_run(a_run("held", "gone-with-a-run"));
  j->register_worker(a_worker("long-gone", -hour - 60'000));
  j->register_worker(a_worker("gone-with-a-run", -hour - 60'000));
  j->register_worker(a_worker("recently-gone", -hour + 60'000));
  j->register_worker(a_worker("alive", 60'000));
  std::set<std::string> listed;
  for (const auto& w : j->workers()) listed.insert(w.id);
  // A run's owner stays listed until its run is taken over; the others for 5 minutes.
  CHECK(listed == std::set<std::string>{"gone-with-a-run", "recently-gone", "alive"});
}

TEST_CASE("renew_lease extends a current lease and reports fenced writes; an expired lease is not revived") {
  ON_EACH_BACKEND(where);
  auto j = where.open();
  const std::string p;
  j->register_worker(a_worker(p + "live", 60'000));
  const auto later = now_ms() + 120'000;
  CHECK(j->renew_lease(p + "live", later, 3));
  auto live = j->find_worker(p + "live");
  CHECK(live->lease_expires_at_ms == later);
  CHECK(live->fenced_writes == 3);

  // Another worker may already have judged it dead and taken its runs.
  j->register_worker(a_worker(p + "paused", -1));
  CHECK_FALSE(j->renew_lease(p + "paused", now_ms() + 60'000, 1));
  CHECK(j->find_worker(p + "paused")->lease_expires_at_ms < now_ms());
  CHECK_FALSE(j->renew_lease(p + "never-registered", now_ms() + 60'000, 0));

  // It re-registers (same id) and holds a lease again.
  j->register_worker(a_worker(p + "paused", 60'000));
  CHECK(j->renew_lease(p + "paused", now_ms() + 60'000, 1));
  CHECK(j->find_worker(p + "paused")->fenced_writes == 1);

  j->remove_worker(p + "live");
  CHECK_FALSE(j->find_worker(p + "live"));
  CHECK_FALSE(j->renew_lease(p + "live", now_ms() + 60'000, 0));
  j->remove_worker(p + "live");  // removing twice is harmless
}

TEST_CASE("a run created without a workspace gets one, once, from the worker that holds it") {
  ON_EACH_BACKEND(where);
  auto owner = where.open();
  auto other = where.open();
  const std::string p;
  owner->create_run(a_run(p + "r"));
  CHECK(owner->find_run(p + "r")->workspace.empty());
  REQUIRE(owner->claim_run(p + "r", "", "worker-a"));
  owner->assign_workspace(p + "r", "/home/a/workspaces/" + p + "r", "host-a");
  auto run = other->find_run(p + "r");
  CHECK(run->workspace == "/home/a/workspaces/" + p + "r");
  CHECK(run->workspace_host == "host-a");
  bool listed = false;
  for (const auto& b : other->schedulable(now_ms()))
    if (b.id == p + "r") {
      listed = true;
      CHECK(b.workspace_host == "host-a");
    }
  CHECK(listed);

  CHECK(code_of([&] { owner->assign_workspace(p + "r", "/elsewhere", ""); }) == errc::conflict);
  CHECK(other->find_run(p + "r")->workspace == "/home/a/workspaces/" + p + "r");
  CHECK(code_of([&] { owner->assign_workspace(p + "missing", "/x", ""); }) == errc::not_found);

  // Fenced like every write of the run's owner.
  other->create_run(a_run(p + "s"));
  REQUIRE(owner->claim_run(p + "s", "", "worker-a"));
  REQUIRE(other->claim_run(p + "s", "worker-a", "worker-b"));
  CHECK(code_of([&] { owner->assign_workspace(p + "s", "/home/a/s", "host-a"); }) == errc::fenced);
  CHECK(other->find_run(p + "s")->workspace.empty());
  other->assign_workspace(p + "s", "/mnt/shared/s", "");
  CHECK(other->find_run(p + "s")->workspace_host.empty());
}

TEST_CASE("new_run's workspace_host is kept") {
  ON_EACH_BACKEND(where);
  auto j = where.open();
  const std::string p;
  auto r = a_run(p + "r");
  r.workspace = "/home/a/ws";
  r.workspace_host = "host-a";
  j->create_run(r);
  CHECK(j->find_run(p + "r")->workspace_host == "host-a");
}

TEST_CASE("is_postgres_url tells a PostgreSQL URL from a SQLite path") {
  CHECK(is_postgres_url("postgresql://cairn@db:5432/cairn"));
  CHECK(is_postgres_url("postgres://db/cairn"));
  CHECK_FALSE(is_postgres_url("/var/lib/cairn/journal.db"));
  CHECK_FALSE(is_postgres_url("postgresql.db"));
  CHECK_FALSE(is_postgres_url("./postgres://x"));
}
