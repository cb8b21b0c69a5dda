// The cgroups of dead hosts' sandboxes are swept; live ones are left alone.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include "runtime/cgroup.hpp"
#include "tests/runtime/sandbox_fixture.hpp"

namespace cairn::runtime::test {

TEST_CASE("cgroups: detect_cgroups says what it found") {
  const cgroup_support& support = detect_cgroups();
  INFO(support.detail);
  if (support.mode == cgroup_mode::none) {
    CHECK_THAT(support.detail, Catch::StartsWith("none: totals are per process only"));
    CHECK_FALSE(support.fix.empty());
    return;
  }
  CHECK(support.parents.size() == (support.mode == cgroup_mode::v1 ? 3u : 1u));
  for (const auto& parent : support.parents) CHECK(fs::is_directory(parent));
}

TEST_CASE_METHOD(bwrap_fixture, "cgroups: a dead host's sandbox cgroup is swept, a live one is not") {
  if (!require_cgroups()) return;
  const cgroup_support& support = detect_cgroups();
  // A host's sandbox cgroup with a process in it; then the host dies (its
  // lock goes), leaving the process behind.
  fs::path orphan = support.parents.back() / unique_token("dead-host");
  REQUIRE(fs::create_directory(orphan));
  int host_lock = ::open(orphan.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  REQUIRE(::flock(host_lock, LOCK_EX) == 0);  // meanwhile other test processes' sweeps pass it by
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  pid_t straggler = ::fork();
  if (straggler == 0) {
    ::close(host_lock);
    std::ofstream join(orphan / "cgroup.procs");
    if (!(join << 0 << std::flush)) ::_exit(1);
    ::close(ready[0]);
    ::close(ready[1]);
    for (;;) ::pause();
  }
  ::close(ready[1]);
  char byte;
  REQUIRE(::read(ready[0], &byte, 1) == 0);  // EOF once the child has joined
  ::close(ready[0]);
  ::close(host_lock);

  std::string token = unique_token("cairn-live-sandbox");
  auto process = box->exec(SANDBOX_PROBE, {"grandchild", token});
  REQUIRE(next_report(*process)["ok"] == true);

  sweep_orphaned_cgroups(support);
  // Or another test process's sweep got there first, and may still be at it.
  auto deadline = std::chrono::steady_clock::now() + 5s;
  while (fs::exists(orphan) && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(10ms);
  CHECK_FALSE(fs::exists(orphan));
  int status = 0;
  REQUIRE(::waitpid(straggler, &status, 0) == straggler);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGKILL);
  CHECK_FALSE(process->poll_exit());
  CHECK(count_processes_with(token) == 4);
}

}  // namespace cairn::runtime::test
