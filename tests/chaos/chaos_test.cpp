// Chaos: three `cairn serve` workers on one journal execute hundreds of runs
// of tests/agents/chaos_agent (steps, a tool call, a timer, a signal, a child
// run) while a driver SIGKILLs a random worker every 2-5 s and starts it
// again, and (on PostgreSQL) once crashes the database server. The layout is
// the one the docs recommend (chaos_home): sandboxes with the default
// policy, so every workspace is a quota image; on PostgreSQL a home per
// worker and one shared --workspace-root. Every wait of 200 ms or more
// suspends its run, so runs wake on other workers all the time. Afterwards
// the journal, the runs' workspaces and the tool's own count say that:
// - every file a journaled step wrote is in the run's final workspace;
// - every run and every child completed with the output its input implies;
// - no acknowledged step or tool call ran again (chaos_agent and count_tool.sh
//   count their executions outside the journal; journaled count == real count);
// - every run's seqs are contiguous and of the kinds its input implies, each once;
// - every timer was set once and fired once, not early; every signal was
//   delivered once, into the step that waited for it; every child was started once;
// - no two workers executed a run at once: every step written by attempt A of
//   a run was committed before attempt A+1 began (a stale attempt's write
//   after the takeover is what the epoch fence refuses), and the attempts
//   that wrote a run's steps only grow along its seqs.
// Workers ride out the database's restart (they wait for it to answer); one
// that exits by itself (one started while the database is down exits 3) is
// started again, as a supervisor would; one that crashes fails the test.
// The problems found are listed together, then a one-paragraph summary.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "storage/journal.hpp"
#include "tests/cairn_cli.hpp"
#include "tests/support/pg_cluster.hpp"
#include "tests/temp_dir.hpp"

using namespace cairn;
using json = nlohmann::json;
using namespace std::chrono_literals;

namespace {

namespace fs = std::filesystem;
using steady = std::chrono::steady_clock;
using protocol::step_kind;
using storage::run_status;

double seconds_since(steady::time_point t) { return std::chrono::duration<double>(steady::now() - t).count(); }

// The shape of one chaos run.
struct chaos_shape {
  int workers = 3;
  int runs = 300;                      // top-level runs; each starts one child
  std::chrono::seconds deadline{480};  // for every run to end; the report says how long it took
  bool crash_database = false;         // once, a third of the way through (PostgreSQL only)
};

const json child_input = {{"sleep_ms", 300}};
const json run_input = {{"tool", true}, {"sleep_ms", 1000}, {"signal", "go"}, {"child", child_input}};

// What chaos_agent journals for `input`, in seq order (see its header).
std::vector<std::pair<step_kind, std::string>> layout(const json& input) {
  std::vector<std::pair<step_kind, std::string>> l{{step_kind::step, "a"}};
  if (input.value("tool", false)) l.emplace_back(step_kind::tool, "count");
  l.emplace_back(step_kind::step, "b");
  if (input.contains("sleep_ms")) l.emplace_back(step_kind::sleep, "");
  l.emplace_back(step_kind::step, "c");
  if (input.contains("signal")) l.emplace_back(step_kind::signal, "");
  if (input.contains("child")) l.emplace_back(step_kind::child, "");
  l.emplace_back(step_kind::step, "d");
  if (input.contains("child")) l.emplace_back(step_kind::join, "");
  l.emplace_back(step_kind::step, "e");
  return l;
}

int count_in(const fs::path& file) {
  int n = -1;
  std::ifstream(file) >> n;
  return n;
}

// The journal's URL or path, the CAIRN_HOMEs, the policy granting
// count_tool.sh, and the `cairn` commands run against them. As the docs
// recommend: on PostgreSQL each worker has a home of its own and all share
// one --workspace-root; on SQLite the workers share the home that holds the
// journal. The policy is the default one plus the tool, so every run's
// files live in a quota image.
class chaos_home {
 public:
  // `db`: a PostgreSQL URL, or "" for a SQLite file in the home.
  explicit chaos_home(std::string db)
      : shared_home_(db.empty()), db_(db.empty() ? (dir_ / "home" / "cairn.db").string() : std::move(db)) {
    fs::create_directories(tool_dir());
    fs::create_directories(dir_ / "logs");
    if (!shared_home_) fs::create_directories(workspace_root());
    std::ofstream(policy()) << json{{"tools",
                                     {{"count",
                                       {{"command", {COUNT_TOOL}},
                                        {"input", {{"run", "string"}}},
                                        {"idempotency", "idempotent"},
                                        {"env", {"CAIRN_CHAOS_TOOL_DIR"}}}}}}};
  }

