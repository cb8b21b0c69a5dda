// bench/stop: how long `cairn serve` takes to stop gracefully with 16 live
// runs (issue 45: its stop time under systemd's TimeoutStopSec; here without
// systemd, as `systemctl stop` does it: SIGTERM, then waiting). 16 runs of
// bench_agent stepping without end, in the default layout (a bwrap sandbox
// and a quota image each); once every run has journaled a step, SIGTERM, and
// the time until serve exits. After it: every run is back in the queue
// (pending, held by nobody), no image is left mounted, and a second serve
// takes the runs on from their journals (checked by a step journaled after
// the stop, by each). The raw operation, measured in the same run: 16 bwrap
// sandboxes running `sleep`, each with an ext4 image loop-mounted as its
// /workspace (as root; a plain folder otherwise), SIGTERMed at once, reaped,
// and their images unmounted.
// Repeated `rounds` times, alternating nothing: medians.
// usage: stop [ROUNDS (default 3)]
#include <sys/mount.h>

#include <csignal>
#include <cstdio>

#include "bench/args.hpp"
#include "bench/host_probe.hpp"
#include "bench/stats.hpp"

using namespace cairn;
using bench::clock_type;
using bench::ms_since;
namespace fs = std::filesystem;

namespace {

constexpr int live_runs = 16;

// 16 sandboxes like a run's (bwrap, its namespaces, a loop-mounted ext4
// image as /workspace with a file written in it), each running sleep,
// SIGTERMed at once: from the first signal until the last is reaped and
// every image unmounted.
double raw_stop_ms(const fs::path& dir) {
  const bool root = ::geteuid() == 0;
  std::vector<pid_t> boxes;
  std::vector<fs::path> mounts;
  for (int i = 0; i < live_runs; ++i) {
    const auto ws = dir / ("raw-" + std::to_string(i)), image = dir / ("raw-" + std::to_string(i) + ".img");
    fs::create_directories(ws);
    if (root) {
      if (bench::run_process({"/usr/bin/truncate", "-s", "64M", image.string()}, dir, dir / "raw.log") != 0 ||
          bench::run_process({"/usr/sbin/mkfs.ext4", "-q", image.string()}, dir, dir / "raw.log") != 0 ||
          bench::run_process({"/usr/bin/mount", "-o", "loop,noatime", image.string(), ws.string()}, dir,
                             dir / "raw.log") != 0)
        bench::die("cannot mount a raw image; see " + (dir / "raw.log").string());
      mounts.push_back(ws);
    }
    boxes.push_back(bench::start_process({"/usr/bin/bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/",
                                          "--bind", ws.string(), "/workspace", "--", "/bin/sh", "-c",
                                          "echo data > /workspace/file; exec sleep 1000"},
                                         dir, dir / "raw.log"));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto t0 = clock_type::now();
  for (pid_t pid : boxes) ::kill(pid, SIGTERM);
  for (pid_t pid : boxes) bench::wait_exit(pid);
  for (const auto& ws : mounts)
    if (::umount2(ws.c_str(), 0) < 0) bench::die("cannot unmount " + ws.string());
  return ms_since(t0);
}

std::size_t steps_of(storage::journal& journal, const std::string& id) { return journal.steps(id).size(); }

}  // namespace

int main(int argc, char** argv) {
  const int rounds = bench::count_arg(argc, argv, 1, 3, "[ROUNDS (default 3)]");
  const fs::path base = fs::temp_directory_path() / ("cairn-bench-stop-" + std::to_string(::getpid()));
  fs::create_directories(base);
  std::printf("stop: `cairn serve` with %d live runs (bench_agent stepping, a bwrap sandbox and a quota image each), "
              "SIGTERM -> exit; %d rounds\n",
              live_runs, rounds);
  std::printf("machine: %s; folder %s\n\n", bench::machine().c_str(), base.c_str());
  std::vector<double> stop_ms, raw_ms;
  for (int round = 0; round < rounds; ++round) {
    const fs::path home = base / ("home-" + std::to_string(round));
    fs::create_directories(home);
    const auto ids = bench::submit_runs(home, "live", live_runs, BENCH_AGENT, {{"steps", 100'000'000}});
    const auto log = home / "serve.log";
    pid_t daemon = bench::start_process({CAIRN_BIN, "serve", "--max-concurrent", std::to_string(live_runs)}, home, log);
    bench::running_daemon = daemon;
    auto journal = storage::open_journal(home / "cairn.db", {.read_only = true});
    const auto waited = clock_type::now();
    for (;;) {
      int stepping = 0;
      for (const auto& id : ids) stepping += steps_of(*journal, id) > 0;
      if (stepping == live_runs) break;
      if (ms_since(waited) > 300'000) bench::die("the 16 runs did not all step within 300 s; see " + log.string());
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::map<std::string, std::size_t> before;
    for (const auto& id : ids) before[id] = steps_of(*journal, id);
    const auto t0 = clock_type::now();
    ::kill(daemon, SIGTERM);
    const int code = bench::wait_exit(daemon);
    stop_ms.push_back(ms_since(t0));
    bench::running_daemon = 0;
    if (code != 0) bench::die("cairn serve exited " + std::to_string(code) + " on SIGTERM; see " + log.string());
    for (const auto& id : ids) {
      const auto run = journal->find_run(id);
      if (!run || run->status != storage::run_status::pending || !run->owner.empty())
        bench::die("run " + id + " is not back in the queue after the stop; see " + log.string());
    }
    if (bench::mounts_under(home) != 0) bench::die("an image is still mounted under " + home.string());
    // A second serve takes every run on where its journal ends.
    daemon = bench::start_process({CAIRN_BIN, "serve", "--max-concurrent", std::to_string(live_runs)}, home,
                                  home / "serve-2.log");
    bench::running_daemon = daemon;
    const auto again = clock_type::now();
    for (;;) {
      int on = 0;
      for (const auto& id : ids) on += steps_of(*journal, id) > before[id] + 1;
      if (on == live_runs) break;
      if (ms_since(again) > 300'000) bench::die("the runs did not go on after a restart; see " + home.string());
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    bench::running_daemon = 0;
    if (bench::stop_process(daemon, std::chrono::seconds(120)) != 0) bench::die("the second serve did not stop");
    raw_ms.push_back(raw_stop_ms(home));
    std::printf("round %d: serve stopped in %.0f ms (raw: %d sandboxes killed, reaped and their images unmounted in %.0f ms)\n", round + 1,
                stop_ms.back(), live_runs, raw_ms.back());
  }
  const auto stop = summarize(stop_ms), raw = summarize(raw_ms);
  std::printf("\nserve's graceful stop with %d live runs: p50 %.0f ms, max %.0f ms (%.1f ms per run); raw p50 %.0f ms; "
              "ratio %.2f\n",
              live_runs, stop.p50, stop.p99, stop.p50 / live_runs, raw.p50, stop.p50 / raw.p50);
  std::printf("after each stop: every run pending and held by nobody, no image mounted, and each took a step more "
              "under a new serve\n");
  bench::remove_bench_folder(base);
  return 0;
}
