// The cgroups of dead hosts' sandboxes are swept; live ones are left alone.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "runtime/cgroup.hpp"
#include "tests/runtime/sandbox_fixture.hpp"

namespace cairn::runtime::test {

TEST_CASE("cgroups: detect_cgroups says what it found") {
  const cgroup_support& support = detect_cgroups();
  INFO(support.detail);
  // Set where the machine is known (tests/vm/guest.sh: a cgroup v2-only kernel).
  if (const char* expected = std::getenv("CAIRN_TEST_CGROUPS"))
    CHECK(std::string(support.mode == cgroup_mode::v2 ? "v2" : support.mode == cgroup_mode::v1 ? "v1" : "none") ==
          expected);
  if (support.mode == cgroup_mode::none) {
    CHECK_THAT(support.detail, Catch::StartsWith("none: totals are per process only"));
    CHECK_FALSE(support.fix.empty());
    // The fix names systemd's way only where systemd runs.
    CHECK((support.fix.find("systemd-run") != std::string::npos) == fs::is_directory("/run/systemd/system"));
    return;
  }
  CHECK(support.parents.size() == (support.mode == cgroup_mode::v1 ? 3u : 1u));
  for (const auto& parent : support.parents) CHECK(fs::is_directory(parent));
}

namespace {

// A process that joins the cgroup `folder` and then waits to be killed.
pid_t start_member(const fs::path& folder) {
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  pid_t member = ::fork();
  if (member == 0) {
    std::ofstream join(folder / "cgroup.procs");
    if (!(join << 0 << std::flush)) ::_exit(1);
    ::close(ready[0]);
    ::close(ready[1]);
    for (;;) ::pause();
  }
  ::close(ready[1]);
  char byte;
  REQUIRE(::read(ready[0], &byte, 1) == 0);  // EOF once the child has joined
  ::close(ready[0]);
  return member;
}

// A folder flocked as a live host flocks its sandboxes' cgroups; unlocked
// and removed (with what runs in it) at the end.
struct held_cgroup {
  fs::path folder;
  int lock = -1;
  explicit held_cgroup(fs::path at) : folder(std::move(at)) {
    REQUIRE(fs::create_directory(folder));
    lock = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    REQUIRE(::flock(lock, LOCK_EX) == 0);
  }
  ~held_cgroup() {
    ::close(lock);
    empty_and_remove_cgroup(folder, std::chrono::steady_clock::now() + 30s);
  }
};

}  // namespace

TEST_CASE_METHOD(bwrap_fixture, "cgroups: a dead host's sandbox cgroup is swept, a live one is not") {
  if (!require_cgroups()) return;
  const cgroup_support& support = detect_cgroups();
  // A world of its own: sweeps look at the parents' direct children, and this
  // parent is held, so other processes' sweeps pass it (and all in it) by.
  held_cgroup world(support.parents.back() / unique_token("sweep-world"));
  cgroup_support only_this_world = support;
  only_this_world.parents = {world.folder};

  // A dead host's sandbox cgroup: a process in it, its lock gone.
  fs::path orphan = world.folder / "dead-host";
  REQUIRE(fs::create_directory(orphan));
  pid_t straggler = start_member(orphan);
  // A live host's: locked, with a process in it.
  held_cgroup live(world.folder / "live-host");
  pid_t live_member = start_member(live.folder);
  // And a real sandbox of this process, in the shared parents.
  std::string token = unique_token("cairn-live-sandbox");
  auto process = box->exec(SANDBOX_PROBE, {"grandchild", token});
  REQUIRE(next_report(*process)["ok"] == true);

  CHECK(sweep_orphaned_cgroups(only_this_world) == 1);
  CHECK_FALSE(fs::exists(orphan));
  int status = 0;
  REQUIRE(::waitpid(straggler, &status, 0) == straggler);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGKILL);
  CHECK(fs::exists(live.folder));
  CHECK(::waitpid(live_member, &status, WNOHANG) == 0);  // still running

  // The shared sweep passes this process's sandbox by (it holds its lock) and this world too.
  sweep_orphaned_cgroups(support);
  CHECK_FALSE(process->poll_exit());
  CHECK(count_processes_with(token) == (box->agent_started() ? 1 : box->pooled() ? 2 : 4));  // as in "kill() ends every process"
  CHECK(fs::exists(live.folder));
  CHECK(::waitpid(live_member, &status, WNOHANG) == 0);
  ::kill(live_member, SIGKILL);
  REQUIRE(::waitpid(live_member, &status, 0) == live_member);
}

}  // namespace cairn::runtime::test