  const std::string& db() const { return db_; }
  fs::path tool_dir() const { return dir_ / "tool"; }
  fs::path policy() const { return dir_ / "policy.json"; }
  fs::path log(const std::string& name) const { return dir_ / "logs" / name; }
  // The CAIRN_HOME of worker `worker` (-1: the one `cairn` commands use).
  fs::path home(int worker = -1) const {
    return shared_home_ || worker < 0 ? dir_ / "home" : dir_ / ("home-" + std::to_string(worker));
  }
  // "" on SQLite; the folder every worker makes workspaces in on PostgreSQL.
  fs::path workspace_root() const { return shared_home_ ? fs::path() : dir_ / "shared"; }
  testing::cli_options options(int worker = -1) const {
    return {.env = {{"CAIRN_HOME", home(worker).string()}, {"CAIRN_CHAOS_TOOL_DIR", tool_dir().string()}}};
  }

  testing::cli_result cli(std::vector<std::string> args) const {
    args.insert(args.end(), {"--db", db_});
    return testing::run_program(CAIRN_BIN, std::move(args), dir_.path(), options());
  }

  std::unique_ptr<storage::journal> journal() const {
    return storage::open_journal(db_, storage::journal_options{.read_only = true});
  }

 private:
  testing::temp_dir dir_;
  bool shared_home_;
  std::string db_;
};

// The workers: `cairn serve` processes, each started again after it is
// killed or exits. Each incarnation logs to a file of its own.
class worker_pool {
 public:
  worker_pool(const chaos_home& home, int n) : home_(home), slots_(n) {
    for (int i = 0; i < n; ++i) start(i);
  }
  ~worker_pool() {
    for (auto& s : slots_)
      if (s.pid > 0) {
        ::kill(s.pid, SIGKILL);
        ::waitpid(s.pid, nullptr, 0);
      }
  }
  worker_pool(const worker_pool&) = delete;
  worker_pool& operator=(const worker_pool&) = delete;

  int size() const { return static_cast<int>(slots_.size()); }

  void kill9(int i) {
    auto& s = slots_[i];
    if (s.pid <= 0) return;
    ::kill(s.pid, SIGKILL);
    ::waitpid(s.pid, nullptr, 0);
    s.pid = -1;
    start(i);
  }

  // Starts again, no more than once a second each, the workers that exited
  // by themselves (a worker may give up while the database is down); returns
  // how many exited.
  int restart_exited() {
    int exited = 0;
    for (int i = 0; i < size(); ++i) {
      auto& s = slots_[i];
      int status = 0;
      if (s.pid > 0 && ::waitpid(s.pid, &status, WNOHANG) == s.pid) {
        s.pid = -1;
        s.exited_at = steady::now();
        ++exited;
        // Only the driver sends signals: one that ends a worker by itself is a crash (abort, segfault).
        crashes_ += WIFSIGNALED(status);
        exit_notes_.push_back(last_log_lines(i) + "\n  " +
                              (WIFSIGNALED(status) ? "killed by signal " + std::to_string(WTERMSIG(status))
                                                   : "exit code " + std::to_string(WEXITSTATUS(status))));
      }
      if (s.pid <= 0 && steady::now() - s.exited_at >= 1s) start(i);
    }
    return exited;
  }

  // SIGTERM to every worker; true when all exited 0 within `limit`. A worker
  // has its SIGTERM handler once it has said where it serves: one started
  // a moment ago is given until then.
  bool stop_all(std::chrono::seconds limit) {
    bool clean = true;
    const auto deadline = steady::now() + limit;
    for (int i = 0; i < size(); ++i) {
      while (slots_[i].pid > 0 && steady::now() < deadline &&
             testing::slurp(home_.log(log_name(i, slots_[i].incarnation))).find("cairn serve: journal") ==
                 std::string::npos)
        std::this_thread::sleep_for(20ms);
      if (slots_[i].pid > 0) ::kill(slots_[i].pid, SIGTERM);
    }
    for (auto& s : slots_) {
      while (s.pid > 0) {
        int status = 0;
        if (::waitpid(s.pid, &status, WNOHANG) == s.pid) {
          clean = clean && WIFEXITED(status) && WEXITSTATUS(status) == 0;
          s.pid = -1;
        } else if (steady::now() > deadline) {
          ::kill(s.pid, SIGKILL);
          ::waitpid(s.pid, nullptr, 0);
          s.pid = -1;
          clean = false;
        } else {
          std::this_thread::sleep_for(20ms);
        }
      }
    }
    return clean;
  }

