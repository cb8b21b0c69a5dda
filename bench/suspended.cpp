// bench/suspended: what parked runs cost the host, and how fast they wake.
// Under `cairn serve --max-concurrent M --suspend-after 0` (fresh CAIRN_HOME
// under /var/tmp) it parks N runs (default 1000) of an agent that does one
// step, then ctx.wait_signal("go") with no timeout; runs are submitted
// in-process (engine::submit, what `cairn submit` does, without N process
// starts). Once all N are waiting it reports the processes the host holds for
// them, the daemon's RSS and idle CPU, the journal's size and the workspaces'
// disk use. Then it signals the first runs one at a time (engine::signal,
// what `cairn signal` does), each once the one before has completed, and
// reads the wake-up latency from the journal: the signal's commit to the
// attempt_started of the woken run. Then it queues signal "go" for every other
// run at once and times until every run has completed. The raw operation,
// measured in the same run before the daemon starts: `bwrap ... /usr/bin/true`,
// one at a time and with up to M at once. Last, the wake-up against the
// workspace's size: two runs with a quota image, one that wrote 1 GiB into
// its workspace and one that wrote nothing, each parked and woken
// size_rounds times, alternately: signal -> attempt started, and the waking
// attempt until the run waits again (mount, replay, one step, unmount);
// and the end against the workspace's size (issue 42 asks within 1.2x):
// the last signal of end_pairs runs of each size -> completed, and -> its
// image gone.
// usage: suspended [N] [M] [CAIRN]   (defaults 1000, 8 (cairn serve's default)
//                                     and this build's cairn; pass another
//                                     build's to compare)
#include <sys/stat.h>

#include <atomic>
#include <cstdio>

#include "bench/args.hpp"
#include "bench/host_probe.hpp"
#include "bench/stats.hpp"
#include "engine/engine.hpp"
#include "engine/host_memory.hpp"

using namespace cairn;
using bench::clock_type;
using bench::ms_since;
namespace fs = std::filesystem;

