// bench/concurrency: throughput of `cairn serve`. For N = 1, 16, 64 it queues
// N runs of a 10-step agent with one real `cairn submit --from FILE.jsonl`
// to a fresh CAIRN_HOME under /var/tmp served by `cairn serve
// --max-concurrent M`, M = min(N, 16), and times from the submit until
// every run is completed: runs/s and steps/s. While runs are live it samples
// the daemon's RSS (its own, over its idle RSS, per live run) and the RSS and
// PSS of the sandboxes' processes. The raw operation, measured in the same
// round just before: N starts of `bwrap ... /usr/bin/true` with up to M at
// once, so runs/s reads against sandbox starts/s at that concurrency; and,
// once, the machine's floor: bare fork and exec of /usr/bin/true, 16 at once.
// Each N is repeated (default 3 rounds); medians are printed.
// usage: concurrency [ROUNDS]
#include <atomic>
#include <cstdio>
#include <fstream>

#include "bench/args.hpp"
#include "bench/host_probe.hpp"
#include "bench/stats.hpp"
#include "storage/journal.hpp"

using namespace cairn;
using bench::clock_type;
using bench::ms_since;
namespace fs = std::filesystem;

namespace {

constexpr int steps_per_run = 10;

double median(std::vector<double> v) { return summarize(std::move(v)).p50; }

struct round_result {
  double submit_ms = 0, wall_ms = 0, runs_per_s = 0, steps_per_s = 0;
  double raw_per_s = 0, raw_p50_ms = 0, raw_cpu_ms = 0;
  double daemon_cpu_ms = 0, kernel_cpu_ms = 0;  // per run: the daemon and all it started; kernel threads
  double idle_rss_kb = 0, peak_rss_kb = 0, rss_per_live_kb = 0;
  double peak_live = 0, sandbox_rss_per_run_kb = 0, sandbox_pss_per_run_kb = 0;
  double queued_ms = 0, start_ms = 0, steps_ms = 0, end_ms = 0;  // per-run medians, from the journal
};

struct phases {
  double queued_ms, start_ms, steps_ms, end_ms;
};

// Keeps the sample with the most live sandboxes (then the highest RSS); read
// the results after run() has returned.
struct memory_sampler {
  explicit memory_sampler(pid_t pid) : daemon(pid) {}
  pid_t daemon;
  std::atomic<bool> stop{false};
  long rss_kb = 0, peak_rss_kb = 0;
  int live = 0;
  bench::process_tree at_peak;

