// bench/scale_out: what many workers on one journal cost, PostgreSQL against
// SQLite, on one machine (so the figures show the overhead, not the scaling).
//   - throughput: for each backend and W = 1, 2, 3 workers (`cairn serve
//     --lease 10 --max-concurrent 64`, W processes on one journal), 64 runs
//     of 10 empty steps of bench_agent queued with one `cairn submit --from`
//     once every worker serves, timed until all completed: runs/s,
//     steps/s. SQLite: one file in a fresh CAIRN_HOME under /var/tmp;
//     PostgreSQL: a fresh database on a private cluster (tests/support,
//     fsync on, synchronous_commit on).
//   - latency: each round, 500 empty steps on PostgreSQL in 5 runs of 100 (one
//     worker), each step timed by the agent until its ack (durable), against
//     a raw single-row `INSERT` committed on its own (one round trip, one
//     commit) into a table shaped like the journal's steps on the same
//     server. Goal: step p50 <= 1.3 x raw p50. Also against raw + a
//     socketpair round trip (the agent's frame to the host and back, which
//     the raw INSERT does not pay), as step_latency; against the raw INSERT
//     relayed: a frame from another process, the INSERT, the answer (the
//     floor of any host with its agent outside); and against the journal's
//     own write of a step relayed the same way (fenced by the run's epoch and
//     group-committed, as the engine writes it, with nothing of the engine
//     around it): cairn's floor, since its agent is another process and its
//     step that write; what a step costs beyond it is the engine's and the
//     SDK's. The four are measured in turn, 100 of each at a time, so that a
//     machine that speeds up or slows down meanwhile moves them all alike.
// Sandboxes are bwrap with workspace_mb 0 (no quota image), as a deployment
// that keeps workspaces on a shared root would run them.
// Anchor (issue 13): DBOS on PostgreSQL 15 on this machine, ~1.6-2.0 ms per
// step and ~775 steps/s with 64 concurrent 10-step workflows.
// usage: scale_out [ROUNDS (default 3)]
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
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

constexpr int runs_per_round = 64, steps_per_run = 10, latency_steps = 500, latency_chunks = 5;

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

// `n` single-row INSERTs of seq `first` on, each committed on its own
// (bench/raw_pg_journal.hpp); microseconds each.
std::vector<double> raw_inserts(const std::string& url, int first, int n) {
  bench::raw_pg_steps raw(url);
  std::vector<double> us;
  for (int i = first; i < first + n; ++i) {
    const auto t0 = clock_type::now();
    raw.insert(i);
    us.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - t0).count());
  }
  return us;
}

// A commit the relay (the bench's own thread) makes: `n` of them, the i-th as commit(i).
using relayed_commit = std::function<void(int)>;

// Reads `size` bytes, waiting as long as it takes; false once the peer is gone.
bool read_full(int fd, char* to, std::size_t size) {
  for (std::size_t got = 0; got < size;) {
    const ssize_t r = read(fd, to + got, size - got);
    if (r == 0 || (r < 0 && errno != EINTR)) return false;
    if (r > 0) got += static_cast<std::size_t>(r);
  }
  return true;
}

