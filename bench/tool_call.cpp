// bench/tool_call: what a tool call through the host costs. In the same run it
// measures the raw operations a call is made of, and a cairn tool call:
//   raw spawn   posix_spawn of the tool program (/bin/cat, which echoes its
//               JSON arguments back), arguments on stdin, result on stdout
//   raw commit  one SQLite WAL commit with synchronous=FULL
//   tool call   ctx.tool("echo", {...}) timed in the agent: the host checks the
//               policy, commits the started record, runs the program, commits
//               the result, answers
// Target: tool call p50 <= 1.3 x (raw spawn + 2 raw commits) p50.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include <SQLiteCpp/SQLiteCpp.h>

#include "bench/stats.hpp"
#include "engine/engine.hpp"
#include "engine/host_memory.hpp"

extern char** environ;

using namespace cairn;
namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

namespace {

double us_since(clock_type::time_point t0) {
  return std::chrono::duration<double, std::micro>(clock_type::now() - t0).count();
}

summary raw_spawn(int n) {
  std::vector<double> us;
  for (int i = 0; i < n; ++i) {
    const std::string args = "{\"i\":" + std::to_string(i) + "}";
    auto t0 = clock_type::now();
    int in[2], out[2];
    if (pipe(in) < 0 || pipe(out) < 0) std::exit(1);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in[0], 0);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_addclose(&actions, in[1]);
    posix_spawn_file_actions_addclose(&actions, out[0]);
    char cat[] = "/bin/cat";
    char* argv[] = {cat, nullptr};
    pid_t pid = 0;
    if (posix_spawn(&pid, cat, &actions, nullptr, argv, environ) != 0) std::exit(1);
    posix_spawn_file_actions_destroy(&actions);
    close(in[0]);
    close(out[1]);
    if (write(in[1], args.data(), args.size()) != static_cast<ssize_t>(args.size())) std::exit(1);
    close(in[1]);
    char buf[256];
    while (read(out[0], buf, sizeof buf) > 0) {
    }
    close(out[0]);
    waitpid(pid, nullptr, 0);
    us.push_back(us_since(t0));
  }
  return summarize(us);
}

summary raw_commit(const fs::path& dir, int n) {
  SQLite::Database d((dir / "raw.db").string(), SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
  d.exec("PRAGMA journal_mode = WAL");
  d.exec("PRAGMA synchronous = FULL");
  d.exec("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)");
  SQLite::Statement insert(d, "INSERT INTO t VALUES (?, '{\"sent\":true}')");
  std::vector<double> us;
  for (int i = 0; i < n; ++i) {
    auto t0 = clock_type::now();
    insert.bind(1, i);
    insert.exec();
    insert.reset();
    us.push_back(us_since(t0));
  }
  return summarize(us);
}

summary tool_calls(const fs::path& dir, int n) {
  auto journal = storage::open_journal(dir / "cairn.db");
  engine::engine_options options;
  options.home = dir / "home";
  engine::engine eng(*journal, options);
  engine::run_request r;
  r.id = "tool-bench";
  r.agent = BENCH_AGENT;
  r.input = {{"steps", n}, {"tool", "echo"}};
  r.workspace = dir / "ws";
  r.policy = engine::parse_policy(
      {{"tools", {{"echo", {{"command", {"/bin/cat"}}, {"input", {{"i", "integer"}}}, {"idempotency", "idempotent"}}}}}});
  eng.submit(r);
  auto run = eng.execute(r.id);
  if (run.status != storage::run_status::completed) {
    std::fprintf(stderr, "bench run failed: %s\n", run.error ? run.error->message.c_str() : "?");
    std::exit(1);
  }
  return summarize(run.output["step_us"].get<std::vector<double>>());
}

}  // namespace

int main(int argc, char** argv) {
  engine::keep_heap_for_runs();  // as `cairn` does
  const int n = argc > 1 ? std::atoi(argv[1]) : 500;
  fs::path dir = fs::temp_directory_path() / ("cairn-bench-tool-" + std::to_string(getpid()));
  fs::create_directories(dir);
  fs::permissions(dir, fs::perms::owner_all | fs::perms::group_exec | fs::perms::others_exec);

  auto spawn = raw_spawn(n);
  auto commit = raw_commit(dir, n);
  auto call = tool_calls(dir, n);

  std::printf("tool_call: %d calls each, microseconds\n", n);
  std::printf("%-52s %9s %9s\n", "", "p50", "p99");
  std::printf("%-52s %9.1f %9.1f\n", "raw spawn of /bin/cat, JSON in and out", spawn.p50, spawn.p99);
  std::printf("%-52s %9.1f %9.1f\n", "raw SQLite WAL commit, synchronous=FULL", commit.p50, commit.p99);
  std::printf("%-52s %9.1f %9.1f\n", "ctx.tool(\"echo\") through the host, journaled", call.p50, call.p99);
  std::printf("ratio: tool call p50 / (spawn + 2 commits) p50 = %.2f (target <= 1.30)\n",
              call.p50 / (spawn.p50 + 2 * commit.p50));
  fs::remove_all(dir);
  return 0;
}
