// A scheduling pass's rule (engine::choose_runs) on the in-memory journal
// and the fake clock: which runs a scheduler starts, and when it must look
// again for a run that a live lease holds. The scheduler's threads are not
// in it; tests/sim runs the same rule through thousands of schedules.
#include <catch2/catch.hpp>

#include <chrono>
#include <set>
#include <string>
#include <vector>

#include "engine/fake_clock.hpp"
#include "engine/scheduler.hpp"
#include "storage/memory/memory_journal.hpp"

using namespace cairn;
using namespace std::chrono_literals;

namespace {

// Owners on another machine: liveness.hpp judges them by their leases alone.
const std::string me = "here:boot-1:100:1";
const std::string other = "elsewhere:boot-2:200:1";

struct journal_at_a_fake_time {
  engine::fake_clock clock;
  storage::memory::database db;
  std::unique_ptr<storage::journal> j = db.open();

  void submit(const std::string& id, const std::string& host = "") {
    storage::new_run r;
    r.id = id;
    r.agent = "/bin/true";
    r.sandbox = "none";
    r.workspace = "/nowhere/" + id;
    r.workspace_host = host;
    j->create_run(r);
    clock.advance(1ms);  // creation order is time order
  }

  void lease(const std::string& owner, std::chrono::milliseconds left) {
    storage::worker_record w;
    w.id = owner;
    w.host = "elsewhere";
    w.started_at_ms = w.renewed_at_ms = clock.wall_ms();
    w.lease_expires_at_ms = clock.wall_ms() + left.count();
    j->register_worker(w);
  }

  engine::schedule_pass pass(std::size_t room = 8, std::set<std::string> skip = {}) {
    return engine::choose_runs(*j, me, "here", clock.wall_ms(), room,
                               [&](const storage::run_brief& b) { return skip.count(b.id) > 0; });
  }
};

std::vector<std::string> ids(const engine::schedule_pass& p) {
  std::vector<std::string> out;
  for (const auto& b : p.start) out.push_back(b.id);
  return out;
}

}  // namespace

TEST_CASE("a pass starts new runs oldest first, no more than it has room for") {
  journal_at_a_fake_time t;
  for (auto id : {"a", "b", "c", "d"}) t.submit(id);
  CHECK(ids(t.pass()) == std::vector<std::string>{"a", "b", "c", "d"});
  CHECK(ids(t.pass(2)) == std::vector<std::string>{"a", "b"});
  CHECK(ids(t.pass(0)).empty());
  // What this scheduler passes over (in flight, resting, not accepted) leaves room for the next.
  CHECK(ids(t.pass(2, {"a"})) == std::vector<std::string>{"b", "c"});
}

TEST_CASE("a run held under a live lease waits for the lease; once it expired the run is taken over") {
  journal_at_a_fake_time t;
  t.submit("held");
  t.submit("free");
  t.lease(other, 10s);
  REQUIRE(t.j->claim_run("held", "", other));

  auto pass = t.pass();
  CHECK(ids(pass) == std::vector<std::string>{"free"});
  REQUIRE(pass.next_expiry_ms);
  CHECK(*pass.next_expiry_ms == t.clock.wall_ms() + 10'000);  // look again exactly then

  t.clock.advance(9'999ms);
  CHECK(ids(t.pass()) == std::vector<std::string>{"free"});
  t.clock.advance(1ms);
  pass = t.pass();
  CHECK(ids(pass) == std::vector<std::string>{"held", "free"});
  CHECK_FALSE(pass.next_expiry_ms);
}

TEST_CASE("a run this process holds is its own to start again") {
  journal_at_a_fake_time t;
  t.submit("mine");
  REQUIRE(t.j->claim_run("mine", "", me));
  CHECK(ids(t.pass()) == std::vector<std::string>{"mine"});
}

TEST_CASE("a run whose workspace is on another machine is left to that machine") {
  journal_at_a_fake_time t;
  t.submit("there", "elsewhere");
  t.submit("here-too", "here");
  t.submit("anywhere");
  CHECK(ids(t.pass()) == std::vector<std::string>{"here-too", "anywhere"});
}

TEST_CASE("a waiting run is started only once its wait is over") {
  journal_at_a_fake_time t;
  t.submit("sleeper");
  REQUIRE(t.j->claim_run("sleeper", "", me));
  t.j->suspend_run("sleeper", storage::wait_spec{"timer", "", 0, t.clock.wall_ms() + 5'000});
  CHECK(ids(t.pass()).empty());
  t.clock.advance(5'000ms);
  CHECK(ids(t.pass()) == std::vector<std::string>{"sleeper"});
}
