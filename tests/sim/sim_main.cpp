// tests/sim/sim: runs the deterministic simulator (sim.hpp) over seeds.
//   sim --seed S [--verbose]      one seed, its trace on stderr with --verbose
//   sim --seeds N [--from K]      seeds K .. K+N-1; stops at the first failure
//   --twice                       each seed twice: the same trace hash, or a failure
//   --backend memory|sqlite       the journal simulated (sim.hpp's options)
//   --driver model|real           sim.cpp's model of the attempt driver, or the engine's
//   --no-sync                     the in-memory journal's unsafe switch: no commit syncs
// A failure prints "FAILED: seed S: what broke" and how to replay it, and exits 1.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "tests/sim/sim.hpp"

int main(int argc, char** argv) {
  CLI::App app{"cairn's deterministic simulator"};
  std::optional<std::uint64_t> seed;
  std::uint64_t seeds = 100, from = 1;
  bool twice = false;
  cairn::sim::options o;
  app.add_option("--seed", seed, "Run this one seed");
  app.add_option("--seeds", seeds, "How many seeds to run");
  app.add_option("--from", from, "The first seed");
  app.add_option("--fault-events", o.fault_events, "Events with faults before the quiet phase");
  app.add_option("--backend", o.backend, "memory (power cuts, failing writes) or sqlite (the real storage code)")
      ->check(CLI::IsMember({"memory", "sqlite"}));
  app.add_option("--driver", o.driver, "model (sim.cpp's model of the attempt driver) or real (the engine's)")
      ->check(CLI::IsMember({"model", "real"}));
  app.add_flag("--twice", twice, "Run each seed twice and compare the traces");
  app.add_flag("--no-sync", o.no_sync, "Unsafe: the journal never syncs");
  app.add_flag("--verbose", o.verbose, "Print every event");
  CLI11_PARSE(app, argc, argv);
  if (o.no_sync && o.backend != "memory") {
    std::cerr << "sim: --no-sync is the in-memory journal's switch; SQLite's is the cairn_unsafe_no_sync build\n";
    return 2;
  }
  if (seed) {
    from = *seed;
    seeds = 1;
  }

  const auto started = std::chrono::steady_clock::now();
  std::uint64_t events = 0, runs = 0;
  for (std::uint64_t s = from; s < from + seeds; ++s) {
    o.seed = s;
    const auto out = cairn::sim::simulate(o);
    events += out.events;
    runs += static_cast<std::uint64_t>(out.runs);
    if (!out.ok) {
      std::cout << fmt::format("FAILED: seed {}: {}\nreplay it: {} --seed {} --backend {} --driver {} --verbose{}\n", s,
                               out.failure, argv[0], s, o.backend, o.driver, o.no_sync ? " --no-sync" : "");
      return 1;
    }
    if (twice) {
      const auto again = cairn::sim::simulate(o);
      if (again.trace_hash != out.trace_hash) {
        std::cout << fmt::format("FAILED: seed {} is not deterministic: trace {:016x}, then {:016x}\n", s,
                                 out.trace_hash, again.trace_hash);
        return 1;
      }
    }
    if (seeds == 1) std::cout << fmt::format("seed {}: ok, {} events, {} runs ended, trace {:016x}\n", s, out.events,
                                             out.runs, out.trace_hash);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::cout << fmt::format("{} seeds ok ({} .. {}): {} simulated runs, {} events in {:.2f} s: {:.0f} runs/s, "
                           "{:.0f} seeds/min\n",
                           seeds, from, from + seeds - 1, runs, events, secs, runs / secs, seeds * (twice ? 2 : 1) * 60 / secs);
  return 0;
}