// The floor of any design whose agent is another process, as cairn's
// sandboxed agent is: a frame from a child process over a socketpair to this
// thread (the host), which commits one row and answers; timed by the child,
// as the agent times a step. Unlike raw + a back-to-back round trip it pays
// what a real step pays: both sides sleep through the commit and are woken
// after it. The host side does nothing else: no frame parsed, no ack built,
// no `begin` frame, no hand-off to the journal's thread. `open` runs here
// once the child is forked and returns the commit (its connection is made
// after the fork).
std::vector<double> relayed(int n, const std::function<relayed_commit()>& open) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) bench::die("socketpair failed");
  std::vector<double> us(static_cast<std::size_t>(n));  // the child writes its copy, then sends it
  const pid_t agent = fork();
  if (agent < 0) bench::die("fork failed");
  if (agent == 0) {
    close(sv[1]);
    char frame[96];
    if (!read_full(sv[0], frame, sizeof frame)) _exit(1);  // "ready"
    std::snprintf(frame, sizeof frame, "%s", "{\"t\":\"step\",\"seq\":1}");
    for (auto& t : us) {
      const auto t0 = clock_type::now();
      if (write(sv[0], frame, sizeof frame) != sizeof frame || !read_full(sv[0], frame, sizeof frame)) _exit(1);
      t = std::chrono::duration<double, std::micro>(clock_type::now() - t0).count();
    }
    const auto bytes = us.size() * sizeof(double);
    _exit(write(sv[0], us.data(), bytes) == static_cast<ssize_t>(bytes) ? 0 : 1);
  }
  close(sv[0]);
  std::string failure;
  try {
    const auto commit = open();
    char frame[96] = "ready";
    bool talking = send(sv[1], frame, sizeof frame, MSG_NOSIGNAL) == sizeof frame;
    for (int i = 0; talking && i < n; ++i) {
      talking = read_full(sv[1], frame, sizeof frame);
      if (talking) commit(i);
      talking = talking && send(sv[1], frame, sizeof frame, MSG_NOSIGNAL) == sizeof frame;
    }
    if (!talking) failure = "the relaying process is gone";
  } catch (const std::exception& e) {
    failure = e.what();
  }
  if (failure.empty() && !read_full(sv[1], reinterpret_cast<char*>(us.data()), us.size() * sizeof(double)))
    failure = "the relaying process sent no timings";
  close(sv[1]);
  int status = 0;
  waitpid(agent, &status, 0);
  if (!failure.empty()) bench::die(failure);
  return us;
}

// The raw INSERT, relayed.
std::vector<double> relayed_inserts(const std::string& url, int first, int n) {
  return relayed(n, [&]() -> relayed_commit {
    auto raw = std::make_shared<bench::raw_pg_steps>(url);
    return [raw, base = 1'000'000 + first](int i) { raw->insert(base + i); };
  });
}

// The journal's own write of a step, relayed: one step of a run this
// connection claimed, fenced by its epoch and group-committed as the
// engine's ledger commits it (storage's write_together), with nothing of
// the engine around it (no frame parsed, no policy, no ack built). What a
// step costs beyond it is the engine's and the SDK's.
std::vector<double> relayed_journal_steps(const std::string& url, const std::string& id, int n) {
  // The run, owned from its creation (the worker serving the latency runs
  // does not take it while the relay writes) and ended with the relay (nor
  // afterwards).
  struct relayed_run {
    std::unique_ptr<storage::journal> j;
    std::string id;
    relayed_run(const std::string& url, const std::string& run_id) : j(storage::open_journal(url)), id(run_id) {
      j->create_run({.id = id, .agent = "/bench", .sandbox = "none", .workspace = "/tmp/" + id, .owner = "bench-relay"});
      if (!j->claim_run(id, "bench-relay", "bench-relay")) bench::die("could not claim run " + id);
    }
    ~relayed_run() {
      try {
        j->finish_run(id, storage::run_status::completed, nullptr, std::nullopt);
      } catch (const std::exception& e) {
        bench::die(e.what());
      }
    }
  };
  return relayed(n, [&]() -> relayed_commit {
    auto run = std::make_shared<relayed_run>(url, id);
    return [run](int i) {
      storage::step_record s;
      s.run_id = run->id;
      s.result.seq = static_cast<std::uint64_t>(i);
      s.result.name = "s" + std::to_string(i);
      s.result.ok = true;
      s.result.attempt = 1;
      const std::function<void(storage::journal&)> write = [&](storage::journal& w) { w.append_step(s); };
      if (auto errors = run->j->write_together({&write, 1}); errors[0]) std::rethrow_exception(errors[0]);
    };
  });
}

