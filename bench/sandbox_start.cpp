// bench/sandbox_start: what it costs to give a run its sandbox. Measures, in
// the same run, a raw `bwrap <the same isolation flags> /usr/bin/true` (spawn
// and reap, as the same unprivileged uid) and a whole cairn run of a one-step
// agent: create the sandbox -> hello/start -> first step journaled and acked ->
// done -> destroy, plus the run's own journal rows.
// Target: cairn p50 <= 1.3 x raw p50.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "bench/host_probe.hpp"
#include "bench/stats.hpp"
#include "engine/engine.hpp"

using namespace cairn;
namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

namespace {

double ms_since(clock_type::time_point t0) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

summary cairn_runs(const fs::path& dir, int n) {
  storage::journal journal(dir / "cairn.db");
  engine::engine_options options;
  options.home = dir / "home";
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

  auto raw = summarize(bench::raw_bwrap(dir / "raw-ws", n, 1).ms);
  auto ours = cairn_runs(dir, n);

  std::printf("sandbox_start: %d sandboxes each, times in milliseconds\n", n);
  std::printf("%-58s %8s %8s\n", "", "p50", "p99");
  std::printf("%-58s %8.2f %8.2f\n", "raw bwrap (same namespaces and mounts) /usr/bin/true", raw.p50, raw.p99);
  std::printf("%-58s %8.2f %8.2f\n", "cairn run: create -> first step acked -> done -> destroy", ours.p50, ours.p99);
  std::printf("ratio: cairn p50 / raw p50 = %.2f (target <= 1.30)\n", ours.p50 / raw.p50);
  fs::remove_all(dir);
  return 0;
}
