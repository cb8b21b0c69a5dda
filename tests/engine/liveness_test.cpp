// Owner liveness with workers' leases (engine/liveness.hpp).
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include "engine/liveness.hpp"
#include "tests/support/test_db.hpp"
#include "tests/temp_dir.hpp"

using namespace cairn;
using namespace cairn::engine;

namespace {

storage::worker_record worker(const std::string& id, std::int64_t lease_ms) {
  const auto now = storage::now_ms();
  return {id, "host", "", now, now, now + lease_ms, 0, 0};
}

// The owner string of a process of this machine that has exited.
std::string exited_owner() {
  pid_t child = fork();
  if (child == 0) _exit(0);
  owner_id o = current_owner();
  o.pid = child;
  waitpid(child, nullptr, 0);
  return o.str();
}

}  // namespace

TEST_CASE("an expired lease makes its owner dead even while its process lives; a current one keeps it alive") {
  testing::temp_dir dir;
  auto j = storage::open_journal(testing::test_db(dir.path()));
  const std::string me = current_owner().str();
  CHECK(check_owner(*j, me) == owner_state::alive);  // no row: the process check, as for `cairn run`

  j->register_worker(worker(me, -1));  // paused past its lease, say
  CHECK(check_owner(*j, me) == owner_state::dead);
  CHECK(worker_leases(*j).check(me) == owner_state::dead);
  CHECK_FALSE(worker_leases(*j).expiry(me));

  j->register_worker(worker(me, 60'000));
  CHECK(check_owner(*j, me) == owner_state::alive);
  CHECK(worker_leases(*j).expiry(me) == j->find_worker(me)->lease_expires_at_ms);
  CHECK(worker_leases(*j).any_alive());
  j->remove_worker(me);
}

TEST_CASE("a worker of another machine is judged by its lease alone; one of this machine that is gone is dead") {
  testing::temp_dir dir;
  auto j = storage::open_journal(testing::test_db(dir.path()));
  const auto p = testing::test_prefix();
  const std::string far = "far-" + p + ":0b4e28ba-2fa1-11d2-883f-0016d3cca427:4121:987654";
  CHECK(check_owner(*j, far) == owner_state::unknown);  // no row: only that machine could tell
  j->register_worker(worker(far, 60'000));
  CHECK(check_owner(*j, far) == owner_state::alive);
  j->register_worker(worker(far, -1));
  CHECK(check_owner(*j, far) == owner_state::dead);

  const std::string killed = exited_owner();
  j->register_worker(worker(killed, 60'000));  // its lease has not run out, but nothing of it is left to write
  CHECK(check_owner(*j, killed) == owner_state::dead);
  const worker_leases leases(*j);
  CHECK(leases.check(killed) == owner_state::dead);
  j->remove_worker(far);
  j->remove_worker(killed);
}
