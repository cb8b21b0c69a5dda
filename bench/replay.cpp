// bench/replay: how long a run with a long history takes to resume. For a run
// whose journal holds N steps (written through storage, not by an agent), it
// times `execute` from the call to the ack of the first NEW step: sandbox,
// handshake, the streamed replay of all N steps, one live step. Measured in
// the same process: N = 0 (sandbox and handshake alone), N = 10,000 empty
// steps, and N = 256 steps of 4 MiB (1 GiB of history), beside a raw `bwrap
// /usr/bin/true` (bench/host_probe.hpp). Each trial resumes the same run: once
// the new step is acked the host is told to stop, which hands the run back
// pending with its history one or two steps longer.
// Goal (issue 10): 10,000 steps resume in <= 100 ms + the sandbox start; 1 GiB resumes.
// Usage: replay [trials] (default 5).
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "bench/args.hpp"
#include "bench/host_probe.hpp"
#include "bench/stats.hpp"
#include "engine/engine.hpp"
#include "engine/host_memory.hpp"

using namespace cairn;
using bench::clock_type;
namespace fs = std::filesystem;

namespace {

// Notes when the first step past the history is acked, then stops the host.
class first_new_step : public engine::run_observer {
 public:
  first_new_step(std::uint64_t history, std::atomic<bool>& stopping) : history_(history), stopping_(stopping) {}
  void on_step(const storage::step_record& step) override {
    if (acked_ || step.result.seq < history_) return;
    acked_ = clock_type::now();
    stopping_ = true;
  }
  std::optional<clock_type::time_point> acked_;

 private:
  std::uint64_t history_;
  std::atomic<bool>& stopping_;
};

struct bench_host {
  fs::path dir;
  std::unique_ptr<storage::journal> journal;
  std::atomic<bool> stopping{false};
  engine::engine_options options;
  std::unique_ptr<engine::engine> eng;

  explicit bench_host(const fs::path& d) : dir(d), journal(storage::open_journal(d / "cairn.db")) {
    options.home = dir / "home";
    options.stopping = &stopping;
    eng = std::make_unique<engine::engine>(*journal, options);
  }

  // A pending run of bench_agent whose journal holds `steps` steps named as
  // the agent names them, each with `output`. Written with synchronous=NORMAL:
  // building the history is not what is measured.
  void make_run(const std::string& id, int steps, const storage::json& output) {
    const auto t0 = clock_type::now();
    engine::run_request r;
    r.id = id;
    r.agent = BENCH_AGENT;
    r.input = {{"steps", 1'000'000}};
    r.workspace = dir / "ws" / id;
    r.policy = engine::parse_policy({{"limits", {{"journal_mb", 2048}}}});
    eng->submit(r);
    auto writer = storage::open_journal(dir / "cairn.db", {.sync = storage::sync_mode::normal});
    for (int i = 0; i < steps; ++i) {
      storage::step_record s;
      s.run_id = id;
      s.result.seq = static_cast<std::uint64_t>(i);
      s.result.name = "s" + std::to_string(i);
      s.result.output = output;
      writer->append_step(s);
    }
    std::printf("  (built %s: %d steps in %.0f ms)\n", id.c_str(), steps, bench::ms_since(t0));
  }

  // Milliseconds from execute() to the ack of the first new step, per trial.
  std::vector<double> resume(const std::string& id, int trials) {
    std::vector<double> ms;
    for (int t = 0; t < trials; ++t) {
      stopping = false;
      first_new_step watch(journal->step_count(id), stopping);
      const auto t0 = clock_type::now();
      auto run = eng->execute(id, &watch);
      if (!watch.acked_) bench::die("the run did not reach a new step: " + (run.error ? run.error->message : "?"));
      ms.push_back(std::chrono::duration<double, std::milli>(*watch.acked_ - t0).count());
    }
    return ms;
  }
};

}  // namespace

int main(int argc, char** argv) {
  engine::keep_heap_for_runs();  // as `cairn` does
  const int trials = bench::count_arg(argc, argv, 1, 5, "[TRIALS, default 5]");
  const fs::path dir = fs::temp_directory_path() / ("cairn-bench-replay-" + std::to_string(getpid()));
  fs::create_directories(dir / "raw-ws");
  std::printf("replay: %d trials each, times in milliseconds\n", trials);
  bench_host h(dir);
  h.make_run("empty", 0, nullptr);
  h.make_run("ten-thousand", 10'000, nullptr);
  h.make_run("one-gib", 256, std::string(4 * (1 << 20) - 16, 'x'));

  const auto raw = summarize(bench::raw_bwrap(dir / "raw-ws", 20, 1).ms);
  const auto empty = summarize(h.resume("empty", trials));
  const auto ten_k = summarize(h.resume("ten-thousand", trials));
  const auto gib = summarize(h.resume("one-gib", std::max(1, trials / 2)));

  std::printf("%-62s %10s %10s\n", "", "p50", "max~p99");
  std::printf("%-62s %10.2f %10.2f\n", "raw bwrap /usr/bin/true (sandbox start)", raw.p50, raw.p99);
  std::printf("%-62s %10.2f %10.2f\n", "resume, empty history -> first new step acked", empty.p50, empty.p99);
  std::printf("%-62s %10.2f %10.2f\n", "resume, 10,000 steps -> first new step acked", ten_k.p50, ten_k.p99);
  std::printf("%-62s %10.2f %10.2f\n", "resume, 256 x 4 MiB = 1 GiB -> first new step acked", gib.p50, gib.p99);
  std::printf("10,000 steps: %.1f ms + sandbox start (p50 - raw bwrap p50; goal <= 100)\n", ten_k.p50 - raw.p50);
  std::printf("10,000 steps: %.1f ms more than an empty history\n", ten_k.p50 - empty.p50);
  fs::remove_all(dir);
  return 0;
}
