// bench/sandbox_start: what it costs to give a run its sandbox. Measures, in
// the same run, a raw `bwrap <the same isolation flags> /usr/bin/true` (spawn
// and reap, as the same unprivileged uid) and a whole cairn run of a one-step
// agent: create the sandbox -> hello/start -> first step journaled and acked ->
// done -> destroy, plus the run's own journal rows.
// Target: cairn p50 <= 1.3 x raw p50.
#include <sys/wait.h>
#include <unistd.h>
#include <grp.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "bench/stats.hpp"
#include "engine/engine.hpp"

using namespace cairn;
namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

namespace {

double ms_since(clock_type::time_point t0) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

summary raw_bwrap(const fs::path& ws, int n) {
  auto user = runtime::resolve_sandbox_user();
  if (user) fs::permissions(ws, fs::perms::all);
  std::vector<std::string> args{"bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop",
                                "ALL", "--clearenv", "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib",
                                "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/bin", "/bin", "--proc", "/proc",
                                "--dev", "/dev", "--tmpfs", "/tmp", "--bind", ws.string(), "/workspace",
                                "/usr/bin/true"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<double> ms;
  for (int i = 0; i < n; ++i) {
    auto t0 = clock_type::now();
    pid_t pid = fork();
    if (pid == 0) {
      if (user && (setgroups(0, nullptr) != 0 || setresgid(user->gid, user->gid, user->gid) != 0 ||
                   setresuid(user->uid, user->uid, user->uid) != 0))
        _exit(126);
      execvp("bwrap", argv.data());
      _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "raw bwrap failed (status %d)\n", status);
      std::exit(1);
    }
    ms.push_back(ms_since(t0));
  }
  return summarize(ms);
}

summary cairn_runs(const fs::path& dir, int n) {
  storage::journal journal(dir / "cairn.db");
  engine::engine_options options;
  options.log_dir = dir / "logs";
  engine::engine eng(journal, options);
  std::vector<double> ms;
  for (int i = 0; i < n; ++i) {
    engine::run_request r;
    r.id = "start-" + std::to_string(i);
    r.agent = BENCH_AGENT;
    r.input = {{"steps", 1}};
    r.workspace = dir / "ws" / r.id;
    auto t0 = clock_type::now();
    eng.submit(r);
    auto run = eng.execute(r.id);
    ms.push_back(ms_since(t0));
    if (run.status != storage::run_status::completed) {
      std::fprintf(stderr, "bench run failed: %s\n", run.error ? run.error->message.c_str() : "?");
      std::exit(1);
    }
  }
  return summarize(ms);
}

}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 100;
  fs::path dir = fs::temp_directory_path() / ("cairn-bench-start-" + std::to_string(getpid()));
  fs::create_directories(dir / "raw-ws");

  auto raw = raw_bwrap(dir / "raw-ws", n);
  auto ours = cairn_runs(dir, n);

  std::printf("sandbox_start: %d sandboxes each, times in milliseconds\n", n);
  std::printf("%-58s %8s %8s\n", "", "p50", "p99");
  std::printf("%-58s %8.2f %8.2f\n", "raw bwrap (same namespaces and mounts) /usr/bin/true", raw.p50, raw.p99);
  std::printf("%-58s %8.2f %8.2f\n", "cairn run: create -> first step acked -> done -> destroy", ours.p50, ours.p99);
  std::printf("ratio: cairn p50 / raw p50 = %.2f (target <= 1.30)\n", ours.p50 / raw.p50);
  fs::remove_all(dir);
  return 0;
}
