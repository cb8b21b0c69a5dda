// Kills the cairn host process with SIGKILL at many points of a multi-step run
// (exact points inside the engine, and at arbitrary moments from outside),
// resumes it each time, and checks the guarantees users rely on: the run
// completes, every acknowledged step keeps its recorded output, and no
// acknowledged step ran again.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "runtime/workspace_quota.hpp"
#include "storage/journal.hpp"
#include "tests/capabilities.hpp"
#include "tests/support/test_db.hpp"
#include "tests/temp_dir.hpp"

using namespace cairn;
using json = nlohmann::json;

namespace {

constexpr int steps = 10;

// Starts `cairn ARGS...` with CAIRN_HOME=home and, if given, a crash point.
pid_t spawn_cairn(const std::filesystem::path& home, const std::vector<std::string>& args,
                  const std::string& crash_point) {
  std::vector<std::string> argv{CAIRN_BIN};
  argv.insert(argv.end(), args.begin(), args.end());
  const std::string db = testing::journal_of(home);
  pid_t pid = fork();
  if (pid == 0) {
    setenv("CAIRN_HOME", home.c_str(), 1);
    setenv("CAIRN_DB", db.c_str(), 1);
    if (crash_point.empty()) unsetenv("CAIRN_CRASH_POINT");
    else setenv("CAIRN_CRASH_POINT", crash_point.c_str(), 1);
    int log = open((home / "cli.log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(log, 1);
    dup2(log, 2);
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  return pid;
}

int wait_status(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

bool killed(int status) { return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL; }

std::vector<storage::step_record> journaled(const std::filesystem::path& home, const std::string& id) {
  auto j = storage::open_journal(testing::journal_of(home), {.read_only = true});
  return j->steps(id);
}

struct checker {
  const std::filesystem::path& home;
  std::string id;
  std::map<std::uint64_t, json> acked;  // every step ever seen journaled

  // Every step journaled before keeps its output; remembers the new ones.
  void snapshot() {
    auto now = journaled(home, id);
    for (std::size_t i = 0; i < now.size(); ++i) REQUIRE(now[i].result.seq == i);
    for (const auto& [seq, output] : acked) {
      REQUIRE(seq < now.size());
      REQUIRE(now[seq].result.output == output);
    }
    for (const auto& s : now) acked.emplace(s.result.seq, s.result.output);
  }

  // The execution whose result was journaled must be the last execution of
  // that step: nothing ran it again after it was acknowledged.
  void no_step_ran_after_its_ack() {
    std::ifstream in(home / "workspaces" / id / "exec.log");
    std::vector<std::pair<int, std::string>> lines;
    for (std::string line; std::getline(in, line);) {
      std::istringstream f(line);
      int seq;
      std::string nonce;
      f >> seq >> nonce;
      lines.emplace_back(seq, nonce);
    }
    for (const auto& [seq, output] : acked) {
      const std::string nonce = output["nonce"];
      int last = -1, committed = -1;
      for (int i = 0; i < static_cast<int>(lines.size()); ++i) {
        if (lines[i].first != static_cast<int>(seq)) continue;
        last = i;
        if (lines[i].second == nonce) committed = i;
      }
      INFO("step " << seq);
      REQUIRE(committed >= 0);
      REQUIRE(committed == last);
    }
  }

  // The workspace holds each step's write exactly once, the committed one's:
  // what an attempt that died wrote past its last committed step was rolled
  // back to that step's checkpoint before the next attempt began.
  void files_agree_with_the_journal() {
    std::ifstream in(home / "workspaces" / id / "exec.log");
    std::vector<std::string> written, committed;
    for (std::string line; std::getline(in, line);) {
      std::istringstream f(line);
      std::string seq, nonce;
      f >> seq >> nonce;
      written.push_back(seq + " " + nonce);
    }
    for (const auto& [seq, output] : acked) committed.push_back(std::to_string(seq) + " " + output["nonce"].get<std::string>());
    REQUIRE(written == committed);
  }

  void completes() {
    int status = wait_status(spawn_cairn(home, {"resume", id}, ""));
    INFO(std::ifstream(home / "cli.log").rdbuf());
    REQUIRE(WIFEXITED(status));
    REQUIRE(WEXITSTATUS(status) == 0);
    snapshot();
    auto j = storage::open_journal(testing::journal_of(home), {.read_only = true});
    auto run = j->find_run(id);
    REQUIRE(run->status == storage::run_status::completed);
    REQUIRE(acked.size() == steps);
    for (const auto& [seq, output] : acked) REQUIRE(run->output["outputs"][seq] == output);
    no_step_ran_after_its_ack();
    files_agree_with_the_journal();
  }
};

std::vector<std::string> run_args(const std::string& id, const json& input) {
  return {"run", STEP_AGENT, "--id", id, "--input", input.dump()};
}

// Each plan: a run killed at its first crash point, resumed and killed at the
// second, then resumed to its end.
void crash_twice_then_complete(const std::filesystem::path& home,
                               const std::vector<std::pair<std::string, std::string>>& plans, const std::string& prefix) {
  for (std::size_t i = 0; i < plans.size(); ++i) {
    const auto& [first, second] = plans[i];
    DYNAMIC_SECTION(first << " then " << second) {
      checker c{home, prefix + std::to_string(i), {}};
      int status = wait_status(spawn_cairn(home, run_args(c.id, {{"steps", steps}}), first));
      REQUIRE(killed(status));
      c.snapshot();
      status = wait_status(spawn_cairn(home, {"resume", c.id}, second));
      REQUIRE(killed(status));
      c.snapshot();
      c.completes();
    }
  }
}

}  // namespace

TEST_CASE("SIGKILL of the host at exact points of the step lifecycle, twice per run, then resume") {
  testing::temp_dir home;
  std::vector<std::pair<std::string, std::string>> plans;  // first crash, crash during the resume
  for (int n = 1; n <= steps; ++n) {
    const std::string again = n < steps ? "after_commit:1" : "after_hello:1";
    plans.emplace_back("before_commit:" + std::to_string(n), again);
    plans.emplace_back("after_commit:" + std::to_string(n), n < steps ? "before_commit:1" : "before_finish:1");
    plans.emplace_back("after_ack:" + std::to_string(n), n < steps ? "after_ack:1" : "after_spawn:1");
  }
  plans.emplace_back("after_spawn:1", "after_commit:3");
  plans.emplace_back("after_hello:1", "before_commit:2");
  plans.emplace_back("before_finish:1", "before_finish:1");
  crash_twice_then_complete(home.path(), plans, "exact-");
}

TEST_CASE("SIGKILL of the host while it releases the run's quota image, twice, then resume") {
  // The step agent's exec.log, which the checker reads, is among the files
  // released: a release that lost them fails the check.
  if (!testing::require_capability("quota", runtime::detect_workspace_quota().available,
                                   "a run's files are released from a quota image only where one can be mounted"))
    return;
  testing::temp_dir home;
  crash_twice_then_complete(home.path(),
                            {{"workspace_copied:1", "image_doomed:1"},
                             {"image_doomed:1", "workspace_moved_aside:1"},
                             {"workspace_moved_aside:1", "workspace_copied:1"}},
                            "release-");
}

TEST_CASE("SIGKILL of the host from outside at arbitrary moments, then resume --all") {
  testing::temp_dir home;
  for (int k = 0; k < steps; ++k) {
    DYNAMIC_SECTION("after " << k << " steps journaled") {
      checker c{home.path(), "outside-" + std::to_string(k), {}};
      pid_t pid = spawn_cairn(home.path(), run_args(c.id, {{"steps", steps}, {"sleep_ms", 15}}), "");
      // Wait (bounded) for k journaled steps, then kill wherever the host is.
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      for (;;) {
        REQUIRE(std::chrono::steady_clock::now() < deadline);
        try {
          auto j = storage::open_journal(testing::journal_of(home.path()), {.read_only = true});
          if (j->find_run(c.id) && j->steps(c.id).size() >= static_cast<std::size_t>(k)) break;
        } catch (const storage::storage_error& e) {
          REQUIRE(e.code() == storage::errc::not_found);  // the host has not created it yet
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      kill(pid, SIGKILL);
      REQUIRE(killed(wait_status(pid)));
      c.snapshot();

      int status = wait_status(spawn_cairn(home.path(), {"resume", "--all"}, ""));
      REQUIRE(WIFEXITED(status));
      REQUIRE(WEXITSTATUS(status) == 0);
      c.completes();
    }
  }
}
