// bench/sandbox_start: what it costs to give a run its sandbox. Measures, in
// the same run, a raw `bwrap <the same isolation flags> /usr/bin/true` (spawn
// and reap, as the same unprivileged uid) and whole cairn runs of a one-step
// agent, cold (the sandbox made for the run) and warm (taken from a pool of
// ready sandboxes, refilled between runs): submit -> first step journaled
// and acked, and submit -> done -> sandbox destroyed, each run started as
// `cairn run` starts one (engine::start: its creation is synced by its
// first step's commit); with the CPU each run cost the host (this process
// and every process it started, by the kernel's task clock: the sandboxes,
// their pid 1 and their agents included; a warm run is charged the making of
// its replacement). The raw start is counted the same way, its fork and
// wait included; beside it, a bare fork and exec of /usr/bin/true as the
// same uid, the least any process-per-run sandbox costs on this machine.
// "agent started": the pool also starts the agent (warm_pool_options::start_agents), as
// `cairn serve --warm N --prestart` does; for the C++ agent and the same
// agent in Python (bench_agent.py), whose interpreter and imports a warm
// sandbox with a launcher still has to start.
// Targets: cold p50 <= 1.5 x raw p50; warm p50 (to the first step) <= 3 ms;
// CPU per run <= 2 x raw bwrap's.
// `sandbox_start N SHAPE` runs N of each shape whose name holds SHAPE (say
// "warm"), after the raw starts.
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

#include "bench/args.hpp"
#include "bench/host_probe.hpp"
#include "bench/stats.hpp"
#include "engine/engine.hpp"
#include "engine/host_memory.hpp"

using namespace cairn;
namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