// One run of `steps` empty steps, `id`, on the workers serving `db`; each step's microseconds.
std::vector<double> step_run(const fs::path& home, const std::string& db, const std::string& id, int steps) {
  const auto t0 = clock_type::now();
  if (int code = bench::run_process(
          {CAIRN_BIN, "submit", "--db", db, BENCH_AGENT, "--id", id, "--input",
           R"({"steps": )" + std::to_string(steps) + "}", "--policy", (home / "policy.json").string()},
          home, home / "submit.log");
      code != 0)
    bench::die("cairn submit exited " + std::to_string(code) + "; see " + (home / "submit.log").string());
  auto journal = storage::open_journal(db, {.read_only = true});
  for (;;) {
    auto run = journal->find_run(id);
    if (run && run->status == storage::run_status::completed)
      return run->output.at("step_us").get<std::vector<double>>();
    if (run && (run->status == storage::run_status::failed || run->status == storage::run_status::cancelled))
      bench::die("the latency run failed; see " + home.string());
    if (ms_since(t0) > 300'000) bench::die("the latency run did not complete in 300 s; see " + home.string());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void append(std::vector<double>& to, const std::vector<double>& more) { to.insert(to.end(), more.begin(), more.end()); }

}  // namespace

int main(int argc, char** argv) {
  const int rounds = bench::count_arg(argc, argv, 1, 3, "[ROUNDS, default 3]");
  const fs::path base = fs::path("/var/tmp") / ("cairn-scale-out-" + std::to_string(getpid()));
  fs::create_directories(base);
  testing::pg_cluster cluster;

  std::map<std::pair<std::string, int>, cell> cells;
  std::vector<double> step_us, raw_us, relayed_us, journal_us;
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
    // The four in turn, `latency_chunks` times, so that a machine that
    // speeds up or slows down meanwhile (this VM does, within seconds)
    // moves them all alike. One worker serves the runs throughout.
    const std::string db = cluster.fresh_database();
    const fs::path home = fresh_home(base, "latency-" + std::to_string(round));
    const auto worker = start_workers(home, db, 1);
    for (int chunk = 0; chunk < latency_chunks; ++chunk) {
      const int n = latency_steps / latency_chunks, first = (round * latency_chunks + chunk) * n;
      const std::string tag = std::to_string(round) + "-" + std::to_string(chunk);
      append(raw_us, raw_inserts(db, first, n));
      append(relayed_us, relayed_inserts(db, first, n));
      append(journal_us, relayed_journal_steps(db, "relayed-" + tag, n));
      append(step_us, step_run(home, db, "latency-" + tag, n));
    }
    stop_workers(worker, home);
  }

  std::printf("scale_out: %d runs x %d empty steps of bench_agent, queued at once, %d rounds (medians); %s\n",
              runs_per_round, steps_per_run, rounds, bench::machine().c_str());
  std::printf("                                       runs/s    steps/s\n");
  for (const auto& [key, c] : cells)
    std::printf("%-10s %d worker%s                %9.1f  %9.1f\n", key.first.c_str(), key.second,
                key.second == 1 ? " " : "s", median(c.runs_per_s), median(c.steps_per_s));
  const auto step = summarize(step_us), raw = summarize(raw_us), relayed = summarize(relayed_us),
             journal = summarize(journal_us);
  const auto rtt = bench::socketpair_round_trip(latency_steps * rounds);
  std::printf("PostgreSQL, %d steps in %d runs, microseconds  p50        p99\n", latency_steps * rounds,
              latency_chunks * rounds);
  std::printf("raw INSERT, committed alone (one round trip)  %9.1f  %9.1f\n", raw.p50, raw.p99);
  std::printf("socketpair round trip, back to back           %9.1f  %9.1f\n", rtt.p50, rtt.p99);
  std::printf("raw INSERT relayed (frame, INSERT, answer)    %9.1f  %9.1f\n", relayed.p50, relayed.p99);
  std::printf("journal step write relayed (fenced, grouped)  %9.1f  %9.1f\n", journal.p50, journal.p99);
  std::printf("durable step, one worker                      %9.1f  %9.1f\n", step.p50, step.p99);
  std::printf("ratio: step p50 / raw INSERT p50 = %.2f (target <= 1.30)\n", step.p50 / raw.p50);
  std::printf("ratio: step p50 / (raw INSERT + round trip) p50 = %.2f (as bench/step_latency on SQLite)\n",
              step.p50 / (raw.p50 + rtt.p50));
  std::printf("ratio: step p50 / raw INSERT relayed p50 = %.2f\n", step.p50 / relayed.p50);
  std::printf("ratio: journal's step write relayed p50 / raw INSERT p50 = %.2f (cairn's floor)\n",
              journal.p50 / raw.p50);
  std::printf("ratio: step p50 / journal's step write relayed p50 = %.2f (the engine's and the SDK's share)\n",
              step.p50 / journal.p50);
  std::printf("anchor: DBOS on PostgreSQL 15, this machine: 1600-2000 us per step, ~775 steps/s at 64 x 10\n");
  if (bench::mounts_under(base) == 0) fs::remove_all(base);
  return 0;
}
