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
// Then what a history of events costs (issue 41, the run's kept state): a
// run of 10 steps with 10 events and one with 10,000 events resume (goal:
// within 1.2x), and the reads a suspension makes (suspensions this hour,
// the run's journal bytes) against a run's kept state and, as before it,
// derived from the history. Last, the resident memory of `cairn show` (text
// and --json) of the 1 GiB history (goal: under 64 MiB).
// Usage: replay [trials] (default 5).
#include <sys/resource.h>
#include <sys/wait.h>
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
#include "engine/ledger.hpp"
#include "engine/run_state.hpp"

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
    // A run with committed steps has its workspace (the host refuses to
    // resume one whose files are missing): as the agent's first attempt left it.
    fs::create_directories(r.workspace);
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

  // Adds `n` events of the kinds a long-lived run gathers (suspensions,
  // retries of its steps, warnings), of about 300 bytes each, before its
  // last step.
  void add_events(const std::string& id, int n) {
    auto writer = storage::open_journal(dir / "cairn.db", {.sync = storage::sync_mode::normal});
    const std::uint64_t last = writer->step_count(id) - 1;
    for (int i = 0; i < n; ++i) {
      const std::string text(250, static_cast<char>('a' + i % 26));
      switch (i % 3) {
        case 0: writer->append_event(id, "suspended", {{"count", 1}, {"bytes_written", i}, {"cpu_ms", 1}, {"ms", 1}}); break;
        case 1: writer->append_event(id, "step_retry", {{"name", "s"}, {"attempt", 1}, {"error", {{"message", text}, {"type", "error"}}}, {"delay_ms", 0}}, last); break;
        default: writer->append_event(id, "sandbox_warning", {{"message", text}}); break;
      }
    }
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

  // A fork of a 1,000-step run at step 900 (issue 42): from the fork's
  // creation (rows copied, workspace restored) to its first new step
  // acked, against a resume of a 900-step history; goal: under that resume
  // plus a sandbox start. Each trial forks anew.
  h.make_run("thousand", 1'000, nullptr);
  h.make_run("nine-hundred", 900, nullptr);
  std::vector<double> fork_ms;
  for (int t = 0; t < trials; ++t) {
    h.stopping = false;
    first_new_step watch(900, h.stopping);
    const auto t0 = clock_type::now();
    const std::string id = "fork-" + std::to_string(t);
    h.eng->fork({.from = "thousand", .seq = 899, .id = id});
    auto run = h.eng->execute(id, &watch);
    if (!watch.acked_) bench::die("the fork did not reach a new step: " + (run.error ? run.error->message : "?"));
    fork_ms.push_back(std::chrono::duration<double, std::milli>(*watch.acked_ - t0).count());
  }
  const auto forked = summarize(fork_ms);
  const auto nine = summarize(h.resume("nine-hundred", trials));
  std::printf("%-62s %10.2f %10.2f\n", "resume, 900 steps -> first new step acked", nine.p50, nine.p99);
  std::printf("%-62s %10.2f %10.2f\n", "fork of 1,000 steps at 900 -> first new step acked", forked.p50, forked.p99);
  std::printf("fork at 900: %.2f ms against resume of 900 + a sandbox start %.2f ms (goal: under)\n", forked.p50,
              nine.p50 + raw.p50);

  // A history of events: the same 10 steps, 10 or 10,000 events beside them.
  h.make_run("ten-events", 10, nullptr);
  h.add_events("ten-events", 10);
  h.make_run("ten-thousand-events", 10, nullptr);
  h.add_events("ten-thousand-events", 10'000);
  // Alternated, 4 times as many trials as above: each is short, and the
  // machine's noise is what a difference of this size has to beat.
  std::vector<double> few_ms, many_ms;
  for (int t = 0; t < 4 * trials; ++t) {
    few_ms.push_back(h.resume("ten-events", 1)[0]);
    many_ms.push_back(h.resume("ten-thousand-events", 1)[0]);
  }
  const auto few = summarize(few_ms);
  const auto many = summarize(many_ms);
  std::printf("%-62s %10.2f %10.2f\n", "resume, 10 steps + 10 events -> first new step acked", few.p50, few.p99);
  std::printf("%-62s %10.2f %10.2f\n", "resume, 10 steps + 10,000 events -> first new step acked", many.p50, many.p99);
  std::printf("10,000 events / 10 events: %.2fx (goal <= 1.2x)\n", many.p50 / few.p50);

  // What a suspension reads of the run: kept, and derived from the history as before.
  auto reads = [&](const std::string& id, bool kept) {
    std::vector<double> us;
    for (int i = 0; i < 200; ++i) {
      const auto t0 = clock_type::now();
      const auto now = storage::now_ms();
      std::uint64_t n = kept ? engine::suspensions_since(*h.journal, id, now - 3'600'000)
                             : engine::derive_suspensions(*h.journal, id, now).size();
      n += h.journal->bytes_of_run(id);
      if (n == 0) bench::die("no bytes");
      us.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - t0).count());
    }
    return summarize(us);
  };
  const auto kept_few = reads("ten-events", true), kept_many = reads("ten-thousand-events", true);
  const auto scan_few = reads("ten-events", false), scan_many = reads("ten-thousand-events", false);
  std::printf("%-62s %10s %10s\n", "a suspension's reads, microseconds", "p50", "max~p99");
  std::printf("%-62s %10.1f %10.1f\n", "kept state, 10 events", kept_few.p50, kept_few.p99);
  std::printf("%-62s %10.1f %10.1f\n", "kept state, 10,000 events", kept_many.p50, kept_many.p99);
  std::printf("%-62s %10.1f %10.1f\n", "derived from the history (as before), 10 events", scan_few.p50, scan_few.p99);
  std::printf("%-62s %10.1f %10.1f\n", "derived from the history (as before), 10,000 events", scan_many.p50, scan_many.p99);
  std::printf("kept: 10,000 events / 10 events: %.2fx; derived: %.1fx\n", kept_many.p50 / kept_few.p50,
              scan_many.p50 / scan_few.p50);

  // `cairn show` of the 1 GiB history: the most the CLI holds at once.
  for (const bool as_json : {false, true}) {
    std::fflush(stdout);  // the child's stdio must not print what is buffered here again
    const pid_t pid = fork();
    if (pid == 0) {
      const auto db = (dir / "cairn.db").string();
      if (!freopen("/dev/null", "w", stdout)) _exit(126);
      if (as_json) execl(CAIRN_BIN, CAIRN_BIN, "show", "one-gib", "--json", "--db", db.c_str(), nullptr);
      else execl(CAIRN_BIN, CAIRN_BIN, "show", "one-gib", "--db", db.c_str(), nullptr);
      _exit(127);
    }
    int status = 0;
    rusage usage{};
    if (wait4(pid, &status, 0, &usage) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
      bench::die("cairn show of the 1 GiB history failed");
    std::printf("cairn show%s of 1 GiB of history: %.1f MiB resident at most (goal < 64)\n", as_json ? " --json" : "",
                usage.ru_maxrss / 1024.0);
  }
  bench::remove_bench_folder(dir);
  return 0;
}
