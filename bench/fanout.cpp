// bench/fanout: an eval suite's shape. N runs (default 1,000) of bench_agent,
// 3 steps each, queued by one `cairn submit --from FILE.jsonl` while a
// `cairn serve --max-concurrent M --warm W` runs; timed from the submit until
// every run has completed. Sampled every 20 ms: the daemon's RSS and its live
// sandboxes, for the host memory one live run costs. The raw operation,
// measured just before: N starts of `bwrap ... /usr/bin/true`, M at once.
// Goal: 1,000 runs completed in <= 10 s.
// usage: fanout [--runs N] [--max-concurrent M (default 64)] [--warm W (default 16)] [--prestart]
#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "bench/host_probe.hpp"
#include "bench/stats.hpp"

using namespace cairn;
using bench::clock_type;
using bench::ms_since;
namespace fs = std::filesystem;

namespace {

constexpr int steps_per_run = 3;

struct sampler {
  explicit sampler(pid_t pid) : daemon(pid) {}
  pid_t daemon;
  std::atomic<bool> stop{false};
  long idle_rss_kb = 0, peak_rss_kb = 0, rss_at_most_live_kb = 0;
  int most_live = 0;

  void run() {
    while (!stop) {
      const long rss = bench::status_field(daemon, "VmRSS");
      const int live = bench::children_named(daemon, "bwrap");
      peak_rss_kb = std::max(peak_rss_kb, rss);
      if (live > most_live || (live == most_live && rss > rss_at_most_live_kb)) {
        most_live = live;
        rss_at_most_live_kb = rss;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  int runs = 1000, concurrency = 64, warm = 16;
  bool prestart = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--prestart")) {
      prestart = true;
      continue;
    }
    if (i + 1 == argc) bench::die(std::string("option ") + argv[i] + " needs a value");
    if (!std::strcmp(argv[i], "--runs")) runs = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--max-concurrent")) concurrency = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--warm")) warm = std::atoi(argv[++i]);
    else bench::die(std::string("unknown option ") + argv[i]);
  }
  const fs::path base = fs::temp_directory_path() / ("cairn-bench-fanout-" + std::to_string(getpid()));
  const fs::path home = base / "home", db = home / "cairn.db", log = base / "serve.log", file = base / "runs.jsonl";
  fs::create_directories(home);
  fs::permissions(base, fs::perms(0755));
  {
    std::ofstream out(file);
    for (int i = 0; i < runs; ++i) out << "{\"input\":{\"steps\":" << steps_per_run << "},\"id\":\"f-" << i << "\"}\n";
  }

  auto raw = bench::raw_bwrap(base / "raw-ws", runs, concurrency);

  std::vector<std::string> serve = {CAIRN_BIN, "serve", "--max-concurrent", std::to_string(concurrency), "--warm",
                                    std::to_string(warm)};
  if (prestart) serve.push_back("--prestart");
  pid_t daemon = bench::start_process(serve, home, log);
  bench::running_daemon = daemon;
  bench::wait_for_daemon(daemon, db, log);
  sampler sample(daemon);
  sample.idle_rss_kb = bench::status_field(daemon, "VmRSS");
  std::thread sampling([&] { sample.run(); });

  auto t0 = clock_type::now();
  if (int code = bench::run_process({CAIRN_BIN, "submit", "--from", file.string(), BENCH_AGENT}, home,
                                    base / "submit.log");
      code != 0)
    bench::die("cairn submit --from exited " + std::to_string(code) + "; see " + (base / "submit.log").string());
  const double submit_ms = ms_since(t0);

  bench::wait_all_completed(db, runs, t0, std::chrono::seconds(600), log);
  const double wall_ms = ms_since(t0);
  sample.stop = true;
  sampling.join();
  bench::stop_process(daemon, std::chrono::seconds(30));
  bench::running_daemon = 0;
  std::string warm_starts;
  {
    std::ifstream in(log);
    int taken = 0;
    for (std::string line; std::getline(in, line);) taken += line.find("warm sandbox from the pool") != std::string::npos;
    warm_starts = std::to_string(taken);
  }

  std::printf("fanout: %d runs of %d steps, one `cairn submit --from`, serve --max-concurrent %d --warm %d%s\n", runs,
              steps_per_run, concurrency, warm, prestart ? " --prestart" : "");
  std::printf("  raw bwrap /usr/bin/true, %d at once     %8.0f starts/s (p50 %.1f ms)\n", concurrency, raw.per_second(),
              summarize(raw.ms).p50);
  std::printf("  submit --from (one transaction)         %8.0f ms\n", submit_ms);
  std::printf("  submit -> all %d completed             %8.2f s  (goal <= 10 s)\n", runs, wall_ms / 1000);
  std::printf("  runs/s                                  %8.1f  (%.2f x raw starts/s)\n", runs * 1000.0 / wall_ms,
              runs * 1000.0 / wall_ms / raw.per_second());
  std::printf("  attempts that took a warm sandbox       %8s of %d\n", warm_starts.c_str(), runs);
  std::printf("  daemon RSS idle / at most live (%d live) %6.1f / %.1f MiB: %.0f KiB per live run\n", sample.most_live,
              sample.idle_rss_kb / 1024.0, sample.rss_at_most_live_kb / 1024.0,
              sample.most_live > 0 ? double(sample.rss_at_most_live_kb - sample.idle_rss_kb) / sample.most_live : 0.0);
  std::error_code ec;
  fs::remove_all(base, ec);
  return 0;
}
