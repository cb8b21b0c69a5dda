// bench/throughput: durable empty steps per second under the real `cairn
// serve`, beside the raw operation they are made of. For each cell N x S (N
// live runs of S empty steps of bench_agent; N = 1, 16, 64, 256 and S = 100,
// 1,000) it submits the N runs in-process (engine::submit, what `cairn
// submit` does) into a fresh CAIRN_HOME under /var/tmp, then starts `cairn
// serve --max-concurrent N` and times from that start until every run is
// completed: steps/s and runs/s; and steps/s over the stepping alone (the
// journal's first step started -> last step committed: sandbox starts and
// teardowns left out). The journal is synchronous=FULL (its default).
// The raw operation, measured in the same folder just before each round:
// plain SQLite (SQLiteCpp, WAL, synchronous=FULL) committing transactions of
// B empty step rows with B = N: rows/s. Issue 10's goal: >= 10,000 steps/s at
// 64 x 1,000 and steps/s >= 0.5 x raw rows/s.
// A cell whose predicted time (its steps at the best rate measured so far)
// is over the cap is skipped, saying so; a cell runs as many rounds (up to
// --rounds) as fit in the cap, and prints their medians. A cell whose round
// fails (a run failed, or not all completed in time) says why, leaves that
// round's CAIRN_HOME in place, and the matrix goes on.
// usage: throughput [--runs 1,16,64,256] [--steps 100,1000] [--rounds 3]
//                   [--cap SECONDS (default 120; 0: no cap)] [--quick]
//        --quick: --runs 1,16,64 --steps 100 --rounds 1
#include <cmath>
#include <cstdio>
#include <cstring>

#include "bench/host_probe.hpp"
#include "bench/raw_journal.hpp"
#include "bench/stats.hpp"

using namespace cairn;
using bench::clock_type;
using bench::ms_since;
namespace fs = std::filesystem;

namespace {

struct options {
  std::vector<int> runs{1, 16, 64, 256}, steps{100, 1000};
  int rounds = 3;
  double cap_s = 120;
};

std::vector<int> parse_list(const char* text) {
  std::vector<int> out;
  for (const char* p = text; *p;) {
    char* end = nullptr;
    long v = std::strtol(p, &end, 10);
    if (end == p || v < 1) bench::die(std::string("not a list of positive counts: ") + text);
    out.push_back(static_cast<int>(v));
    p = *end == ',' ? end + 1 : end;
    if (*end != ',' && *end != '\0') bench::die(std::string("not a list of positive counts: ") + text);
  }
  return out;
}

options parse_options(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--quick") {
      o.runs = {1, 16, 64};
      o.steps = {100};
      o.rounds = 1;
    } else if (arg == "--runs" && has_value) {
      o.runs = parse_list(argv[++i]);
    } else if (arg == "--steps" && has_value) {
      o.steps = parse_list(argv[++i]);
    } else if (arg == "--rounds" && has_value) {
      o.rounds = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--cap" && has_value) {
      o.cap_s = std::max(0.0, std::atof(argv[++i]));
    } else {
      bench::die("usage: throughput [--runs 1,16,64,256] [--steps 100,1000] [--rounds 3] [--cap SECONDS] [--quick]");
    }
  }
  return o;
}

// Rows per second that plain SQLite commits in transactions of `batch` rows
// each, over at least 1 s and 4 transactions.
double raw_rows_per_s(SQLite::Database& d, int batch) {
  static int call = 0;
  const std::string run = "raw-" + std::to_string(batch) + "-" + std::to_string(call++);
  SQLite::Statement insert(d, bench::raw_insert_step);
  std::int64_t rows = 0;
  const auto t0 = clock_type::now();
  for (int commits = 0; commits < 4 || ms_since(t0) < 1000; ++commits) {
    SQLite::Transaction tx(d);
    for (int i = 0; i < batch; ++i) bench::insert_raw_step(insert, run, rows++);
    tx.commit();
  }
  return 1000.0 * static_cast<double>(rows) / ms_since(t0);
}

struct round_result {
  double wall_ms = 0, runs_per_s = 0, steps_per_s = 0, stepping_steps_per_s = 0;
  double step_p50_ms = 0, step_p99_ms = 0, raw_rows_per_s = 0;
  std::string failure;  // why the round measured nothing ("" when it did); its CAIRN_HOME is left in place
};

