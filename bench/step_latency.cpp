// bench/step_latency: the cost of one durable step in a sandboxed run, next to
// the raw operations it is made of, measured in the same run:
//   - a raw SQLite WAL commit of the same row (synchronous=FULL and NORMAL)
//   - a round trip over a Unix socket pair (what the channel uses)
// Target: step p50 <= 1.3 x (raw commit + round trip) at FULL; < 100 us at NORMAL.
// The same empty step from the Python and JavaScript SDKs, against the C++
// SDK's: p50 <= 2 x for Python, <= 1.5 x for JavaScript.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "bench/args.hpp"
#include "bench/raw_journal.hpp"
#include "bench/round_trip.hpp"
#include "bench/stats.hpp"
#include "engine/engine.hpp"
#include "engine/host_memory.hpp"

using namespace cairn;
namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

namespace {

double us_since(clock_type::time_point t0) {
  return std::chrono::duration<double, std::micro>(clock_type::now() - t0).count();
}

// One INSERT per transaction into a table shaped like the journal's steps.
void raw_commit(const fs::path& dir, const char* sync, int round, int n, std::vector<double>& us) {
  auto d = bench::open_raw_journal(dir / (std::string("raw-") + sync + ".db"), sync);
  SQLite::Statement insert(d, bench::raw_insert_step);
  for (int i = round * n; i < (round + 1) * n; ++i) {
    auto t0 = clock_type::now();
    SQLite::Transaction tx(d);
    bench::insert_raw_step(insert, "bench", i);
    tx.commit();
    us.push_back(us_since(t0));
  }
}


void durable_steps(const fs::path& dir, storage::sync_mode sync, int round, int n, std::vector<double>& us,
                   const char* agent = BENCH_AGENT, const std::string& sdk = "cpp") {
  std::string db = sync == storage::sync_mode::full ? "full" : "normal";
  std::string name = db + "-" + sdk + "-" + std::to_string(round);
  auto journal = storage::open_journal(dir / (db + ".db"), {.sync = sync});
  engine::engine_options options;
  options.home = dir / "home";
  engine::engine eng(*journal, options);
  engine::run_request r;
  r.id = name;
  r.agent = agent;
  r.input = {{"steps", n}};
  r.workspace = dir / "ws" / name;
  eng.submit(r);
  auto run = eng.execute(r.id);
  if (run.status != storage::run_status::completed) {
    std::fprintf(stderr, "bench run failed: %s\n", run.error ? run.error->message.c_str() : "?");
    std::exit(1);
  }
  for (double v : run.output["step_us"]) us.push_back(v);
}

}  // namespace

int main(int argc, char** argv) {
  engine::keep_heap_for_runs();  // as `cairn` does
  // Rounds interleave the raw and the durable measurements so that both see
  // the same disk: a VM's fsync latency drifts by 2x within a minute.
  const int n = bench::count_arg(argc, argv, 1, 2000, "[STEPS, default 2000]");
  const int rounds = 5, per_round = std::max(1, n / rounds);
  fs::path dir = fs::temp_directory_path() / ("cairn-bench-" + std::to_string(getpid()));
  fs::create_directories(dir);

  std::vector<double> full, normal, step_full, step_normal, step_python, step_js;
  auto rtt = bench::socketpair_round_trip(n);
  for (int round = 0; round < rounds; ++round) {
    raw_commit(dir, "FULL", round, per_round, full);
    durable_steps(dir, storage::sync_mode::full, round, per_round, step_full);
    durable_steps(dir, storage::sync_mode::full, round, per_round, step_python, PYTHON_BENCH_AGENT, "python");
    durable_steps(dir, storage::sync_mode::full, round, per_round, step_js, JS_BENCH_AGENT, "js");
    raw_commit(dir, "NORMAL", round, per_round, normal);
    durable_steps(dir, storage::sync_mode::normal, round, per_round, step_normal);
  }
  auto f = summarize(full), nm = summarize(normal), sf = summarize(step_full), sn = summarize(step_normal);
  auto py = summarize(step_python), js = summarize(step_js);

  std::printf("step_latency: %d empty steps per mode in one bwrap sandbox per round, %d rounds; microseconds\n",
              per_round * rounds, rounds);
  std::printf("%-40s %10s %10s\n", "", "p50", "p99");
  std::printf("%-40s %10.1f %10.1f\n", "socketpair round trip", rtt.p50, rtt.p99);
  std::printf("%-40s %10.1f %10.1f\n", "raw SQLite WAL commit, synchronous=FULL", f.p50, f.p99);
  std::printf("%-40s %10.1f %10.1f\n", "raw SQLite WAL commit, synchronous=NORMAL", nm.p50, nm.p99);
  std::printf("%-40s %10.1f %10.1f\n", "durable step, journal FULL", sf.p50, sf.p99);
  std::printf("%-40s %10.1f %10.1f\n", "durable step, journal NORMAL", sn.p50, sn.p99);
  std::printf("%-40s %10.1f %10.1f\n", "durable step, FULL, Python SDK", py.p50, py.p99);
  std::printf("%-40s %10.1f %10.1f\n", "durable step, FULL, JavaScript SDK", js.p50, js.p99);
  std::printf("ratio FULL:   step p50 / (raw commit + round trip) p50 = %.2f (target <= 1.30)\n",
              sf.p50 / (f.p50 + rtt.p50));
  std::printf("ratio NORMAL: step p50 / (raw commit + round trip) p50 = %.2f; step p50 = %.1f us (target < 100)\n",
              sn.p50 / (nm.p50 + rtt.p50), sn.p50);
  std::printf("ratio Python:     step p50 / C++ SDK step p50 (FULL) = %.2f (target <= 2.00)\n", py.p50 / sf.p50);
  std::printf("ratio JavaScript: step p50 / C++ SDK step p50 (FULL) = %.2f (target <= 1.50)\n", js.p50 / sf.p50);
  bench::remove_bench_folder(dir);
  return 0;
}
