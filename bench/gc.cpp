// bench/gc: `cairn gc` of N ended runs (issue 42's retention): how long it
// takes, the bytes it gives back (the journal file before and after), and
// what it costs the runs that step meanwhile: steps/s of 16 runs x S empty
// steps of bench_agent under `cairn serve` while gc removes the N runs,
// as a ratio to the same 16 runs in the same journal without gc (issue
// 42's goal: within 10 %, a ratio >= 0.9).
// The N ended runs (failed, so that the runs completing meanwhile are not
// gc's) are written in-process, 200 per transaction, each as a bench_agent
// run of 4 steps with 512-byte outputs and the events of its attempt.
// Steps/s counts the stepping window: the journal's first step started ->
// last step committed (sandbox starts left out).
// usage: gc [N (default 5000)] [S (default 1000)]; N = 100000 for the figure.
#include <cstdio>

#include "bench/args.hpp"
#include "bench/host_probe.hpp"

using namespace cairn;
using bench::clock_type;
using bench::ms_since;
namespace fs = std::filesystem;

namespace {

constexpr int live_runs = 16;

// N failed runs, as bench_agent leaves them, a transaction of 200 at a time.
void write_ended_runs(const fs::path& db, int n) {
  auto journal = storage::open_journal(db, {.sync = storage::sync_mode::normal});
  const std::string output(512, 'o');
  for (int first = 0; first < n; first += 200) {
    std::vector<std::function<void(storage::journal&)>> writes;
    for (int i = first; i < std::min(n, first + 200); ++i)
      writes.push_back([&, i](storage::journal& j) {
        const auto id = "old-" + std::to_string(i);
        storage::new_run r;
        r.id = id;
        r.agent = BENCH_AGENT;
        r.input = {{"steps", 4}};
        r.sandbox = "none";
        r.workspace = "/nonexistent/" + id;  // no files: gc's cost here is the journal's
        j.create_run(r);
        j.append_event(id, "attempt_started", {{"attempt", 1}});
        for (std::uint64_t s = 0; s < 4; ++s) {
          storage::step_record step;
          step.run_id = id;
          step.result.seq = s;
          step.result.name = "step " + std::to_string(s);
          step.result.ok = true;
          step.result.output = {{"text", output}, {"n", s}};
          step.result.attempt = 1;
          j.append_step(step);
        }
        j.append_event(id, "attempt_ended", {{"attempt", 1}, {"error", output}});
        j.finish_run(id, storage::run_status::failed, nullptr, protocol::error_info{"gave up", "agent"});
      });
    for (const auto& e : journal->write_together(writes))
      if (e) std::rethrow_exception(e);
  }
}

struct stepping {
  double steps_per_s = 0;
  std::int64_t first_started = 0, last_committed = 0;  // journal ms
  std::vector<std::int64_t> committed;                 // each step's commit, journal ms
};

// Starts `cairn serve` on `home` with the 16 live runs queued, runs `during`
// (given serve's pid) at once, and waits until no run is unfinished.
stepping serve_live_runs(const fs::path& home, int steps, const std::function<void()>& during) {
  const auto ids = bench::submit_runs(home, "live", live_runs, BENCH_AGENT, {{"steps", steps}});
  const fs::path db = home / "cairn.db";
  pid_t daemon = bench::start_process({CAIRN_BIN, "serve", "--max-concurrent", std::to_string(live_runs)}, home,
                                      home / "serve.log");
  bench::running_daemon = daemon;
  if (during) during();
  auto journal = storage::open_journal(db, {.read_only = true});
  const auto t0 = clock_type::now();
  for (;;) {
    auto counts = journal->count_by_status();
    using enum storage::run_status;
    if (counts[pending] + counts[running] + counts[waiting] == 0) break;
    if (ms_since(t0) > 600'000) bench::die("the live runs did not end within 10 minutes; see " + home.string());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  bench::running_daemon = 0;
  if (bench::stop_process(daemon, std::chrono::seconds(60)) != 0) bench::die("cairn serve did not stop cleanly");
  stepping out{0, INT64_MAX, 0};
  for (const auto& id : ids) {
    auto run = journal->find_run(id);
    auto recorded = journal->steps(id);
    if (!run || run->status != storage::run_status::completed || recorded.size() != static_cast<std::size_t>(steps))
      bench::die("run " + id + " did not complete its " + std::to_string(steps) + " steps; see " + home.string());
    for (const auto& step : recorded) out.committed.push_back(step.finished_at_ms);
    out.first_started = std::min(out.first_started, recorded.front().started_at_ms);
    out.last_committed = std::max(out.last_committed, recorded.back().finished_at_ms);
  }
  out.steps_per_s = 1000.0 * live_runs * steps /
                    static_cast<double>(std::max<std::int64_t>(1, out.last_committed - out.first_started));
  return out;
}

struct gc_result {
  double ms = 0;
  nlohmann::json summary;
  std::int64_t started_ms = 0, ended_ms = 0;  // journal clock
};

gc_result run_gc(const fs::path& home) {
  gc_result r;
  r.started_ms = storage::now_ms();
  const auto t0 = clock_type::now();
  const int code = bench::run_process({CAIRN_BIN, "gc", "--status", "failed", "--json"}, home, home / "gc.out");
  r.ms = ms_since(t0);
  r.ended_ms = storage::now_ms();
  if (code != 0) bench::die("cairn gc exited " + std::to_string(code) + "; see " + (home / "gc.out").string());
  const auto text = bench::read_whole_file((home / "gc.out").string());
  r.summary = nlohmann::json::parse(text.substr(text.find('{')));
  return r;
}

double mib(std::uint64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

}  // namespace

int main(int argc, char** argv) {
  const char* usage = "[N ended runs (default 5000)] [S steps per live run (default 1000)]";
  const int n = bench::count_arg(argc, argv, 1, 5000, usage);
  const int s = bench::count_arg(argc, argv, 2, 1000, usage);
  const fs::path base = fs::path("/var/tmp") / ("cairn-bench-gc-" + std::to_string(getpid()));
  std::printf("gc: `cairn gc` of %d ended runs; %d runs x %d empty steps under `cairn serve` with and without it\n",
              n, live_runs, s);
  std::printf("machine: %s; folder %s\n\n", bench::machine().c_str(), base.c_str());

  // Alone: gc's time and what it gives back.
  const fs::path alone = base / "alone";
  fs::create_directories(alone);
  auto t0 = clock_type::now();
  write_ended_runs(alone / "cairn.db", n);
  std::printf("wrote %d ended runs in %.1f s\n", n, ms_since(t0) / 1000);
  const auto file_before = fs::file_size(alone / "cairn.db");
  const auto quiet = run_gc(alone);
  const auto file_after = fs::file_size(alone / "cairn.db");
  std::printf("gc alone:   %.2f s for %zu runs (%.0f runs/s); journal rows %.1f MiB; file %.1f MiB -> %.1f MiB "
              "(%.1f MiB given back)\n",
              quiet.ms / 1000, quiet.summary["removed"].size(), quiet.summary["removed"].size() / (quiet.ms / 1000),
              mib(quiet.summary["journal_bytes"]), mib(file_before), mib(file_after), mib(file_before - file_after));

  // The live runs without gc, then with it, each on a journal holding the N runs.
  const fs::path without = base / "without", with = base / "with";
  fs::create_directories(without);
  fs::create_directories(with);
  write_ended_runs(without / "cairn.db", n);
  write_ended_runs(with / "cairn.db", n);
  const auto baseline = serve_live_runs(without, s, {});
  gc_result during;
  std::thread gc_thread;
  const auto loaded = serve_live_runs(with, s, [&] {
    // Once serve has taken its runs (the first step journaled), so that gc overlaps the stepping.
    auto journal = storage::open_journal(with / "cairn.db", {.read_only = true});
    for (const auto t = clock_type::now(); journal->step_count("live-0") == 0 && ms_since(t) < 60'000;)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    gc_thread = std::thread([&] { during = run_gc(with); });
  });
  gc_thread.join();
  const double overlap_ms = static_cast<double>(std::max<std::int64_t>(
      0, std::min(during.ended_ms, loaded.last_committed) - std::max(during.started_ms, loaded.first_started)));
  std::printf("gc meanwhile: %.2f s for %zu runs, %.0f%% of it while the live runs stepped\n", during.ms / 1000,
              during.summary["removed"].size(), 100 * overlap_ms / during.ms);
  // The rate while gc ran: the steps committed within its window.
  const auto window_from = std::max(during.started_ms, loaded.first_started);
  const auto window_to = std::min(during.ended_ms, loaded.last_committed);
  const auto in_window = std::count_if(loaded.committed.begin(), loaded.committed.end(),
                                       [&](std::int64_t t) { return t >= window_from && t <= window_to; });
  const double during_rate = window_to > window_from ? 1000.0 * static_cast<double>(in_window) /
                                                           static_cast<double>(window_to - window_from)
                                                     : 0;
  std::printf("steps/s without gc: %.0f; with gc, over the whole stepping: %.0f (ratio %.3f); while gc ran: %.0f "
              "(ratio %.3f, goal >= 0.9: %s)\n",
              baseline.steps_per_s, loaded.steps_per_s, loaded.steps_per_s / baseline.steps_per_s, during_rate,
              during_rate / baseline.steps_per_s, during_rate / baseline.steps_per_s >= 0.9 ? "met" : "not met");
  bench::remove_bench_folder(base);
  return 0;
}
