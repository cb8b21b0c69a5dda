// bench/sim: how fast the deterministic simulator (tests/sim) explores: the
// simulated runs it takes to their end per second, the events it plays per
// second and the seeds it gets through per minute, each the median of
// TRIALS passes over the same SEEDS seeds. Goal (issue 41): at least 100,000
// simulated runs and 10,000 seeds per CI minute on this machine. The seeds
// CI runs (tests/sim's CAIRN_SIM_SEEDS, each twice) cost what the last line
// says.
// Usage: sim [trials] [seeds] (default 5, 1000).
#include <chrono>
#include <cstdio>
#include <vector>

#include "bench/args.hpp"
#include "bench/stats.hpp"
#include "tests/sim/sim.hpp"

int main(int argc, char** argv) {
  const int trials = bench::count_arg(argc, argv, 1, 5, "[trials] [seeds]");
  const int seeds = bench::count_arg(argc, argv, 2, 1000, "[trials] [seeds]");
  std::vector<double> runs_per_s, events_per_s, seeds_per_min;
  for (int t = 0; t < trials; ++t) {
    std::uint64_t runs = 0, events = 0;
    const auto started = std::chrono::steady_clock::now();
    for (int s = 1; s <= seeds; ++s) {
      cairn::sim::options o;
      o.seed = static_cast<std::uint64_t>(s);
      const auto out = cairn::sim::simulate(o);
      if (!out.ok) {
        std::fprintf(stderr, "seed %d failed: %s\n", s, out.failure.c_str());
        return 1;
      }
      runs += static_cast<std::uint64_t>(out.runs);
      events += out.events;
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    runs_per_s.push_back(runs / secs);
    events_per_s.push_back(events / secs);
    seeds_per_min.push_back(seeds * 60 / secs);
  }
  const auto r = summarize(runs_per_s), e = summarize(events_per_s), m = summarize(seeds_per_min);
  std::printf("simulator, %d seeds x %d trials (median):\n", seeds, trials);
  std::printf("  simulated runs to their end: %.0f per second (%.0f per minute; goal >= 100,000)\n", r.p50, r.p50 * 60);
  std::printf("  events played:               %.0f per second\n", e.p50);
  std::printf("  seeds:                       %.0f per minute (goal >= 10,000)\n", m.p50);
  std::printf("  CI's 2,000 seeds, each twice: %.1f s\n", 2 * 2000 * 60 / m.p50);
  return 0;
}