round_result one_round(const fs::path& base, SQLite::Database& raw, int n, int s, int round, double limit_ms) {
  round_result r;
  r.raw_rows_per_s = raw_rows_per_s(raw, n);

  const fs::path home = base / ("n" + std::to_string(n) + "-s" + std::to_string(s) + "-" + std::to_string(round));
  const fs::path db = home / "cairn.db", log = home / "serve.log";
  fs::create_directories(home);
  const auto ids = bench::submit_runs(home, "r", n, BENCH_AGENT, {{"steps", s}});

  const auto t0 = clock_type::now();
  pid_t daemon = bench::start_process({CAIRN_BIN, "serve", "--max-concurrent", std::to_string(n)}, home, log);
  bench::running_daemon = daemon;
  auto ended = bench::wait_runs_ended(db, n, daemon, t0, limit_ms, log, true);
  r.wall_ms = ended.ms;
  bench::running_daemon = 0;
  const int serve_exit = bench::stop_process(daemon, std::chrono::seconds(60));
  const auto warnings = bench::serve_warnings(log);
  if (!warnings.empty())
    std::fprintf(stderr, "cairn serve: %zu warnings, first: %s\n", warnings.size(), warnings.front().c_str());
  if (ended.timed_out || ended.other > 0) {
    r.failure = ended.timed_out ? "not all completed within " + std::to_string(static_cast<long>(limit_ms / 1000)) +
                                      " s (" + std::to_string(ended.completed) + " of " + std::to_string(n) + ")"
                                : "a run failed";
    auto journal = storage::open_journal(db, {.read_only = true});
    for (const auto& id : ids)
      if (auto run = journal->find_run(id); run && run->error) {
        r.failure += ": " + run->error->message;
        break;
      }
    r.failure += "; see " + home.string();
    return r;
  }
  if (serve_exit != 0)
    bench::die("cairn serve exited " + std::to_string(serve_exit) + " on SIGTERM; see " + log.string());

  auto journal = storage::open_journal(db, {.read_only = true});
  std::vector<double> step_ms;
  std::int64_t first_started = INT64_MAX, last_committed = 0;
  for (const auto& id : ids) {
    auto run = journal->find_run(id);
    auto recorded = journal->steps(id);
    if (!run || recorded.size() != static_cast<std::size_t>(s) || run->output["step_us"].size() != recorded.size())
      bench::die("run " + id + " did not journal its " + std::to_string(s) + " steps; see " + home.string());
    for (double us : run->output["step_us"]) step_ms.push_back(us / 1000);
    first_started = std::min(first_started, recorded.front().started_at_ms);
    last_committed = std::max(last_committed, recorded.back().finished_at_ms);
  }
  const double steps = static_cast<double>(n) * s;
  r.runs_per_s = 1000.0 * n / r.wall_ms;
  r.steps_per_s = 1000.0 * steps / r.wall_ms;
  r.stepping_steps_per_s = 1000.0 * steps / static_cast<double>(std::max<std::int64_t>(1, last_committed - first_started));
  const auto latency = summarize(std::move(step_ms));
  r.step_p50_ms = latency.p50;
  r.step_p99_ms = latency.p99;

  if (bench::mounts_under(home) == 0) fs::remove_all(home);
  else std::fprintf(stderr, "bench: %s still has mounts; left in place\n", home.c_str());
  return r;
}