namespace {

double ms_since(clock_type::time_point t0) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

// This process, its threads and every process it starts (bench::tree_cpu),
// opened before any of them.
const std::optional<bench::tree_cpu> tree = bench::tree_cpu::open();

// CPU of this process and all it started so far, in ms; without the
// counter, of this process and its reaped children.
double cpu_ms() {
  if (tree) return 1e3 * tree->seconds();
  double total = 0;
  for (int who : {RUSAGE_SELF, RUSAGE_CHILDREN}) {
    rusage u{};
    getrusage(who, &u);
    total += u.ru_utime.tv_sec * 1e3 + u.ru_utime.tv_usec / 1e3 + u.ru_stime.tv_sec * 1e3 + u.ru_stime.tv_usec / 1e3;
  }
  return total;
}

struct first_step : engine::run_observer {
  clock_type::time_point at{};
  void on_step(const storage::step_record&) override {
    if (at == clock_type::time_point{}) at = clock_type::now();
  }
};

struct measured {
  summary first_step, whole;
  double cpu_ms_per_run = 0;
  int pooled = 0;
};

measured cairn_runs(const fs::path& dir, int n, std::size_t warm, bool quota, bool start_agents = false,
                    const char* agent = BENCH_AGENT) {
  auto journal = storage::open_journal(dir / "cairn.db");
  engine::engine_options options;
  options.home = dir / "home";
  runtime::warm_pool_options pool;
  pool.size = warm;
  pool.folder = options.home / "warm";
  pool.start_agents = start_agents;
  engine::policy policy = engine::default_policy();
  if (!quota) policy.limits.max_workspace_bytes = 0;
  pool.limits = policy.limits;
  fs::create_directories(options.home);
  options.backends = engine::default_backends(pool);
  auto backend = options.backends("bwrap");
  options.backends = [backend](const std::string&) { return backend; };
  engine::engine eng(*journal, options);
  std::vector<double> first_ms, whole_ms;
  double cpu = 0;
  measured m;
  for (int i = 0; i < n; ++i) {
    if (warm > 0 && !backend->wait_warm(warm, std::chrono::seconds(30)))
      bench::die("the warm pool did not fill: " + backend->warm_error().value_or("?"));
    engine::run_request r;
    r.id = fmt::format("start-{}-{}", warm, i);
    r.agent = agent;
    r.input = {{"steps", 1}};
    r.policy = policy;
    first_step seen;
    const double cpu0 = cpu_ms();
    auto t0 = clock_type::now();
    eng.start(r);
    auto run = eng.execute(r.id, &seen);
    whole_ms.push_back(ms_since(t0));
    first_ms.push_back(std::chrono::duration<double, std::milli>(seen.at - t0).count());
    if (run.status != storage::run_status::completed)
      bench::die("bench run failed: " + (run.error ? run.error->message : std::string("?")));
    if (warm > 0) backend->wait_warm(warm, std::chrono::seconds(30));  // its replacement's CPU is this run's
    cpu += cpu_ms() - cpu0;
  }
  m.first_step = summarize(first_ms);
  m.whole = summarize(whole_ms);
  m.cpu_ms_per_run = cpu / n;
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  engine::keep_heap_for_runs();  // as `cairn` does
  const int n = bench::count_arg(argc, argv, 1, 100, "[SANDBOXES per shape, default 100] [SHAPE: only shapes naming it]");
  const std::string only = argc > 2 ? argv[2] : "";
  fs::path dir = fs::temp_directory_path() / ("cairn-bench-start-" + std::to_string(getpid()));
  fs::create_directories(dir / "raw-ws");
  fs::permissions(dir, fs::perms::owner_all | fs::perms::others_exec | fs::perms::group_exec);

  const double raw_cpu0 = cpu_ms();
  auto raw = summarize(bench::raw_bwrap(dir / "raw-ws", n, 1).ms);
  const double raw_cpu = (cpu_ms() - raw_cpu0) / n;
  const double exec_cpu0 = cpu_ms();
  auto exec = summarize(bench::raw_exec(n, 1).ms);
  const double exec_cpu = (cpu_ms() - exec_cpu0) / n;
  struct shape {
    const char* name;
    fs::path folder;
    std::size_t warm;
    bool quota, start_agents;
    const char* agent;
    measured m;
  };
  std::vector<shape> shapes{{"cold, quota image", dir / "cold-q", 0, true, false, BENCH_AGENT, {}},
                            {"warm, quota image", dir / "warm-q", 2, true, false, BENCH_AGENT, {}},
                            {"cold, workspace_mb 0", dir / "cold", 0, false, false, BENCH_AGENT, {}},
                            {"warm, workspace_mb 0", dir / "warm", 2, false, false, BENCH_AGENT, {}},
                            {"agent started, quota image", dir / "started-q", 2, true, true, BENCH_AGENT, {}},
                            {"agent started, workspace_mb 0", dir / "started", 2, false, true, BENCH_AGENT, {}},
                            {"Python, warm, workspace_mb 0", dir / "py-warm", 2, false, false, PY_AGENT, {}},
                            {"Python, agent started, workspace_mb 0", dir / "py-started", 2, false, true, PY_AGENT, {}}};
  std::erase_if(shapes, [&](const shape& s) { return std::string(s.name).find(only) == std::string::npos; });
  if (shapes.empty()) bench::die("no shape's name contains '" + only + "'");
  for (auto& s : shapes) s.m = cairn_runs(s.folder, n, s.warm, s.quota, s.start_agents, s.agent);

  std::printf("sandbox_start: %d sandboxes each, times in milliseconds, CPU per run of the host and all it started\n",
              n);
  std::printf("%-70s %8s %8s %9s\n", "", "p50", "p99", "CPU ms");
  std::printf("%-70s %8.2f %8.2f %9.2f\n", "raw bwrap (same namespaces and mounts) /usr/bin/true", raw.p50, raw.p99,
              raw_cpu);
  std::printf("%-70s %8.2f %8.2f %9.2f\n", "fork + exec /usr/bin/true, no sandbox (this machine's floor)", exec.p50,
              exec.p99, exec_cpu);
  for (const auto& [name, folder, warm, quota, start_agents, agent, m] : shapes) {
    std::printf("%-70s %8.2f %8.2f %9.2f\n", fmt::format("{}: submit -> first step acked", name).c_str(),
                m.first_step.p50, m.first_step.p99, m.cpu_ms_per_run);
    std::printf("%-70s %8.2f %8.2f\n", fmt::format("{}: submit -> done -> destroyed", name).c_str(), m.whole.p50,
                m.whole.p99);
  }
  for (const auto& [name, folder, warm, quota, start_agents, agent, m] : shapes)
    std::printf("%-37s whole run p50 / raw p50 = %5.2f; first step p50 = %6.2f ms; CPU %5.2fx raw\n", name,
                m.whole.p50 / raw.p50, m.first_step.p50, m.cpu_ms_per_run / raw_cpu);
  std::printf("targets: cold whole run <= 1.5x raw; warm first step <= 3 ms; CPU <= 2x raw\n");
  if (!tree) std::printf("%s\n", bench::rusage_caveat);
  bench::remove_bench_folder(dir);
  return 0;
}