  const std::vector<std::string>& exit_notes() const { return exit_notes_; }
  // Workers that ended by a signal the driver did not send.
  int crashes() const { return crashes_; }

 private:
  struct slot {
    pid_t pid = -1;
    int incarnation = 0;
    steady::time_point exited_at{};
  };

  std::string log_name(int i, int incarnation) const {
    return "worker-" + std::to_string(i) + "-" + std::to_string(incarnation) + ".log";
  }

  void start(int i) {
    auto& s = slots_[i];
    const auto log = home_.log(log_name(i, ++s.incarnation));
    // Waits of 200 ms and more suspend: the runs wake, again and again, on whichever worker takes them.
    // The count tool is a command on the host: a shared journal's worker must be told it may run one.
    std::vector<std::string> args = {"serve", "--db", home_.db(), "--max-concurrent", "16", "--lease", "3",
                                     "--suspend-after", "200", "--allow", "command-tools"};
    if (!home_.workspace_root().empty()) args.insert(args.end(), {"--workspace-root", home_.workspace_root().string()});
    s.pid = testing::spawn_program(CAIRN_BIN, args, log, log, home_.options(i));
    REQUIRE(s.pid > 0);
  }

  std::string last_log_lines(int i) const {
    std::istringstream in(testing::slurp(home_.log(log_name(i, slots_[i].incarnation))));
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    std::string out = "worker " + std::to_string(i) + " exited:";
    for (std::size_t k = lines.size() > 3 ? lines.size() - 3 : 0; k < lines.size(); ++k) out += "\n  " + lines[k];
    return out;
  }

  const chaos_home& home_;
  std::vector<slot> slots_;
  std::vector<std::string> exit_notes_;
  int crashes_ = 0;
};

// What the checks found, and what the summary reports.
struct findings {
  std::vector<std::string> problems;
  int runs = 0, attempts = 0, claims = 0, steps = 0, tool_reruns = 0, step_reruns = 0;

