// bench/scale_out: what many workers on one journal cost, PostgreSQL against
// SQLite, on one machine (so the figures show the overhead, not the scaling).
//   - throughput: for each backend and W = 1, 2, 3 workers (`cairn serve
//     --lease 10 --max-concurrent 64`, W processes on one journal), 64 runs
//     of 10 empty steps of bench_agent queued with one `cairn submit --from`
//     once every worker serves, timed until all completed: runs/s,
//     steps/s. SQLite: one file in a fresh CAIRN_HOME under /var/tmp;
//     PostgreSQL: a fresh database on a private cluster (tests/support,
//     fsync on, synchronous_commit on).
//   - latency: one run of 500 empty steps on PostgreSQL (one worker), each
//     step timed by the agent until its ack (durable), against a raw
//     single-row `INSERT` committed on its own (one round trip, one commit)
//     into a table shaped like the journal's steps on the same server,
//     measured just before in the same round. Goal: step p50 <= 1.3 x raw p50.
//     Also against raw + a socketpair round trip (the agent's frame to the
//     host and back, which the raw INSERT does not pay), as step_latency,
//     and against the raw INSERT relayed: a frame from another thread, the
//     INSERT, the answer (the floor of any host with its agent outside).
// Sandboxes are bwrap with workspace_mb 0 (no quota image), as a deployment
// that keeps workspaces on a shared root would run them.
// Anchor (issue 13): DBOS on PostgreSQL 15 on this machine, ~1.6-2.0 ms per
// step and ~775 steps/s with 64 concurrent 10-step workflows.
// usage: scale_out [ROUNDS (default 3)]
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <thread>

#include "bench/args.hpp"
#include "bench/host_probe.hpp"
#include "bench/raw_pg_journal.hpp"
#include "bench/round_trip.hpp"
#include "bench/stats.hpp"
#include "storage/journal.hpp"
#include "tests/support/pg_cluster.hpp"

using namespace cairn;
using bench::clock_type;
using bench::ms_since;
namespace fs = std::filesystem;

