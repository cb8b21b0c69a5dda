// What a workspace checkpoint adds to a step (engine/workspace_checkpoints.hpp),
// measured against the step's commit alone in the same run, on the SQLite
// journal: each step rewrites one 4 KiB file of a workspace of 10 files and
// of 10,000 files (1 GiB at full size), then commits, with its checkpoint or
// without. Also what 100 steps that each rewrite one 1 MiB file store.
//
//   checkpoint [STEPS] [MIB]   default 200 steps, a 1024 MiB workspace
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include <SQLiteCpp/SQLiteCpp.h>

#include "bench/args.hpp"
#include "bench/stats.hpp"
#include "engine/effects.hpp"
#include "engine/ledger.hpp"
#include "engine/workspace_checkpoints.hpp"
#include "storage/journal.hpp"

using namespace cairn;
namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

namespace {

std::string noise(std::mt19937_64& rng, std::size_t n) {
  std::string s(n, '\0');
  for (std::size_t i = 0; i < n; i += 8) {
    const auto x = rng();
    std::memcpy(s.data() + i, &x, std::min<std::size_t>(8, n - i));
  }
  return s;
}

void put(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

storage::step_record a_step(const std::string& run, std::uint64_t seq) {
  storage::step_record s;
  s.run_id = run;
  s.result.seq = seq;
  s.result.name = "s";
  s.result.kind = protocol::step_kind::step;
  s.result.ok = true;
  s.result.output = seq;
  return s;
}

struct shape_result {
  double baseline_ms = 0;
  summary with, without;
};

// `files` files of `file_bytes` each; `steps` steps each rewriting one 4 KiB
// file, alternately with and without a checkpoint.
shape_result measure(const fs::path& dir, int files, std::size_t file_bytes, int steps) {
  std::mt19937_64 rng(files);
  const auto ws = dir / "ws";
  fs::create_directories(ws / "d");
  for (int i = 0; i < files; ++i) put(ws / "d" / ("f" + std::to_string(i)), noise(rng, file_bytes));
  engine::ledger l(storage::open_journal(dir / "cairn.db"));
  auto reads = storage::open_journal(dir / "cairn.db");
  l.create_run({.id = "r", .agent = "/a", .sandbox = "none", .workspace = ws.string()});
  l.claim_run("r", "", "bench");
  shape_result out;
  const auto t0 = clock_type::now();
  engine::workspace_checkpointer c(engine::pieces_of(*reads), ws, {}, false, 1ull << 40, 0);
  auto baseline = c.take();
  l.apply("r", {engine::effects::workspace_baseline{std::move(*baseline)}});
  out.baseline_ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
  std::vector<double> with, without;
  for (int i = 0; i < 2 * steps; ++i) {
    put(ws / "d" / ("f" + std::to_string(static_cast<int>(rng() % files))), noise(rng, 4096));
    const bool checkpoint = i % 2 == 0;
    const auto start = clock_type::now();
    std::optional<engine::workspace_checkpoint> taken;
    if (checkpoint) taken = c.take();
    l.apply("r", {engine::effects::step_committed{a_step("r", static_cast<std::uint64_t>(i)), std::nullopt, 0,
                                                  std::move(taken)}});
    (checkpoint ? with : without).push_back(std::chrono::duration<double, std::micro>(clock_type::now() - start).count());
  }
  out.with = summarize(with);
  out.without = summarize(without);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const char* usage = "[STEPS] [MIB]";
  const int steps = bench::count_arg(argc, argv, 1, 200, usage);
  const int mib = bench::count_arg(argc, argv, 2, 1024, usage);
  const fs::path root = fs::temp_directory_path() / ("cairn-bench-checkpoint-" + std::to_string(::getpid()));
  std::printf("workspace checkpoints: %d steps each rewriting one 4 KiB file, SQLite journal in %s\n", steps,
              root.c_str());
  std::printf("%-28s %12s %14s %14s %12s\n", "workspace", "baseline ms", "step p50 us", "no-cp p50 us", "added p50");
  double added[2] = {0, 0};
  int k = 0;
  for (const auto& [files, label] : {std::pair{10, "10 files"}, std::pair{10'000, "10,000 files"}}) {
    const std::size_t file_bytes = static_cast<std::size_t>(mib) * (1ull << 20) / 10'000;
    const auto dir = root / std::to_string(files);
    fs::create_directories(dir);
    const auto r = measure(dir, files, file_bytes, steps);
    added[k++] = r.with.p50 - r.without.p50;
    std::printf("%-28s %12.1f %14.1f %14.1f %9.1f us\n",
                (std::string(label) + " (" + std::to_string(files * file_bytes >> 20) + " MiB)").c_str(),
                r.baseline_ms, r.with.p50, r.without.p50, r.with.p50 - r.without.p50);
    std::fflush(stdout);
    fs::remove_all(dir);
  }
  std::printf("added cost, 10,000 files / 10 files: %.2fx\n", added[0] > 0 ? added[1] / added[0] : 0.0);

  // 100 steps, each rewriting one 1 MiB file of the workspace: what the pieces take.
  {
    const auto dir = root / "rewrite";
    fs::create_directories(dir / "ws");
    std::mt19937_64 rng(7);
    engine::ledger l(storage::open_journal(dir / "cairn.db"));
    auto reads = storage::open_journal(dir / "cairn.db");
    l.create_run({.id = "r", .agent = "/a", .sandbox = "none", .workspace = (dir / "ws").string()});
    l.claim_run("r", "", "bench");
    engine::workspace_checkpointer c(engine::pieces_of(*reads), dir / "ws", {}, false, 1ull << 40, 0);
    for (int i = 0; i < 100; ++i) {
      put(dir / "ws" / "model.bin", noise(rng, 1 << 20));
      l.apply("r", {engine::effects::step_committed{a_step("r", static_cast<std::uint64_t>(i)), std::nullopt, 0,
                                                    c.take()}});
    }
    SQLite::Database db((dir / "cairn.db").string());
    const auto stored = db.execAndGet("SELECT sum(length(data)) FROM blobs").getInt64();
    std::printf("100 steps rewriting one 1 MiB file (incompressible): %.1f MiB of pieces stored (100 MiB written)\n",
                static_cast<double>(stored) / (1 << 20));
  }
  bench::remove_bench_folder(root);
}