  void problem(const std::string& run, const std::string& what) { problems.push_back(run + ": " + what); }
};

// Checks run `id` (and its child, recursively) against what `input` implies;
// `payload` is the signal the test sent it.
void check_run(storage::journal& j, const chaos_home& home, const std::string& id, const json& input,
               const json& payload, findings& f) {
  auto run = j.find_run(id);
  if (!run) return f.problem(id, "not in the journal");
  ++f.runs;
  f.attempts += run->attempts;
  f.claims += static_cast<int>(run->epoch);
  if (run->status != run_status::completed)
    return f.problem(id, "ended " + std::string(storage::to_string(run->status)) +
                             (run->error ? ": " + run->error->message : ""));

  const auto expected = layout(input);
  const auto steps = j.steps(id);
  f.steps += static_cast<int>(steps.size());
  if (steps.size() != expected.size())
    return f.problem(id, "journaled " + std::to_string(steps.size()) + " steps, expected " +
                             std::to_string(expected.size()));

  // When each attempt began: a step written by attempt A must be committed by then for A + 1.
  std::map<int, std::int64_t> attempt_began;
  for (const auto& e : j.events(id))
    if (e.kind == "attempt_started" && !attempt_began.emplace(e.data.value("attempt", 0), e.at_ms).second)
      f.problem(id, "attempt " + e.data.dump() + " started twice");

  json counts = json::object(), child_output;
  std::string child_id;
  int last_attempt = 0;
  for (std::size_t seq = 0; seq < steps.size(); ++seq) {
    const auto& s = steps[seq];
    const auto& [kind, name] = expected[seq];
    const std::string where = "seq " + std::to_string(seq) + " ";
    if (s.result.seq != seq) f.problem(id, where + "holds seq " + std::to_string(s.result.seq));
    if (s.result.kind != kind || !s.result.ok) {
      f.problem(id, where + "is " + std::string(protocol::to_string(s.result.kind)) + (s.result.ok ? "" : " (failed)") +
                        ", expected " + std::string(protocol::to_string(kind)));
      continue;
    }
    const json& out = s.result.output;
    switch (kind) {
      case step_kind::step: {
        const int count = out.value("count", -1), attempt = out.value("attempt", 0);
        const int real = count_in(fs::path(run->workspace) / ("count-" + name));
        counts[name] = count;
        f.step_reruns += std::max(0, count - 1);
        if (s.result.name != name) f.problem(id, where + "is named " + s.result.name + ", expected " + name);
        if (real < 0)
          f.problem(id, where + "step " + name + " was journaled, but the file count-" + name +
                            " it wrote is not in the workspace " + run->workspace + ": its files were lost");
        else if (real != count)
          f.problem(id, where + "step " + name + " journaled execution " + std::to_string(count) + " but ran " +
                            std::to_string(real) + " times: an acknowledged step ran again");
        if (attempt < last_attempt)
          f.problem(id, where + "written by attempt " + std::to_string(attempt) + " after attempt " +
                            std::to_string(last_attempt) + " wrote");
        last_attempt = std::max(last_attempt, attempt);
        if (attempt < 1 || attempt > run->attempts)
          f.problem(id, where + "written by attempt " + std::to_string(attempt) + " of " +
                            std::to_string(run->attempts));
        if (auto next = attempt_began.find(attempt + 1);
            next != attempt_began.end() && s.finished_at_ms > next->second)
          f.problem(id, where + "committed at " + std::to_string(s.finished_at_ms) + " by attempt " +
                            std::to_string(attempt) + ", after attempt " + std::to_string(attempt + 1) +
                            " began at " + std::to_string(next->second) + ": two workers wrote the run");
        break;
      }
      case step_kind::tool: {
        const std::string key = id + "/" + std::to_string(seq);
        const int real = count_in(home.tool_dir() / (id + "_" + std::to_string(seq)));
        f.tool_reruns += std::max(0, real - 1);
        if (out.value("key", "") != key || out.value("call", -1) != real)
          f.problem(id, where + "tool result " + out.dump() + " but the tool ran " + std::to_string(real) +
                            " times for " + key + ": an acknowledged call ran again");
        break;
      }
      case step_kind::sleep: {
        int timers = 0;
        for (const auto& e : j.events_at(id, seq))
          if (e.kind == "timer_set") {
            ++timers;
            if (e.data.value("until_ms", std::int64_t{0}) != out.value("until_ms", std::int64_t{-1}))
              f.problem(id, where + "timer set for " + e.data.dump() + " fired as " + out.dump());
          }
        if (timers != 1) f.problem(id, where + "timer set " + std::to_string(timers) + " times");
        if (out.value("fired_at_ms", std::int64_t{0}) < out.value("until_ms", INT64_MAX))
          f.problem(id, where + "timer fired early: " + out.dump());
        break;
      }
      case step_kind::signal: {
        const auto signals = j.signals(id);
        int events = 0;
        for (const auto& e : j.events(id)) events += e.kind == "signal_delivered";
        if (signals.size() != 1 || signals[0].delivered_seq != seq || events != 1 ||
            out.value("timed_out", true) || out["payload"] != payload)
          f.problem(id, where + "signal " + out.dump() + ": " + std::to_string(signals.size()) + " queued, " +
                            std::to_string(events) + " deliveries, expected one of " + payload.dump());
        break;
      }
      case step_kind::child:
        child_id = out.value("run_id", "");
        if (child_id != id + "." + std::to_string(seq)) f.problem(id, where + "started child " + out.dump());
        break;
      case step_kind::join:
        child_output = out;
        break;
      default:
        break;
    }
  }

  json expected_output = {{"steps", counts}, {"mismatches", json::array()}};
  if (input.value("tool", false)) expected_output["tool"] = steps[1].result.output;
  if (input.contains("signal")) expected_output["signal"] = payload;
  if (input.contains("child")) {
    expected_output["child"] = child_output;
    const auto children = j.children(id);
    if (children.size() != 1 || children[0].id != child_id)
      f.problem(id, std::to_string(children.size()) + " children, expected one: " + child_id);
    auto child = j.find_run(child_id);
    if (child && child->output != child_output)
      f.problem(id, "joined " + child_output.dump() + " but the child's output is " + child->output.dump());
    check_run(j, home, child_id, input["child"], nullptr, f);
  }
  if (run->output != expected_output)
    f.problem(id, "output " + run->output.dump() + ", expected " + expected_output.dump());
}

// The sum of fenced_writes over the workers `cairn workers --json` lists.
std::int64_t fenced_writes(const chaos_home& home) {
  auto r = home.cli({"workers", "--json"});
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  const auto listed = json::parse(r.out);
  const auto& rows = listed.is_object() ? listed.at("workers") : listed;
  std::int64_t sum = 0;
  for (const auto& w : rows) sum += w.value("fenced_writes", std::int64_t{0});
  return sum;
}

std::string run_id(int i) { return "c-" + std::to_string(i); }

// Queues runs c-0 ... c-(n-1) with one `cairn submit --from`.
void submit_runs(const chaos_home& home, int n) {
  {
    std::ofstream lines(home.log("runs.jsonl"));
    for (int i = 0; i < n; ++i) lines << json{{"id", run_id(i)}, {"input", run_input}}.dump() << "\n";
  }
  auto submitted =
      home.cli({"submit", "--from", home.log("runs.jsonl").string(), CHAOS_AGENT, "--policy", home.policy().string()});
  INFO(submitted.err);
  REQUIRE(submitted.code == 0);
}

// `cairn signal` of run i with payload {"n": i}; whether the signal is queued.
bool send_signal(const chaos_home& home, int i, int& retries) {
  const std::string id = run_id(i);
  if (home.cli({"signal", id, "go", "--data", json{{"n", i}}.dump()}).code == 0) return true;
  // It may have been queued before the command failed (the database went away at its commit).
  ++retries;
  try {
    return !home.journal()->signals(id).empty();
  } catch (const std::exception&) {
    return false;
  }
}

void run_chaos(const chaos_shape& shape, const std::string& db, testing::pg_cluster* cluster) {
  chaos_home home(db);
  submit_runs(home, shape.runs);

  std::mt19937 random(std::random_device{}());
  auto between = [&](int lo_ms, int hi_ms) {
    return std::chrono::milliseconds(std::uniform_int_distribution<int>(lo_ms, hi_ms)(random));
  };

  const auto t0 = steady::now();
  worker_pool workers(home, shape.workers);
  int kills = 0, exits = 0, signalled = 0, signal_retries = 0, polls_failed = 0;
  double database_down_s = -1, database_crashed_at_s = -1;
  auto next_kill = t0 + between(2000, 5000);
  auto next_poll = t0;
  std::map<run_status, int> counts;
  bool all_ended = false;
  const int total_runs = 2 * shape.runs;

  // One thread forks every process (PR_SET_PDEATHSIG follows the thread) and drives everything.
  while (steady::now() - t0 < shape.deadline) {
    const auto now = steady::now();
    if (now >= next_kill) {
      workers.kill9(std::uniform_int_distribution<int>(0, workers.size() - 1)(random));
      ++kills;
      next_kill = now + between(2000, 5000);
    }
    exits += workers.restart_exited();

    if (cluster && shape.crash_database && database_down_s < 0 &&
        (counts[run_status::completed] >= total_runs / 3 || now - t0 > 60s)) {
      const auto down = steady::now();
      database_crashed_at_s = seconds_since(t0);
      cluster->stop(false);
      cluster->start();
      database_down_s = seconds_since(down);
    }

    // Signals go out a few at a time, so some runs find theirs queued and some wait for it.
    for (int k = 0; k < 4 && signalled < shape.runs; ++k) {
      if (!send_signal(home, signalled, signal_retries)) break;
      ++signalled;
    }

    if (now >= next_poll) {
      next_poll = now + 500ms;
      try {
        counts = home.journal()->count_by_status();
        all_ended = counts[run_status::completed] + counts[run_status::failed] + counts[run_status::cancelled] +
                        counts[run_status::in_doubt] ==
                    total_runs;
      } catch (const std::exception&) {
        ++polls_failed;  // the database is restarting
      }
      if (all_ended && signalled == shape.runs) break;
    }
    std::this_thread::sleep_for(50ms);
  }
  const double wall_s = seconds_since(t0);

  const std::int64_t fenced = fenced_writes(home);
  const bool clean_stop = workers.stop_all(30s);

  findings f;
  auto j = home.journal();
  for (int i = 0; i < shape.runs; ++i) check_run(*j, home, run_id(i), run_input, json{{"n", i}}, f);

  std::ostringstream summary;
  summary << "chaos on " << (cluster ? "PostgreSQL" : "SQLite") << ": " << shape.runs << " runs and their " << shape.runs
          << " children on " << shape.workers << " workers "
          << (all_ended ? "all ended" : "did NOT all end") << " in " << wall_s << " s (deadline "
          << shape.deadline.count() << " s); " << kills << " workers SIGKILLed and restarted, " << exits
          << " exited by themselves (" << workers.crashes() << " of them crashed); "
          << (database_down_s >= 0 ? "PostgreSQL crashed (SIGQUIT) at " + std::to_string(database_crashed_at_s) +
                                         " s and was back after " + std::to_string(database_down_s) + " s; "
                                   : "")
          << f.attempts << " attempts over " << f.runs << " runs, " << f.claims << " claims (epochs), "
          << f.steps << " steps journaled; " << f.step_reruns << " step bodies and " << f.tool_reruns
          << " tool calls ran again before their result was journaled (allowed); " << fenced
          << " writes fenced (stale epoch) as the workers last reported; " << signal_retries
          << " `cairn signal` retries, " << polls_failed << " journal polls failed; "
          << f.problems.size() << " problems.";
  for (const auto& note : workers.exit_notes()) summary << "\n" << note;
  WARN(summary.str());

  std::string shown;
  for (std::size_t k = 0; k < std::min<std::size_t>(f.problems.size(), 40); ++k) shown += f.problems[k] + "\n";
  INFO(shown);
  CHECK(all_ended);
  CHECK(workers.crashes() == 0);  // a worker may give up while the database is down, not crash
  CHECK(f.problems.empty());
  CHECK(f.runs == total_runs);
  CHECK(clean_stop);
}

}  // namespace