namespace {

constexpr int runs_per_round = 64, steps_per_run = 10, latency_steps = 500;

double median(std::vector<double> v) { return summarize(std::move(v)).p50; }

struct cell {
  std::vector<double> runs_per_s, steps_per_s;
};

// A fresh CAIRN_HOME with the policy file the runs get.
fs::path fresh_home(const fs::path& base, const std::string& name) {
  const fs::path home = base / name;
  fs::create_directories(home);
  std::ofstream(home / "policy.json") << R"({"limits": {"workspace_mb": 0}})";
  return home;
}

// Starts `count` workers on `db` and waits until each serves (it says so in its log).
std::vector<pid_t> start_workers(const fs::path& home, const std::string& db, int count) {
  std::vector<pid_t> workers;
  std::vector<fs::path> logs;
  for (int i = 0; i < count; ++i) {
    logs.push_back(home / ("serve-" + std::to_string(i) + ".log"));
    workers.push_back(bench::start_process({CAIRN_BIN, "serve", "--db", db, "--lease", "10", "--max-concurrent", "64"},
                                           home, logs.back()));
  }
  const auto t0 = clock_type::now();
  for (int i = 0; i < count; ++i)
    while (bench::read_whole_file(logs[i]).find("cairn serve: journal") == std::string::npos) {
      int status = 0;
      if (waitpid(workers[i], &status, WNOHANG) == workers[i]) bench::die("cairn serve exited; see " + logs[i].string());
      if (ms_since(t0) > 30'000) bench::die("cairn serve did not start within 30 s; see " + logs[i].string());
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  return workers;
}

void stop_workers(const std::vector<pid_t>& workers, const fs::path& home) {
  for (pid_t w : workers) kill(w, SIGTERM);
  for (pid_t w : workers)
    if (int code = bench::wait_exit(w); code != 0)
      std::fprintf(stderr, "bench: cairn serve exited %d on SIGTERM; see %s\n", code, home.c_str());
}

// One round of 64 x 10 on `db` with `workers` workers: runs/s and steps/s.
std::pair<double, double> throughput_round(const fs::path& home, const std::string& db, int workers) {
  auto pids = start_workers(home, db, workers);
  {
    std::ofstream lines(home / "runs.jsonl");
    for (int i = 0; i < runs_per_round; ++i)
      lines << R"({"id": "r-)" << i << R"(", "input": {"steps": )" << steps_per_run << "}}\n";
  }
  const auto t0 = clock_type::now();
  if (int code = bench::run_process({CAIRN_BIN, "submit", "--db", db, "--from", (home / "runs.jsonl").string(),
                                     BENCH_AGENT, "--policy", (home / "policy.json").string()},
                                    home, home / "submit.log");
      code != 0)
    bench::die("cairn submit exited " + std::to_string(code) + "; see " + (home / "submit.log").string());
  bench::wait_all_completed(db, runs_per_round, t0, std::chrono::seconds(300), home / "serve-0.log");
  const double wall_ms = ms_since(t0);
  stop_workers(pids, home);
  const double runs_per_s = 1000.0 * runs_per_round / wall_ms;
  return {runs_per_s, runs_per_s * steps_per_run};
}

// `n` single-row INSERTs, each committed on its own (bench/raw_pg_journal.hpp); microseconds each.
std::vector<double> raw_inserts(const std::string& url, int round, int n) {
  bench::raw_pg_steps raw(url);
  std::vector<double> us;
  for (int i = round * n; i < (round + 1) * n; ++i) {
    const auto t0 = clock_type::now();
    raw.insert(i);
    us.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - t0).count());
  }
  return us;
}

// The floor of any design whose agent is another process: a frame to a
// thread (the host) over a socketpair, which INSERTs and commits one row
// (as raw_inserts) and answers; timed by the sender, as the agent times a
// step. Unlike raw + a back-to-back round trip it pays what a real step
// pays: both sides sleep through the commit and are woken after it.
std::vector<double> relayed_inserts(const std::string& url, int round, int n) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) bench::die("socketpair failed");
  std::string failure;
  std::thread host([&] {
    try {
      bench::raw_pg_steps raw(url);
      char frame[96];
      for (int i = 0; i < n; ++i) {
        if (read(sv[1], frame, sizeof frame) != sizeof frame) return;
        raw.insert(1'000'000 + round * n + i);
        if (write(sv[1], frame, sizeof frame) != sizeof frame) return;
      }
    } catch (const std::exception& e) {
      failure = e.what();
      close(sv[1]);
    }
  });
  std::vector<double> us;
  char frame[96] = "{\"t\":\"step\",\"seq\":1}";
  for (int i = 0; i < n; ++i) {
    const auto t0 = clock_type::now();
    if (write(sv[0], frame, sizeof frame) != sizeof frame || read(sv[0], frame, sizeof frame) != sizeof frame) break;
    us.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - t0).count());
  }
  host.join();
  close(sv[0]);
  close(sv[1]);
  if (!failure.empty()) bench::die(failure);
  return us;
}

