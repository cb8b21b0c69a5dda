// bench/live_runs: how many runs one daemon holds live at once, and what
// each costs it. N runs (default 1,000) of bench_agent, each one empty step
// then ctx.sleep(1 s), under one `cairn serve --max-concurrent N
// --suspend-after 5000`: the sleep is under the 5 s threshold, so every run
// keeps its sandbox through it. The runs are submitted in-process
// (engine::submit) before serve starts; timed from serve's start until every
// run has ended. Sampled every 100 ms: the daemon's threads
// (/proc/PID/status Threads), RSS and open descriptors, its live sandboxes
// (bwrap children), and the host's MemAvailable; the daemon's peak RSS is
// its VmHWM. The raw operation, measured just before: N starts of `bwrap
// ... /usr/bin/true`, all at once. When some runs fail (the machine ran out
// of processes, memory or descriptors), it says how many completed and why
// the others failed; run it again with a smaller --runs to find the largest
// count that works. Runs not ended after --limit seconds are reported as
// such (their status, and how many reached their sleep).
// usage: live_runs [--runs N] [--limit SECONDS (default 600)]
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstring>
#include <map>

#include "bench/host_probe.hpp"
#include "bench/args.hpp"
#include "bench/stats.hpp"

using namespace cairn;
using bench::clock_type;
using bench::ms_since;
namespace fs = std::filesystem;

namespace {

constexpr int sleep_ms = 1000;

// A field of /proc/meminfo in kB.
long meminfo_kb(const std::string& name) { return bench::proc_file_field("/proc/meminfo", name + ":"); }

// The soft "Max open files" of `pid`.
long open_files_limit(pid_t pid) {
  return bench::proc_file_field("/proc/" + std::to_string(pid) + "/limits", "Max open files");
}

// The peaks of the daemon and the host while runs are live; read them after
// run() has returned.
struct peak_sampler {
  explicit peak_sampler(pid_t pid) : daemon(pid) {}
  pid_t daemon;
  clock_type::time_point t0 = clock_type::now();
  std::atomic<bool> stop{false};
  long threads = 0, rss_kb = 0, fds = 0, min_available_kb = LONG_MAX;
  int live = 0;
  double live_at_ms = 0;  // when the most sandboxes were first live
  long threads_at_live = 0;