  void run() {
    while (!stop) {
      auto tree = bench::tree_of(daemon);
      long rss = bench::status_field(daemon, "VmRSS");
      peak_rss_kb = std::max(peak_rss_kb, rss);
      if (tree.sandboxes > live || (tree.sandboxes == live && rss > rss_kb)) {
        live = tree.sandboxes;
        rss_kb = rss;
        at_peak = tree;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
};

// Where each run's time went, from its journal: created -> attempt started ->
// first step started -> last step committed -> finished.
phases breakdown(storage::journal& journal, int n) {
  std::vector<double> queued, start, steps, end;
  for (int i = 0; i < n; ++i) {
    const std::string id = "r-" + std::to_string(i);
    auto run = journal.find_run(id);
    auto recorded = journal.steps(id);
    std::int64_t attempt_at = 0;
    for (const auto& e : journal.events(id))
      if (e.kind == "attempt_started") attempt_at = e.at_ms;
    if (!run || recorded.empty() || !run->finished_at_ms || attempt_at == 0) continue;
    queued.push_back(static_cast<double>(attempt_at - run->created_at_ms));
    start.push_back(static_cast<double>(recorded.front().started_at_ms - attempt_at));
    steps.push_back(static_cast<double>(recorded.back().finished_at_ms - recorded.front().started_at_ms));
    end.push_back(static_cast<double>(*run->finished_at_ms - recorded.back().finished_at_ms));
  }
  return {median(queued), median(start), median(steps), median(end)};
}

round_result one_round(const fs::path& base, int n, int m, int round) {
  round_result r;
  const fs::path home = base / ("n" + std::to_string(n) + "-" + std::to_string(round));
  const fs::path db = home / "cairn.db", log = home / "serve.log";
  fs::create_directories(home);

  auto raw = bench::raw_bwrap(base / "raw-ws", n, m);
  r.raw_per_s = raw.per_second();
  r.raw_p50_ms = summarize(raw.ms).p50;
  r.raw_cpu_ms = raw.cpu_ms;

  const auto served =
      bench::start_counted_process({CAIRN_BIN, "serve", "--max-concurrent", std::to_string(m)}, home, log);
  const pid_t daemon = served.pid;
  bench::running_daemon = daemon;
  bench::wait_for_daemon(daemon, db, log);
  r.idle_rss_kb = static_cast<double>(bench::status_field(daemon, "VmRSS"));

  memory_sampler sampler(daemon);
  std::thread sampling([&] { sampler.run(); });
  const fs::path runs = home / "runs.jsonl";
  {
    std::ofstream out(runs);
    for (int i = 0; i < n; ++i)
      out << "{\"id\":\"r-" << i << "\",\"input\":{\"steps\":" << steps_per_run << "}}\n";
    if (!out) bench::die("cannot write " + runs.string());
  }
  auto t0 = clock_type::now();
  const double kernel0 = bench::kernel_threads_seconds(), daemon0 = served.cpu_seconds();
  if (int code = bench::run_process({CAIRN_BIN, "submit", "--from", runs.string(), BENCH_AGENT}, home,
                                    home / "submit.log");
      code != 0)
    bench::die("cairn submit --from exited " + std::to_string(code) + "; see " + (home / "submit.log").string());
  r.submit_ms = ms_since(t0);

  bench::wait_all_completed(db, n, t0, std::chrono::seconds(300), log);
  r.wall_ms = ms_since(t0);
  r.kernel_cpu_ms = 1000.0 * (bench::kernel_threads_seconds() - kernel0) / n;
  r.daemon_cpu_ms = 1000.0 * (served.cpu_seconds() - daemon0) / n;
  sampler.stop = true;
  sampling.join();

  kill(daemon, SIGTERM);
  bench::running_daemon = 0;
  if (int code = bench::wait_exit(daemon); code != 0)
    bench::die("cairn serve exited " + std::to_string(code) + " on SIGTERM; see " + log.string());
  for (const auto& line : bench::serve_warnings(log)) std::fprintf(stderr, "cairn serve: %s\n", line.c_str());

  r.runs_per_s = 1000.0 * n / r.wall_ms;
  r.steps_per_s = r.runs_per_s * steps_per_run;
  r.peak_rss_kb = static_cast<double>(sampler.peak_rss_kb);
  r.peak_live = sampler.live;
  if (sampler.live > 0) {
    r.rss_per_live_kb = static_cast<double>(sampler.rss_kb - static_cast<long>(r.idle_rss_kb)) / sampler.live;
    r.sandbox_rss_per_run_kb = static_cast<double>(sampler.at_peak.rss_kb) / sampler.live;
    r.sandbox_pss_per_run_kb = static_cast<double>(sampler.at_peak.pss_kb) / sampler.live;
  }
  auto journal = storage::open_journal(db, {.read_only = true});
  const auto p = breakdown(*journal, n);
  r.queued_ms = p.queued_ms;
  r.start_ms = p.start_ms;
  r.steps_ms = p.steps_ms;
  r.end_ms = p.end_ms;

  if (bench::mounts_under(home) == 0) fs::remove_all(home);
  else std::fprintf(stderr, "bench: %s still has mounts; left in place\n", home.c_str());
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = bench::count_arg(argc, argv, 1, 3, "[ROUNDS, default 3]");
  const fs::path base = fs::path("/var/tmp") / ("cairn-bench-concurrency-" + std::to_string(getpid()));
  fs::create_directories(base);
  auto sequential = bench::raw_bwrap(base / "raw-ws", 20, 1);
  const double raw_seq_p50 = summarize(sequential.ms).p50;
  auto exec = bench::raw_exec(320, 16);

  std::printf("concurrency: N runs of a %d-step agent under `cairn serve --max-concurrent M`, all queued by one "
              "`cairn submit --from`;\ntimed from the submit until all are completed; medians of %d rounds, each "
              "from a clean CAIRN_HOME\n",
              steps_per_run, rounds);
  std::printf("raw bwrap /usr/bin/true, one at a time: p50 %.1f ms (%.1f starts/s)\n", raw_seq_p50,
              1000.0 / raw_seq_p50);
  std::printf(
      "fork + exec /usr/bin/true, no sandbox, 16 at once: %.1f starts/s (%.2f ms CPU each; a raw sandbox is "
      "three processes)\n\n",
      exec.per_second(), exec.cpu_ms);
  std::printf("%4s %3s %9s %9s %8s %8s | %11s %10s %9s | %9s %9s %5s %12s %10s %10s\n", "N", "M", "submit ms",
              "wall ms", "runs/s", "steps/s", "raw start/s", "raw p50 ms", "runs/raw", "idle MiB", "peak MiB",
              "live", "KiB/live run", "sbx RSS/r", "sbx PSS/r");
  std::vector<std::pair<int, round_result>> medians;
  for (int n : {1, 16, 64}) {
    const int m = std::min(n, 16);
    std::vector<round_result> all;
    for (int round = 0; round < rounds; ++round) all.push_back(one_round(base, n, m, round));
    auto med = [&](double round_result::*field) {
      std::vector<double> v;
      for (const auto& r : all) v.push_back(r.*field);
      return median(v);
    };
    round_result r;
    for (auto field : {&round_result::submit_ms, &round_result::wall_ms, &round_result::runs_per_s,
                       &round_result::steps_per_s, &round_result::raw_per_s, &round_result::raw_p50_ms,
                       &round_result::raw_cpu_ms, &round_result::daemon_cpu_ms, &round_result::kernel_cpu_ms,
                       &round_result::idle_rss_kb, &round_result::peak_rss_kb, &round_result::rss_per_live_kb,
                       &round_result::peak_live, &round_result::sandbox_rss_per_run_kb,
                       &round_result::sandbox_pss_per_run_kb, &round_result::queued_ms, &round_result::start_ms,
                       &round_result::steps_ms, &round_result::end_ms})
      r.*field = med(field);
    std::printf("%4d %3d %9.0f %9.0f %8.2f %8.1f | %11.2f %10.1f %9.2f | %9.1f %9.1f %5.0f ", n, m, r.submit_ms,
                r.wall_ms, r.runs_per_s, r.steps_per_s, r.raw_per_s, r.raw_p50_ms, r.runs_per_s / r.raw_per_s,
                bench::mib(r.idle_rss_kb), bench::mib(r.peak_rss_kb), r.peak_live);
    if (r.peak_live > 0)
      std::printf("%12.0f %9.1fM %9.1fM\n", r.rss_per_live_kb, bench::mib(r.sandbox_rss_per_run_kb),
                  bench::mib(r.sandbox_pss_per_run_kb));
    else
      std::printf("%12s %10s %10s\n", "-", "-", "-");  // no sample caught a live sandbox
    std::fflush(stdout);
    medians.emplace_back(n, r);
  }
  std::printf("\nruns/raw: runs/s over raw bwrap starts/s (N starts, up to M at once, measured just before).\n"
              "KiB/live run: (daemon RSS - its idle RSS) / live sandboxes, at the sample with the most live ones;\n"
              "sbx RSS/r, PSS/r: the sandboxes' processes (bwrap + agent), per live run, at that sample\n"
              "(sampled every 20 ms; '-' when no sample caught a live sandbox).\n\n");
  std::printf("where a run's time goes (medians, ms; phases from the journal's timestamps; CPU per run: the\n"
              "daemon and all it started (sandboxes, agents, mkfs), and kernel threads; raw: bwrap, its sandbox's\n"
              "pid 1 and true, + kernel threads):\n");
  std::printf("%4s %8s %8s %9s %6s | %11s %11s %11s %13s %9s\n", "N", "queued", "start", "10 steps", "end",
              "daemon CPU", "kernel CPU", "CPU/run", "raw CPU/start", "CPU ratio");
  for (const auto& [n, r] : medians) {
    const double cpu = r.daemon_cpu_ms + r.kernel_cpu_ms;
    std::printf("%4d %8.0f %8.0f %9.0f %6.0f | %11.1f %11.1f %11.1f %13.1f %9.2f\n", n, r.queued_ms, r.start_ms,
                r.steps_ms, r.end_ms, r.daemon_cpu_ms, r.kernel_cpu_ms, cpu, r.raw_cpu_ms, cpu / r.raw_cpu_ms);
  }
  std::printf("queued: submit -> attempt started; start: attempt -> first step; end: last step -> run finished\n"
              "(agent exit, sandbox teardown; the workspace is released after that)\n");
  if (!bench::tree_cpu::open()) std::printf("%s\n", bench::rusage_caveat);
  fs::remove_all(base / "raw-ws");
  std::error_code ec;
  fs::remove(base, ec);
  return 0;
}
