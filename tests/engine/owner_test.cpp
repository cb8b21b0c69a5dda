#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <fstream>
#include <unistd.h>

#include "engine/owner.hpp"
#include "tests/engine/proc_ticks.hpp"

using namespace cairn::engine;

TEST_CASE("an owner string round-trips and names this process") {
  const auto& me = current_owner();
  CHECK(me.pid == getpid());
  auto parsed = owner_id::parse(me.str());
  REQUIRE(parsed);
  CHECK(parsed->str() == me.str());
  CHECK(check_owner(me.str()) == owner_state::alive);
  CHECK_FALSE(owner_id::parse("garbage"));
}

TEST_CASE("a process that exited is a dead owner, even before it is reaped") {
  pid_t child = fork();
  if (child == 0) _exit(0);
  // Zombie until waitpid: still dead for ownership purposes.
  owner_id o = current_owner();
  o.pid = child;
  siginfo_t info{};
  waitid(P_PID, child, &info, WEXITED | WNOWAIT);
  o.start_ticks = proc_start_ticks(child);  // the zombie's own, so only its state makes it dead
  CHECK(check_owner(o.str()) == owner_state::dead);
  waitpid(child, nullptr, 0);
  CHECK(check_owner(o.str()) == owner_state::dead);
}

TEST_CASE("an owner from before the last reboot is dead; one from another host is unknown") {
  owner_id o = current_owner();
  o.boot_id = "00000000-0000-0000-0000-000000000000";
  CHECK(check_owner(o.str()) == owner_state::dead);
  o = current_owner();
  o.hostname = "some-other-host";
  CHECK(check_owner(o.str()) == owner_state::unknown);
}