namespace {

std::string run_id(int i) { return "park-" + std::to_string(i); }

constexpr int size_rounds = 6;
constexpr int end_pairs = 5;  // runs of each size whose end is timed
constexpr std::uint64_t mib_bytes = 1 << 20;

// One run of the size comparison, and what its wake-ups took.
struct sized_run {
  std::string id;
  int fill_mb;
  std::vector<double> wake_ms, attempt_ms;  // signal -> attempt started; attempt started -> waiting again
  std::vector<double> cycle_ms;             // signal -> waiting again with its image unmounted (wall clock)
};

// Runs whose events count `waits` run_waiting events, or that completed.
bool parked_again(storage::journal& journal, const std::string& id, std::size_t waits) {
  auto run = journal.find_run(id);
  if (!run) return false;
  if (run->status == storage::run_status::completed) return true;
  if (run->status != storage::run_status::waiting) return false;
  std::size_t seen = 0;
  for (const auto& e : journal.events(id)) seen += e.kind == "run_waiting";
  return seen >= waits;
}

// Until the run waits again (or completed) and no workspace under `home` is
// mounted: its sandbox and image are put away too.
void await_parked(storage::journal& journal, const std::string& id, std::size_t waits, const fs::path& home,
                  const fs::path& log) {
  const auto t0 = clock_type::now();
  while (!parked_again(journal, id, waits) || bench::mounts_under(home) != 0) {
    auto run = journal.find_run(id);
    if (run && (run->status == storage::run_status::failed || run->status == storage::run_status::cancelled))
      bench::die("run " + id + " ended " + std::string(storage::to_string(run->status)) + "; see " + log.string());
    if (ms_since(t0) > 300'000) bench::die("run " + id + " did not park within 300 s; see " + log.string());
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// From the journal: each signal -> the attempt it started, and that attempt
// -> the run waiting again (or done).
void read_wakeups(storage::journal& journal, sized_run& r) {
  std::vector<std::int64_t> attempts, parked;
  for (const auto& e : journal.events(r.id)) {
    if (e.kind == "attempt_started") attempts.push_back(e.at_ms);
    if (e.kind == "run_waiting") parked.push_back(e.at_ms);
  }
  if (auto run = journal.find_run(r.id); run && run->finished_at_ms) parked.push_back(*run->finished_at_ms);
  const auto signals = journal.signals(r.id);
  for (std::size_t i = 0; i < signals.size() && i + 1 < attempts.size() && i + 1 < parked.size(); ++i) {
    r.wake_ms.push_back(static_cast<double>(attempts[i + 1] - signals[i].sent_at_ms));
    r.attempt_ms.push_back(static_cast<double>(parked[i + 1] - attempts[i + 1]));
  }
}

// Bytes the run's quota image holds on disk (CAIRN_HOME/images/RUN.img).
std::uint64_t image_bytes(const fs::path& home, const std::string& id) {
  struct stat st {};
  if (::stat((home / "images" / (id + ".img")).c_str(), &st) != 0) return 0;
  return static_cast<std::uint64_t>(st.st_blocks) * 512;
}

// Peak daemon RSS and live sandboxes while runs park or wake; read them after
// run() has returned.
struct peak_sampler {
  explicit peak_sampler(pid_t pid) : daemon(pid) {}
  pid_t daemon;
  std::atomic<bool> stop{false};
  long rss_kb = 0;
  int live = 0;

  void run() {
    while (!stop) {
      rss_kb = std::max(rss_kb, bench::status_field(daemon, "VmRSS"));
      live = std::max(live, bench::tree_of(daemon).sandboxes);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
};

// Polls until `count` runs have status `want`, printing progress; dies if one
// ends otherwise or the deadline passes.
double wait_for(storage::journal& journal, storage::run_status want, int count, clock_type::time_point t0,
                const fs::path& log) {
  auto last_report = clock_type::now();
  for (;;) {
    auto counts = journal.count_by_status();
    if (counts[want] == count) return ms_since(t0);
    for (auto bad : {storage::run_status::failed, storage::run_status::cancelled, storage::run_status::in_doubt})
      if (counts[bad] > 0 && bad != want) bench::die("a run ended " + std::string(storage::to_string(bad)) + "; see " + log.string());
    if (ms_since(t0) > 900'000) bench::die("not done after 15 min; see " + log.string());
    if (ms_since(last_report) > 10'000) {
      std::fprintf(stderr, "  %.0f s: %d/%d %s\n", ms_since(t0) / 1000, counts[want], count,
                   std::string(storage::to_string(want)).c_str());
      last_report = clock_type::now();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

int main(int argc, char** argv) {
  engine::keep_heap_for_runs();  // as `cairn` does
  const int n = bench::count_arg(argc, argv, 1, 1000, "[RUNS, default 1000] [MAX_CONCURRENT, default 8] [CAIRN]");
  const int m = bench::count_arg(argc, argv, 2, 8, "[RUNS, default 1000] [MAX_CONCURRENT, default 8] [CAIRN]");  // cairn serve's default
  const std::string cairn_bin = argc > 3 ? argv[3] : CAIRN_BIN;
  const int one_by_one = std::min(n, 50);  // runs woken one at a time for the latency
  const fs::path base = fs::path("/var/tmp") / ("cairn-bench-suspended-" + std::to_string(getpid()));
  const fs::path home = base / "home", db = home / "cairn.db", log = home / "serve.log";
  fs::create_directories(home);

  auto raw_seq = bench::raw_bwrap(base / "raw-ws", 30, 1);
  auto raw_conc = bench::raw_bwrap(base / "raw-ws", std::min(n, 200), m);
  const double raw_p50 = summarize(raw_seq.ms).p50;

  const auto served = bench::start_counted_process(
      {cairn_bin, "serve", "--max-concurrent", std::to_string(m), "--suspend-after", "0"}, home, log);
  const pid_t daemon = served.pid;
  bench::running_daemon = daemon;
  bench::wait_for_daemon(daemon, db, log);
  const long idle_rss = bench::status_field(daemon, "VmRSS");

  auto journal = storage::open_journal(db);
  engine::engine_options options;
  options.home = home;
  engine::engine eng(*journal, options);

  // Park.
  peak_sampler parking(daemon);
  std::thread sampling([&] { parking.run(); });
  auto t_park = clock_type::now();
  double kernel0 = bench::kernel_threads_seconds(), daemon0 = served.cpu_seconds();
  for (int i = 0; i < n; ++i) {
    engine::run_request r;
    r.id = run_id(i);
    r.agent = BENCH_AGENT;
    r.input = {{"steps", 1}, {"wait_signal", "go"}};
    eng.submit(r);
  }
  const double submit_ms = ms_since(t_park);
  const double park_ms = wait_for(*journal, storage::run_status::waiting, n, t_park, log);
  const double park_kernel_cpu = 1000.0 * (bench::kernel_threads_seconds() - kernel0) / n,
               park_daemon_cpu = 1000.0 * (served.cpu_seconds() - daemon0) / n;
  parking.stop = true;
  sampling.join();

  // All parked: what the host holds for them. The daemon's CPU over a quiet
  // window shows what N waiting runs cost its scheduler.
  const auto tree = bench::tree_of(daemon);
  const long parked_rss = bench::status_field(daemon, "VmRSS"), threads = bench::status_field(daemon, "Threads");
  const double cpu0 = bench::cpu_seconds(daemon);
  const auto quiet0 = clock_type::now();
  std::this_thread::sleep_for(std::chrono::seconds(10));
  const double idle_cpu_pct = 100.0 * (bench::cpu_seconds(daemon) - cpu0) / (ms_since(quiet0) / 1000.0);
  std::uintmax_t journal_bytes = 0;
  for (const char* suffix : {"", "-wal", "-shm"})
    if (fs::exists(db.string() + suffix)) journal_bytes += fs::file_size(db.string() + suffix);
  const auto ws = bench::disk_use_of(home / "workspaces");
  const int mounts = bench::mounts_under(home);

  // Wake one at a time: signal commit -> attempt started, with nothing queued.
  std::vector<double> wake_latency;
  for (int i = 0; i < one_by_one; ++i) {
    eng.signal(run_id(i), "go", {{"i", i}});
    const auto t0 = clock_type::now();
    while (journal->find_run(run_id(i))->status != storage::run_status::completed) {
      if (ms_since(t0) > 60'000) bench::die("run " + run_id(i) + " did not complete within 60 s of its signal");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::int64_t started = 0;
    for (const auto& e : journal->events(run_id(i)))
      if (e.kind == "attempt_started") started = e.at_ms;
    wake_latency.push_back(static_cast<double>(started - journal->signals(run_id(i)).front().sent_at_ms));
  }

  // Wake the rest at once.
  peak_sampler waking(daemon);
  sampling = std::thread([&] { waking.run(); });
  std::vector<double> signal_ms;
  auto t_wake = clock_type::now();
  kernel0 = bench::kernel_threads_seconds();
  daemon0 = served.cpu_seconds();
  for (int i = one_by_one; i < n; ++i) {
    auto t0 = clock_type::now();
    eng.signal(run_id(i), "go", {{"i", i}});
    signal_ms.push_back(ms_since(t0));
  }
  const double signalled_ms = ms_since(t_wake);
  const double wake_ms = wait_for(*journal, storage::run_status::completed, n, t_wake, log);
  const int woken = std::max(1, n - one_by_one);
  const double wake_kernel_cpu = 1000.0 * (bench::kernel_threads_seconds() - kernel0) / woken,
               wake_daemon_cpu = 1000.0 * (served.cpu_seconds() - daemon0) / woken;
  waking.stop = true;
  sampling.join();

  // Wake-ups against the workspace's size.
  std::vector<sized_run> sized = {{"ws-empty", 0, {}, {}, {}}, {"ws-1gib", 1024, {}, {}, {}}};
  engine::policy roomy = engine::default_policy();
  roomy.limits.max_workspace_bytes = 1536 * mib_bytes;
  for (const auto& r : sized) {
    engine::run_request request;
    request.id = r.id;
    request.agent = BENCH_AGENT;
    // One wait more than the wake-ups timed: the last signal ends the run.
    request.input = {{"steps", 1}, {"wait_signal", "go"}, {"rounds", size_rounds + 1}, {"fill_mb", r.fill_mb}};
    request.policy = roomy;
    eng.submit(request);
  }
  for (const auto& r : sized) await_parked(*journal, r.id, 1, home, log);
  std::vector<std::uint64_t> held;
  for (const auto& r : sized) held.push_back(image_bytes(home, r.id));
  // Which of the two goes first changes each round: the first of a pair
  // was slower whichever it was.
  for (int round = 0; round < size_rounds; ++round)
    for (int k = 0; k < 2; ++k) {
      auto& r = sized[static_cast<std::size_t>((round + k) % 2)];
      const auto t0 = clock_type::now();
      eng.signal(r.id, "go", {{"round", round}});
      await_parked(*journal, r.id, static_cast<std::size_t>(round) + 2, home, log);
      r.cycle_ms.push_back(ms_since(t0));
    }
  for (auto& r : sized) read_wakeups(*journal, r);
  // The end: the files leave the image for the host folder, once, then the
  // run completes; the image goes on a background thread. The two runs
  // above, then end_pairs - 1 more pairs parked for it, each pair ended in
  // turn, the first of a pair alternating.
  std::vector<std::vector<std::string>> ending(2);
  for (std::size_t i = 0; i < sized.size(); ++i) ending[i].push_back(sized[i].id);
  for (int pair = 1; pair < end_pairs; ++pair)
    for (std::size_t i = 0; i < sized.size(); ++i) {
      engine::run_request request;
      request.id = sized[i].id + "-end-" + std::to_string(pair);
      request.agent = BENCH_AGENT;
      request.input = {{"steps", 1}, {"wait_signal", "go"}, {"rounds", 1}, {"fill_mb", sized[i].fill_mb}};
      request.policy = roomy;
      eng.submit(request);
      ending[i].push_back(request.id);
    }
  for (const auto& ids : ending)
    for (const auto& id : ids) await_parked(*journal, id, 1, home, log);
  std::vector<std::vector<double>> end_ms(2), released_ms(2);
  for (int pair = 0; pair < end_pairs; ++pair)
    for (int k = 0; k < 2; ++k) {
      const auto i = static_cast<std::size_t>((pair + k) % 2);
      const auto& id = ending[i][static_cast<std::size_t>(pair)];
      const auto t0 = clock_type::now();
      eng.signal(id, "go", {{"round", pair == 0 ? size_rounds : 0}});
      std::optional<double> completed;
      while (!completed || fs::exists(home / "images" / (id + ".img")) || bench::mounts_under(home) != 0) {
        if (ms_since(t0) > 300'000) bench::die("run " + id + " did not complete within 300 s; see " + log.string());
        if (!completed && journal->find_run(id)->status == storage::run_status::completed) completed = ms_since(t0);
        else std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      end_ms[i].push_back(*completed);
      released_ms[i].push_back(ms_since(t0));
    }

  kill(daemon, SIGTERM);
  bench::running_daemon = 0;
  const int serve_exit = bench::wait_exit(daemon);
  const auto warnings = bench::serve_warnings(log);

  // Per run, from the journal: the parking attempt (attempt started -> waiting)
  // and the waking one (attempt started -> completed), and signal -> done.
  std::vector<double> park_exec, wake_exec, signal_to_done, queued;
  for (int i = 0; i < n; ++i) {
    auto run = journal->find_run(run_id(i));
    std::vector<std::int64_t> attempts;
    std::int64_t waiting_at = 0;
    for (const auto& e : journal->events(run_id(i))) {
      if (e.kind == "attempt_started") attempts.push_back(e.at_ms);
      if (e.kind == "run_waiting" && waiting_at == 0) waiting_at = e.at_ms;
    }
    auto sigs = journal->signals(run_id(i));
    if (!run || !run->finished_at_ms || attempts.size() < 2 || waiting_at == 0 || sigs.empty()) continue;
    queued.push_back(static_cast<double>(attempts.front() - run->created_at_ms));
    park_exec.push_back(static_cast<double>(waiting_at - attempts.front()));
    wake_exec.push_back(static_cast<double>(*run->finished_at_ms - attempts.back()));
    signal_to_done.push_back(static_cast<double>(*run->finished_at_ms - sigs.front().sent_at_ms));
  }
  const auto park_exec_s = summarize(park_exec), wake_exec_s = summarize(wake_exec),
             signal_s = summarize(signal_ms), sig_done_s = summarize(signal_to_done);

  std::printf("suspended: %d runs (1 step, then ctx.wait_signal(\"go\")) under `cairn serve --max-concurrent %d "
              "--suspend-after 0`;\nsubmitted and signalled in-process (engine::submit, engine::signal)\n\n",
              n, m);
  std::printf("raw bwrap /usr/bin/true: one at a time p50 %.1f ms (%.1f starts/s); %zu with up to %d at once: "
              "%.1f starts/s, CPU %.1f ms per start (bwrap, its sandbox's pid 1 and true, + kernel threads)\n\n",
              raw_p50, 1000.0 / raw_p50, raw_conc.ms.size(), m, raw_conc.per_second(), raw_conc.cpu_ms);
  std::printf("park: submit %.0f ms; all %d waiting after %.1f s = %.1f runs parked/s (%.2f x raw starts/s at %d)\n",
              submit_ms, n, park_ms / 1000, 1000.0 * n / park_ms, 1000.0 * n / park_ms / raw_conc.per_second(), m);
  std::printf("      per run: queued p50 %.0f ms; attempt -> waiting p50 %.0f ms, p99 %.0f ms (%.2f x raw start p50)\n",
              summarize(queued).p50, park_exec_s.p50, park_exec_s.p99, park_exec_s.p50 / raw_p50);
  std::printf("      CPU per parked run: %.1f ms = daemon and all it started %.1f + kernel threads %.1f "
              "(%.2f x raw start)\n",
              park_daemon_cpu + park_kernel_cpu, park_daemon_cpu, park_kernel_cpu,
              (park_daemon_cpu + park_kernel_cpu) / raw_conc.cpu_ms);
  if (!served.cpu) std::printf("      %s\n", bench::rusage_caveat);
  std::printf("      peak while parking: daemon RSS %.1f MiB, %d live sandboxes\n\n", bench::mib(parking.rss_kb),
              parking.live);
  std::printf("parked (%d waiting):\n", n);
  std::printf("  processes held for them              %zu: the daemon and %zu descendants (%d live sandboxes)\n",
              1 + tree.descendants.size(), tree.descendants.size(), tree.sandboxes);
  std::printf("  daemon RSS                           %.1f MiB (idle before submits %.1f MiB; %.1f KiB per parked "
              "run); %ld threads\n",
              bench::mib(parked_rss), bench::mib(idle_rss), static_cast<double>(parked_rss - idle_rss) / n, threads);
  std::printf("  daemon CPU with nothing to do        %.2f %% of one core (10 s window)\n", idle_cpu_pct);
  std::printf("  journal (db + wal + shm)             %.2f MiB (%.1f KiB per run)\n",
              static_cast<double>(journal_bytes) / 1048576, static_cast<double>(journal_bytes) / 1024 / n);
  std::printf("  workspaces                           %.2f MiB allocated, %.2f MiB apparent; %ju files, %ju folders; "
              "%d mounted\n\n",
              static_cast<double>(ws.allocated) / 1048576, static_cast<double>(ws.apparent) / 1048576, ws.files,
              ws.folders, mounts);
  const auto latency = summarize(wake_latency);
  std::printf("wake one at a time (%d runs): signal commit -> attempt started p50 %.0f ms, p99 %.0f ms (journal "
              "times, 1 ms resolution)\n",
              one_by_one, latency.p50, latency.p99);
  std::printf("wake the rest: %d signals queued in %.0f ms (p50 %.2f ms, p99 %.2f ms each); all completed %.1f s after the "
              "first = %.1f runs woken/s (%.2f x raw starts/s at %d)\n",
              n - one_by_one, signalled_ms, signal_s.p50, signal_s.p99, wake_ms / 1000, 1000.0 * woken / wake_ms,
              1000.0 * woken / wake_ms / raw_conc.per_second(), m);
  std::printf("      per run: wake attempt -> completed p50 %.0f ms, p99 %.0f ms (%.2f x raw start p50); "
              "signal -> completed p50 %.0f ms\n",
              wake_exec_s.p50, wake_exec_s.p99, wake_exec_s.p50 / raw_p50, sig_done_s.p50);
  std::printf("      CPU per woken run: %.1f ms = daemon and all it started %.1f + kernel threads %.1f "
              "(%.2f x raw start)\n",
              wake_daemon_cpu + wake_kernel_cpu, wake_daemon_cpu, wake_kernel_cpu,
              (wake_daemon_cpu + wake_kernel_cpu) / raw_conc.cpu_ms);
  std::printf("      peak while waking: daemon RSS %.1f MiB, %d live sandboxes\n", bench::mib(waking.rss_kb),
              waking.live);
  std::printf("\nwake-up against the workspace's size (quota image of 1536 MiB each, %d wake-ups each, "
              "alternated; journal times, 1 ms resolution):\n",
              size_rounds);
  for (std::size_t i = 0; i < sized.size(); ++i) {
    const auto wake = summarize(sized[i].wake_ms), attempt = summarize(sized[i].attempt_ms),
               cycle = summarize(sized[i].cycle_ms);
    // The p99 of 6 is the largest.
    std::printf("  %-9s image holds %7.1f MiB: signal -> attempt started p50 %2.0f ms; attempt -> waiting again p50 "
                "%3.0f ms; signal -> waiting, image unmounted p50 %5.1f ms, max %5.1f ms\n",
                sized[i].id.c_str(), static_cast<double>(held[i]) / mib_bytes, wake.p50, attempt.p50, cycle.p50,
                cycle.p99);
    std::printf("            each, in order (ms):");
    for (double ms : sized[i].cycle_ms) std::printf(" %.1f", ms);
    std::printf("\n");
  }
  std::printf("  ratio 1 GiB / empty: signal -> waiting, image unmounted p50 = %.2f\n",
              summarize(sized[1].cycle_ms).p50 / summarize(sized[0].cycle_ms).p50);
  const auto end_empty = summarize(end_ms[0]), end_full = summarize(end_ms[1]);
  std::printf("  the end, %d runs each (last signal -> completed, its files copied out of the image first): empty "
              "p50 %.0f ms, 1 GiB p50 %.0f ms, ratio %.2f; -> its image gone: empty p50 %.0f ms, 1 GiB p50 %.0f ms\n",
              end_pairs, end_empty.p50, end_full.p50, end_full.p50 / end_empty.p50, summarize(released_ms[0]).p50,
              summarize(released_ms[1]).p50);
  for (std::size_t i = 0; i < 2; ++i) {
    std::printf("            %-9s each, in order (ms):", sized[i].id.c_str());
    for (double ms : end_ms[i]) std::printf(" %.0f", ms);
    std::printf("\n");
  }
  std::printf("cairn serve exited %d on SIGTERM; its log has %zu warnings%s%s\n", serve_exit, warnings.size(),
              warnings.empty() ? "" : ", first: ", warnings.empty() ? "" : warnings.front().c_str());

  if (serve_exit != 0 || mounts != 0 || bench::mounts_under(home) != 0) {
    std::fprintf(stderr, "bench: left %s in place for inspection\n", base.c_str());
    return 1;
  }
  bench::remove_bench_folder(base);
  return 0;
}
