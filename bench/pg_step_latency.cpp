// One step's commit on a PostgreSQL journal against the floor the server
// sets: a raw one-row INSERT committed alone (one round trip), same row
// shape, same connection settings, measured in the same run, interleaved.
// The goal of issue 13 is a ratio <= 1.3.
//
// pg_step_latency [URL] [STEPS]: without a URL, a private throwaway cluster
// (tests/support/pg_cluster.hpp).
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "bench/raw_pg_journal.hpp"
#include "bench/stats.hpp"
#include "storage/journal.hpp"
#include "tests/support/pg_cluster.hpp"

using namespace cairn;
using clock_type = std::chrono::steady_clock;

namespace {

double micros_since(clock_type::time_point t) {
  return std::chrono::duration<double, std::micro>(clock_type::now() - t).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<testing::pg_cluster> cluster;
  std::string url;
  if (argc > 1 && *argv[1]) {
    url = argv[1];
  } else {
    cluster.emplace();
    url = cluster->fresh_database();
  }
  const int steps = argc > 2 ? std::stoi(argv[2]) : 2000;

  auto j = storage::open_journal(url);
  j->create_run({.id = "bench", .agent = "/bench", .sandbox = "none", .workspace = "/tmp/bench"});
  if (!j->claim_run("bench", "", "bench-worker")) return 1;  // the fenced path, as a worker writes

  bench::raw_pg_steps raw(url);

  std::vector<double> journal_us, group_us, raw_us;
  for (int i = 0; i < steps; ++i) {
    storage::step_record s;
    s.run_id = "bench";
    s.result.seq = static_cast<std::uint64_t>(i);
    s.result.name = "step";
    s.result.ok = true;
    s.result.output = {{"n", 1}};
    s.result.attempt = 1;
    auto t = clock_type::now();
    j->append_step(s);
    journal_us.push_back(micros_since(t));

    // The engine's path: every write is a group commit (engine/ledger.cpp).
    s.result.seq += static_cast<std::uint64_t>(steps);
    const std::function<void(storage::journal&)> write = [&](storage::journal& w) { w.append_step(s); };
    t = clock_type::now();
    if (auto errors = j->write_together({&write, 1}); errors[0]) std::rethrow_exception(errors[0]);
    group_us.push_back(micros_since(t));

    t = clock_type::now();
    raw.insert(i);
    raw_us.push_back(micros_since(t));
  }
  const auto a = summarize(journal_us), g = summarize(group_us), b = summarize(raw_us);
  std::printf("%s, %d steps\n", j->server_version().c_str(), steps);
  std::printf("append_step (fenced) p50 %.0f us  p99 %.0f us\n", a.p50, a.p99);
  std::printf("write_together of it p50 %.0f us  p99 %.0f us\n", g.p50, g.p99);
  std::printf("raw INSERT; COMMIT   p50 %.0f us  p99 %.0f us\n", b.p50, b.p99);
  std::printf("ratio p50 %.2fx (group %.2fx)  p99 %.2fx (group %.2fx)\n", a.p50 / b.p50, g.p50 / b.p50,
              a.p99 / b.p99, g.p99 / b.p99);
}