TEST_CASE("chaos on PostgreSQL: 3 workers, 300 runs, a worker SIGKILLed every 2-5 s, the database crashed once",
          "[postgresql]") {
  auto& cluster = testing::shared_pg_cluster();
  run_chaos({.workers = 3, .runs = 300, .deadline = 480s, .crash_database = true}, cluster.fresh_database(), &cluster);
}

TEST_CASE("chaos on SQLite: 3 workers on one file, 60 runs, a worker SIGKILLed every 2-5 s", "[sqlite]") {
  run_chaos({.workers = 3, .runs = 60, .deadline = 300s}, "", nullptr);
}

// The checks above are only worth their silence if they speak: one run,
// undisturbed, passes them; then a step body and the tool are made to look
// as if they ran once more after their results were journaled, and both are caught.
TEST_CASE("chaos checks: an acknowledged step or tool call that ran again is reported", "[sqlite]") {
  chaos_home home("");
  submit_runs(home, 1);
  worker_pool workers(home, 1);
  int retries = 0;
  REQUIRE(send_signal(home, 0, retries));
  const auto deadline = steady::now() + 60s;
  while (home.journal()->count_by_status()[run_status::completed] < 2 && steady::now() < deadline)
    std::this_thread::sleep_for(50ms);
  REQUIRE(workers.stop_all(30s));

  auto j = home.journal();
  findings clean;
  check_run(*j, home, run_id(0), run_input, json{{"n", 0}}, clean);
  INFO(clean.problems.size() << " problems, the first: " << (clean.problems.empty() ? "" : clean.problems[0]));
  REQUIRE(clean.problems.empty());
  REQUIRE(clean.runs == 2);

  const fs::path count_b = fs::path(j->find_run(run_id(0))->workspace) / "count-b";
  std::ofstream(count_b, std::ios::trunc) << 2 << "\n";
  std::ofstream(home.tool_dir() / (run_id(0) + "_1"), std::ios::trunc) << 2 << "\n";
  findings tampered;
  check_run(*j, home, run_id(0), run_input, json{{"n", 0}}, tampered);
  REQUIRE(tampered.problems.size() == 2);
  CHECK_THAT(tampered.problems[0], Catch::Contains("an acknowledged call ran again"));
  CHECK_THAT(tampered.problems[1], Catch::Contains("step b journaled execution 1 but ran 2 times"));

  // A file a journaled step wrote, gone from the workspace, is reported too.
  fs::remove(count_b.parent_path() / "count-c");
  findings lost;
  check_run(*j, home, run_id(0), run_input, json{{"n", 0}}, lost);
  REQUIRE(lost.problems.size() == 3);
  CHECK_THAT(lost.problems[2], Catch::Contains("step c was journaled, but the file count-c"));
}
