// Hostile agents against the limits of a bwrap sandbox: each runs into one,
// check_limits() names it (the sandbox is killed), and the host is none the
// worse for it.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <vector>

#include "runtime/cgroup.hpp"
#include "runtime/workspace_quota.hpp"
#include "tests/runtime/sandbox_fixture.hpp"

namespace cairn::runtime::test {
namespace {

// The cgroup folders whose processes include `pid`.
std::vector<fs::path> cgroup_folders_of(pid_t pid) {
  std::vector<fs::path> folders;
  for (const auto& parent : detect_cgroups().parents)
    for (const auto& entry : fs::directory_iterator(parent)) {
      std::ifstream procs(entry.path() / "cgroup.procs");
      for (pid_t member; procs >> member;)
        if (member == pid) folders.push_back(entry.path());
    }
  return folders;
}

// The host can still start processes and use memory.
void check_host_unaffected() {
  pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  REQUIRE(child > 0);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  std::vector<char> memory(256u << 20, 1);
  CHECK(memory[memory.size() - 1] == 1);
}

}  // namespace

TEST_CASE_METHOD(bwrap_fixture, "bwrap limits: each sandbox runs in its own cgroup, removed by destroy()") {
  if (!require_cgroups()) return;
  spec.limits.max_memory_bytes = 200u << 20;
  spec.limits.max_processes = 40;
  new_run();
  auto process = box->exec(SANDBOX_PROBE, {"grandchild", unique_token("cairn-cgroup")});
  REQUIRE(next_report(*process)["ok"] == true);
  auto folders = cgroup_folders_of(process->pid());
  REQUIRE(folders.size() == detect_cgroups().parents.size());
  for (const auto& folder : folders) {
    INFO(folder);
    std::ifstream procs(folder / "cgroup.procs");
    int members = 0;
    for (pid_t pid; procs >> pid;) ++members;
    CHECK(members == 4);  // bwrap, its pid 1, the probe and its child
    if (fs::exists(folder / "memory.limit_in_bytes")) {
      std::ifstream limit(folder / "memory.limit_in_bytes");
      std::uint64_t bytes = 0;
      limit >> bytes;
      CHECK(bytes == 200u << 20);
    }
    if (fs::exists(folder / "pids.max")) {
      std::ifstream max(folder / "pids.max");
      std::uint64_t tasks = 0;
      max >> tasks;
      CHECK(tasks == 42);  // bwrap and its pid 1 come on top
    }
  }
  box->destroy();
  for (const auto& folder : folders) CHECK_FALSE(fs::exists(folder));
}

TEST_CASE_METHOD(bwrap_fixture, "bwrap limits: a fork bomb ends with a processes breach") {
  if (!require_cgroups()) return;  // RLIMIT_NPROC alone stops it, unseen by check_limits()
  spec.limits.max_processes = 16;
  new_run();
  auto process = box->exec(SANDBOX_PROBE, {"forkbomb"});
  REQUIRE(next_report(*process)["ok"] == true);
  auto folders = cgroup_folders_of(process->pid());
  auto breach = wait_for_breach(*process);
  REQUIRE(breach);
  CHECK(breach->limit == "processes");
  CHECK_THAT(breach->message, Catch::StartsWith("process limit exceeded") && Catch::Contains("16") &&
                                  Catch::Contains("limits.processes"));
  CHECK(process->poll_exit());  // killed along with the sandbox
  CHECK(process->check_limits()->limit == "processes");
  check_host_unaffected();
  box->destroy();
  for (const auto& folder : folders) CHECK_FALSE(fs::exists(folder));
}

TEST_CASE_METHOD(bwrap_fixture, "bwrap limits: processes together past the memory limit end with a memory breach") {
  if (!require_cgroups()) return;
  spec.limits.max_memory_bytes = 96u << 20;
  new_run();
  // Each one stays under the limit (and under RLIMIT_AS); four together do not.
  auto process = box->exec(SANDBOX_PROBE, {"memhog", "4", std::to_string(40u << 20)});
  REQUIRE(next_report(*process)["ok"] == true);
  auto folders = cgroup_folders_of(process->pid());
  auto breach = wait_for_breach(*process);
  REQUIRE(breach);
  CHECK(breach->limit == "memory");
  CHECK(breach->message ==
        "memory limit exceeded: the sandbox reached its 96 MiB limit and the kernel killed a process; raise "
        "limits.memory_mb");
  CHECK(process->poll_exit());
  check_host_unaffected();
  box->destroy();
  for (const auto& folder : folders) CHECK_FALSE(fs::exists(folder));
}

TEST_CASE_METHOD(bwrap_fixture, "bwrap limits: filling the workspace stops at its quota, not the host's disk") {
  if (!require_quota()) return;  // else the workspace is a plain folder
  auto process = box->exec(SANDBOX_PROBE, {"fill", "/workspace/big"});
  json report = next_report(*process);
  INFO(report.dump());
  CHECK(report["detail"]["error"] == "No space left on device");
  std::uint64_t written = report["detail"]["written"];
  CHECK(written > 16u << 20);  // past the quota: the image has room beyond it
  CHECK(written <= workspace_image_size(16u << 20));
  auto breach = wait_for_breach(*process);
  REQUIRE(breach);
  CHECK(breach->limit == "workspace");
  CHECK(breach->message ==
        "workspace limit exceeded: /workspace is full at its 16 MiB quota; raise limits.workspace_mb");
  CHECK(fs::is_empty(dir.path / "ws" ) == false);
  box->destroy();
  CHECK(fs::is_empty(dir.path / "ws"));  // unmounted: the files wait in the image
  // What was written went into the image, which took no more of the host's
  // disk than its size. Only once unmounted: until then the loop device may
  // still hold writes on their way to the image file.
  struct stat image {};
  REQUIRE(::stat(spec.workspace_image.c_str(), &image) == 0);
  CHECK(static_cast<std::uint64_t>(image.st_blocks) * 512 <= workspace_image_size(16u << 20));
  CHECK(static_cast<std::uint64_t>(image.st_blocks) * 512 >= written);
}

TEST_CASE_METHOD(bwrap_fixture, "bwrap limits: /tmp and /dev/shm fill up at their size") {
  spec.limits.max_tmp_bytes = 4u << 20;
  new_run();
  std::string name = unique_token("cairn-tmp-fill");
  for (const std::string& path : {"/tmp/" + name, "/dev/shm/" + name}) {
    json report = probe({"fill", path});
    INFO(path << ": " << report.dump());
    CHECK(report["detail"]["error"] == "No space left on device");
    std::uint64_t written = report["detail"]["written"];
    CHECK(written >= 3u << 20);
    CHECK(written <= 4u << 20);
    CHECK_FALSE(fs::exists(path));  // not the host's
  }
  check_host_unaffected();
}

TEST_CASE_METHOD(bwrap_fixture, "bwrap limits: a CPU spin ends with a cpu breach") {
  spec.limits.max_cpu_seconds = 1;
  new_run();
  auto process = box->exec(SANDBOX_PROBE, {"spin"});
  REQUIRE(next_report(*process)["ok"] == true);
  auto breach = wait_for_breach(*process);
  REQUIRE(breach);
  CHECK(breach->limit == "cpu");
  CHECK_THAT(breach->message, Catch::StartsWith("cpu limit exceeded") && Catch::Contains("limits.cpu_seconds"));
  CHECK(process->poll_exit());
  check_host_unaffected();
}

TEST_CASE_METHOD(bwrap_fixture, "bwrap limits: a file past the file size limit ends with a file_size breach") {
  spec.limits.max_file_bytes = 1u << 20;
  new_run();
  auto process = box->exec(SANDBOX_PROBE, {"fill", "/tmp/big"});
  auto status = process->wait_for(patience);
  REQUIRE(status);
  CHECK(status->signal == SIGXFSZ);
  auto breach = process->check_limits();
  REQUIRE(breach);
  CHECK(breach->limit == "file_size");
  CHECK(breach->message ==
        "file size limit exceeded: the agent wrote past 1 MiB in one file and was killed (SIGXFSZ); raise "
        "limits.file_mb");
}

TEST_CASE_METHOD(bwrap_fixture, "bwrap limits: a well-behaved agent runs into nothing") {
  auto process = box->exec(SANDBOX_PROBE, {"status"});
  REQUIRE(next_report(*process)["ok"] == true);
  REQUIRE(process->wait_for(patience));
  CHECK_FALSE(process->check_limits());
}

}  // namespace cairn::runtime::test