round_result medians(const std::vector<round_result>& all) {
  round_result m;
  for (auto field : {&round_result::wall_ms, &round_result::runs_per_s, &round_result::steps_per_s,
                     &round_result::stepping_steps_per_s, &round_result::step_p50_ms, &round_result::step_p99_ms,
                     &round_result::raw_rows_per_s}) {
    std::vector<double> v;
    for (const auto& r : all) v.push_back(r.*field);
    m.*field = summarize(v).p50;
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  const options o = parse_options(argc, argv);
  const fs::path base = fs::path("/var/tmp") / ("cairn-bench-throughput-" + std::to_string(getpid()));
  fs::create_directories(base);
  auto raw = bench::open_raw_journal(base / "raw.db", "FULL");

  std::printf("throughput: N runs x S empty steps under `cairn serve --max-concurrent N` (journal FULL), submitted\n"
              "in-process before serve starts, timed from serve's start until all are completed\n");
  std::printf("machine: %s; folder %s\n\n", bench::machine().c_str(), base.c_str());
  std::printf("raw SQLite (SQLiteCpp, WAL, synchronous=FULL, same folder), B empty step rows per transaction,\n"
              "median of 3 x 1 s:\n%6s %12s %14s\n", "B", "rows/s", "ms per commit");
  for (int b : {1, 16, 64, 256}) {
    std::vector<double> v;
    for (int i = 0; i < 3; ++i) v.push_back(raw_rows_per_s(raw, b));
    const double rate = summarize(v).p50;
    std::printf("%6d %12.0f %14.3f\n", b, rate, 1000.0 * b / rate);
  }
  std::printf("\n%4s %5s %6s | %9s %8s %9s %12s %9s %9s | %11s %7s\n", "N", "S", "rounds", "wall s", "runs/s",
              "steps/s", "stepping/s", "step p50", "step p99", "raw rows/s", "ratio");
  std::fflush(stdout);

  double best_rate = 0;  // steps/s, the best cell so far: what predicts the next cell's time
  std::optional<round_result> goal_cell;
  for (int s : o.steps)
    for (int n : o.runs) {
      const double steps = static_cast<double>(n) * s;
      const double predicted_s = best_rate > 0 ? steps / best_rate : 0;
      if (o.cap_s > 0 && predicted_s > o.cap_s) {
        std::printf("%4d %5d skipped: predicted %.0f s per round (%.0f steps at %.0f steps/s, the best rate so far) "
                    "is over the %.0f s cap (--cap)\n",
                    n, s, predicted_s, steps, best_rate, o.cap_s);
        std::fflush(stdout);
        continue;
      }
      int rounds = o.rounds;
      if (o.cap_s > 0 && predicted_s > 0)
        rounds = std::clamp(static_cast<int>(o.cap_s / predicted_s), 1, o.rounds);
      const double limit_ms = std::max(600'000.0, 10'000 * predicted_s);
      std::vector<round_result> all;
      std::string failure;
      for (int round = 0; round < rounds && failure.empty(); ++round) {
        auto r = one_round(base, raw, n, s, round, limit_ms);
        if (r.failure.empty()) all.push_back(r);
        else failure = "failed in round " + std::to_string(round + 1) + ": " + r.failure;
      }
      if (!failure.empty()) {
        std::printf("%4d %5d %s\n", n, s, failure.c_str());
        std::fflush(stdout);
        continue;
      }
      const round_result m = medians(all);
      best_rate = std::max(best_rate, m.steps_per_s);
      if (n == 64 && s == 1000) goal_cell = m;
      std::printf("%4d %5d %6d | %9.2f %8.2f %9.0f %12.0f %8.2fms %8.2fms | %11.0f %7.3f\n", n, s, rounds,
                  m.wall_ms / 1000, m.runs_per_s, m.steps_per_s, m.stepping_steps_per_s, m.step_p50_ms,
                  m.step_p99_ms, m.raw_rows_per_s, m.steps_per_s / m.raw_rows_per_s);
      std::fflush(stdout);
    }

  std::printf("\nsteps/s: N x S over the wall time (serve start -> all completed; sandbox starts included).\n"
              "stepping/s: N x S over the journal's first step started -> last step committed.\n"
              "step p50/p99: one step as the agent sees it, ctx.step -> ack (the row is durable).\n"
              "raw rows/s: plain SQLite committing N rows per transaction, measured just before each round;\n"
              "ratio: steps/s / raw rows/s (issue 10's goal: >= 0.5).\n");
  if (goal_cell)
    std::printf("goal at 64 x 1,000: %.0f steps/s (goal >= 10,000: %s); ratio %.3f (goal >= 0.5: %s)\n",
                goal_cell->steps_per_s, goal_cell->steps_per_s >= 10'000 ? "met" : "not met",
                goal_cell->steps_per_s / goal_cell->raw_rows_per_s,
                goal_cell->steps_per_s / goal_cell->raw_rows_per_s >= 0.5 ? "met" : "not met");
  else
    std::printf("goal at 64 x 1,000: not measured in this run (pass --runs 64 --steps 1000 --cap 0)\n");
  // Only what this process made: a round's home left in place (it still has mounts) stays.
  for (const char* suffix : {"", "-wal", "-shm"}) fs::remove(base / (std::string("raw.db") + suffix));
  std::error_code ec;
  fs::remove(base, ec);
  return 0;
}