// One run of `latency_steps` empty steps on `db` with one worker; each step's microseconds.
std::vector<double> step_latencies(const fs::path& home, const std::string& db, int round) {
  auto pids = start_workers(home, db, 1);
  const std::string id = "latency-" + std::to_string(round);
  const auto t0 = clock_type::now();
  if (int code = bench::run_process({CAIRN_BIN, "submit", "--db", db, BENCH_AGENT, "--id", id, "--input",
                                     R"({"steps": )" + std::to_string(latency_steps) + "}", "--policy",
                                     (home / "policy.json").string()},
                                    home, home / "submit.log");
      code != 0)
    bench::die("cairn submit exited " + std::to_string(code) + "; see " + (home / "submit.log").string());
  storage::journal journal(db, {.read_only = true});
  for (;;) {
    auto run = journal.find_run(id);
    if (run && run->status == storage::run_status::completed) {
      stop_workers(pids, home);
      return run->output.at("step_us").get<std::vector<double>>();
    }
    if (run && (run->status == storage::run_status::failed || run->status == storage::run_status::cancelled))
      bench::die("the latency run failed; see " + home.string());
    if (ms_since(t0) > 300'000) bench::die("the latency run did not complete in 300 s; see " + home.string());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = bench::count_arg(argc, argv, 1, 3, "[ROUNDS, default 3]");
  const fs::path base = fs::path("/var/tmp") / ("cairn-scale-out-" + std::to_string(getpid()));
  fs::create_directories(base);
  testing::pg_cluster cluster;

  std::map<std::pair<std::string, int>, cell> cells;
  std::vector<double> step_us, raw_us, relayed_us;
  for (int round = 0; round < rounds; ++round) {
    for (int workers = 1; workers <= 3; ++workers) {
      const std::string tag = std::to_string(workers) + "-" + std::to_string(round);
      const fs::path sqlite_home = fresh_home(base, "sqlite-" + tag);
      auto [sr, ss] = throughput_round(sqlite_home, (sqlite_home / "cairn.db").string(), workers);
      cells[{"sqlite", workers}].runs_per_s.push_back(sr);
      cells[{"sqlite", workers}].steps_per_s.push_back(ss);
      const fs::path pg_home = fresh_home(base, "pg-" + tag);
      auto [pr, ps] = throughput_round(pg_home, cluster.fresh_database(), workers);
      cells[{"postgresql", workers}].runs_per_s.push_back(pr);
      cells[{"postgresql", workers}].steps_per_s.push_back(ps);
    }
    const std::string db = cluster.fresh_database();
    auto raw = raw_inserts(db, round, latency_steps);
    raw_us.insert(raw_us.end(), raw.begin(), raw.end());
    auto relayed = relayed_inserts(db, round, latency_steps);
    relayed_us.insert(relayed_us.end(), relayed.begin(), relayed.end());
    auto steps = step_latencies(fresh_home(base, "latency-" + std::to_string(round)), db, round);
    step_us.insert(step_us.end(), steps.begin(), steps.end());
  }

  std::printf("scale_out: %d runs x %d empty steps of bench_agent, queued at once, %d rounds (medians); %s\n",
              runs_per_round, steps_per_run, rounds, bench::machine().c_str());
  std::printf("                                       runs/s    steps/s\n");
  for (const auto& [key, c] : cells)
    std::printf("%-10s %d worker%s                %9.1f  %9.1f\n", key.first.c_str(), key.second,
                key.second == 1 ? " " : "s", median(c.runs_per_s), median(c.steps_per_s));
  const auto step = summarize(step_us), raw = summarize(raw_us), relayed = summarize(relayed_us);
  const auto rtt = bench::socketpair_round_trip(latency_steps * rounds);
  std::printf("PostgreSQL, one run of %d steps, microseconds      p50        p99\n", latency_steps);
  std::printf("raw INSERT, committed alone (one round trip)  %9.1f  %9.1f\n", raw.p50, raw.p99);
  std::printf("socketpair round trip, back to back           %9.1f  %9.1f\n", rtt.p50, rtt.p99);
  std::printf("raw INSERT relayed (frame, INSERT, answer)    %9.1f  %9.1f\n", relayed.p50, relayed.p99);
  std::printf("durable step, one worker                      %9.1f  %9.1f\n", step.p50, step.p99);
  std::printf("ratio: step p50 / raw INSERT p50 = %.2f (target <= 1.30)\n", step.p50 / raw.p50);
  std::printf("ratio: step p50 / (raw INSERT + round trip) p50 = %.2f (as bench/step_latency on SQLite)\n",
              step.p50 / (raw.p50 + rtt.p50));
  std::printf("ratio: step p50 / raw INSERT relayed p50 = %.2f\n", step.p50 / relayed.p50);
  std::printf("anchor: DBOS on PostgreSQL 15, this machine: 1600-2000 us per step, ~775 steps/s at 64 x 10\n");
  if (bench::mounts_under(base) == 0) fs::remove_all(base);
  return 0;
}