  void run() {
    while (!stop) {
      const long t = bench::status_field(daemon, "Threads");
      const int sandboxes = bench::children_named(daemon, "bwrap");
      threads = std::max(threads, t);
      rss_kb = std::max(rss_kb, bench::status_field(daemon, "VmRSS"));
      fds = std::max(fds, bench::open_fds(daemon));
      min_available_kb = std::min(min_available_kb, meminfo_kb("MemAvailable"));
      if (sandboxes > live) {
        live = sandboxes;
        live_at_ms = ms_since(t0);
        threads_at_live = t;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  int n = 1000;
  double limit_s = 600;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--runs") == 0 && i + 1 < argc) n = std::max(1, std::atoi(argv[++i]));
    else if (std::strcmp(argv[i], "--limit") == 0 && i + 1 < argc) limit_s = std::max(1.0, std::atof(argv[++i]));
    else bench::die("usage: live_runs [--runs N] [--limit SECONDS]");
  }
  const fs::path base = fs::path("/var/tmp") / ("cairn-bench-live-runs-" + std::to_string(getpid()));
  const fs::path home = base / "home", db = home / "cairn.db", log = home / "serve.log";
  fs::create_directories(home);
  auto raw = bench::raw_bwrap(base / "raw-ws", n, n);
  const auto ids = bench::submit_runs(home, "live", n, BENCH_AGENT, {{"steps", 1}, {"sleep_ms", sleep_ms}});
  const long available_before_kb = meminfo_kb("MemAvailable");

  const auto t0 = clock_type::now();
  pid_t daemon = bench::start_process(
      {CAIRN_BIN, "serve", "--max-concurrent", std::to_string(n), "--suspend-after", "5000"}, home, log);
  bench::running_daemon = daemon;
  peak_sampler peaks(daemon);
  std::thread sampling([&] { peaks.run(); });
  auto ended = bench::wait_runs_ended(db, n, daemon, t0, limit_s * 1000, log, false);
  const long peak_rss_kb = bench::status_field(daemon, "VmHWM"), fd_limit = open_files_limit(daemon);
  peaks.stop = true;
  sampling.join();
  bench::running_daemon = 0;
  const int serve_exit = bench::stop_process(daemon, std::chrono::seconds(60));
  const auto warnings = bench::serve_warnings(log);

  // Why runs did not complete: each distinct status and error once, with its
  // count; and how many runs got as far as their sleep.
  std::map<std::string, int> errors;
  int slept = 0;
  auto journal = storage::open_journal(db, {.read_only = true});
  for (const auto& id : ids) {
    auto run = journal->find_run(id);
    if (!run) continue;
    for (const auto& e : journal->events(id))
      if (e.kind == "timer_set") {
        ++slept;
        break;
      }
    if (run->status != storage::run_status::completed)
      ++errors[std::string(storage::to_string(run->status)) + (run->error ? ": " + run->error->message : "")];
  }
  int not_executed = 0;
  for (const auto& line : warnings) not_executed += line.find("not executed:") != std::string::npos;

  std::printf("live_runs: %d runs (1 empty step, then ctx.sleep(%d ms) holding the sandbox) under one\n"
              "`cairn serve --max-concurrent %d --suspend-after 5000`, submitted in-process before serve starts\n",
              n, sleep_ms, n);
  std::printf("machine: %s; pid_max %ld, threads-max %ld, this process's open files limit %ld\n\n",
              bench::machine().c_str(), bench::proc_file_field("/proc/sys/kernel/pid_max", ""),
              bench::proc_file_field("/proc/sys/kernel/threads-max", ""), open_files_limit(getpid()));
  std::printf("raw: %d starts of bwrap /usr/bin/true, all at once: %.1f s = %.1f starts/s, p50 %.1f ms\n", n,
              raw.wall_ms / 1000, raw.per_second(), summarize(raw.ms).p50);
  std::printf("     the least wall time a run-per-sandbox engine can reach here: N / starts/s + %d ms = %.1f s\n\n",
              sleep_ms, n / raw.per_second() + sleep_ms / 1000.0);
  if (ended.timed_out)
    std::printf("wall: NOT all ended within the %.0f s limit: %d completed, %d ended otherwise; %d of %d reached "
                "their sleep\n", limit_s, ended.completed, ended.other, slept, n);
  else
    std::printf("wall: serve start -> all %d ended: %.1f s (%d completed, %d not)\n", n, ended.ms / 1000,
                ended.completed, ended.other);
  std::printf("live sandboxes at once: peak %d, first reached %.1f s after serve started\n", peaks.live,
              peaks.live_at_ms / 1000);
  std::printf("daemon threads: peak %ld for %d runs (%.2f per run); %ld when the most sandboxes were live\n",
              peaks.threads, n, static_cast<double>(peaks.threads) / n, peaks.threads_at_live);
  std::printf("daemon RSS: peak %.1f MiB (VmHWM; sampled peak %.1f MiB)\n", bench::mib(static_cast<double>(peak_rss_kb)),
              bench::mib(static_cast<double>(peaks.rss_kb)));
  std::printf("daemon open descriptors: peak %ld of its limit %ld\n", peaks.fds, fd_limit);
  std::printf("host memory in use at the peak (MemAvailable before - its lowest): %.1f MiB\n",
              bench::mib(static_cast<double>(available_before_kb - peaks.min_available_kb)));
  for (const auto& [message, count] : errors) std::printf("not completed (%d): %s\n", count, message.c_str());
  std::printf("cairn serve exited %d on SIGTERM (SIGKILL after 60 s); its log has %zu warnings (%d runs not "
              "executed, taken again later)%s%s\n",
              serve_exit, warnings.size(), not_executed, warnings.empty() ? "" : "; first: ",
              warnings.empty() ? "" : warnings.front().c_str());

  if (serve_exit != 0 || ended.timed_out || ended.other > 0 || bench::mounts_under(home) != 0) {
    std::fprintf(stderr, "bench: left %s in place for inspection\n", base.c_str());
    return 1;
  }
  bench::remove_bench_folder(base);
  return 0;
}
