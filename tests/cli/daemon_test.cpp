// The `cairn serve` daemon driven from outside, as users and scripts drive
// it: submit, concurrency limit, many daemons on one journal and their leases, graceful SIGTERM;
// SIGKILL of the daemon while runs sleep, wait for signals, have children in
// flight and are being cancelled (from outside, and at exact engine points),
// then a new daemon; and bad input through the CLI. Everything is checked in
// the journal (read-only) and in each run's exec.log (one line per real
// execution of a step body, written by tests/agents/wait_agent).
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "storage/journal.hpp"
#include "tests/cairn_cli.hpp"
#include "tests/support/test_db.hpp"
#include "tests/temp_dir.hpp"

using namespace cairn;
using json = nlohmann::json;
using namespace std::chrono_literals;

namespace {

namespace fs = std::filesystem;
using steady = std::chrono::steady_clock;
using storage::run_status;

constexpr auto patience = 30s;  // for anything the daemon should do by itself; generous for 2 busy cores

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool ended(run_status s) {
  return s == run_status::completed || s == run_status::failed || s == run_status::cancelled ||
         s == run_status::in_doubt;
}

struct result {
  int code = -1;
  std::string out, err;
};

// A CAIRN_HOME of its own, and the `cairn` commands run against it.
class cairn_home {
 public:
  cairn_home() = default;
  // The journal on the backend tests/support/test_db.hpp picks (a fresh
  // PostgreSQL database under CAIRN_TEST_ON_POSTGRES=1), rather than
  // HOME/cairn.db.
  struct any_backend_t {};
  static constexpr any_backend_t any_backend{};
  explicit cairn_home(any_backend_t) : db_(testing::test_db(home())) {}
  // A test that fails midway kills its daemon (see daemon_process) and may
  // leave workspace images mounted in here: unmount them so the folder goes.
  ~cairn_home() {
    const auto inside = mounts();
    for (auto it = inside.rbegin(); it != inside.rend(); ++it) umount2(it->c_str(), MNT_DETACH);
  }
  // What is mounted in here, in mount order.
  std::vector<std::string> mounts() const {
    std::ifstream table("/proc/self/mounts");
    std::vector<std::string> inside;
    for (std::string device, point, rest; table >> device >> point && std::getline(table, rest);)
      if (point.rfind(dir_.path().string() + "/", 0) == 0) inside.push_back(point);
    return inside;
  }
  cairn_home(const cairn_home&) = delete;
  cairn_home& operator=(const cairn_home&) = delete;

  fs::path home() const { return dir_ / "home"; }
  fs::path db() const { return home() / "cairn.db"; }
  bool on_postgres() const { return storage::is_postgres_url(db_); }
  std::string journal_path() const { return db_.empty() ? db().string() : db_; }
  fs::path workspace(const std::string& run) const { return home() / "workspaces" / run; }
  fs::path file(const std::string& name) const { return dir_ / name; }
  // CAIRN_ALLOW for every cairn process (default sandbox-none; "" for none).
  void allow(const std::string& what) { allow_ = what; }

  // Starts `cairn ARGS...` with stdout and stderr in `out` and `err`, and
  // CAIRN_CRASH_POINT set to `crash_point` (unset when empty).
  // `own_home`: a CAIRN_HOME other than home() (a worker of its own on the same journal).
  pid_t spawn(std::vector<std::string> args, const fs::path& out, const fs::path& err,
              const std::string& crash_point = "", const fs::path& own_home = {}) const {
    args.insert(args.begin(), CAIRN_BIN);
    pid_t pid = fork();
    if (pid == 0) {
      if (chdir(dir_.path().c_str()) != 0) _exit(126);
      setenv("CAIRN_HOME", own_home.empty() ? home().c_str() : own_home.c_str(), 1);
      // Most cases run their agents without a sandbox: a shared journal's worker must be told it may.
      if (allow_.empty()) unsetenv("CAIRN_ALLOW");
      else setenv("CAIRN_ALLOW", allow_.c_str(), 1);
      if (!db_.empty()) setenv("CAIRN_DB", db_.c_str(), 1);
      if (crash_point.empty()) unsetenv("CAIRN_CRASH_POINT");
      else setenv("CAIRN_CRASH_POINT", crash_point.c_str(), 1);
      int o = open(out.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      int e = out == err ? o : open(err.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      dup2(o, 1);
      dup2(e, 2);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    REQUIRE(pid > 0);
    return pid;
  }

  // Runs `cairn ARGS...` to its end.
  result cli(const std::vector<std::string>& args) {
    const int n = calls_++;
    const auto out = file("cli-" + std::to_string(n) + ".out"), err = file("cli-" + std::to_string(n) + ".err");
    pid_t pid = spawn(args, out, err);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), slurp(out), slurp(err)};
  }

  // `cairn submit` of wait_agent with this plan; checks that it only prints the id.
  void submit(const std::string& id, const json& plan, std::vector<std::string> extra = {}) {
    std::vector<std::string> args{"submit", WAIT_AGENT, "--id", id, "--input", json{{"plan", plan}}.dump()};
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = cli(args);
    INFO(r.err);
    REQUIRE(r.code == 0);
    REQUIRE(r.out == id + "\n");
  }

  void signal(const std::string& run, const std::string& name, const json& payload) {
    auto r = cli({"signal", run, name, "--data", payload.dump()});
    INFO(r.out << r.err);
    REQUIRE(r.code == 0);
  }

  std::unique_ptr<storage::journal> journal(bool writable = false) const {
    return storage::open_journal(db_.empty() ? db().string() : db_,
                                 storage::journal_options{.read_only = !writable});
  }

  std::vector<std::string> exec_log(const std::string& run) const {
    std::ifstream in(workspace(run) / "exec.log");
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }

  // Lines of the run's exec.log equal to `line`, or starting with it when `prefix`.
  int executions(const std::string& run, const std::string& line, bool prefix = false) const {
    int n = 0;
    for (const auto& l : exec_log(run)) n += prefix ? l.rfind(line, 0) == 0 : l == line;
    return n;
  }

 private:
  testing::temp_dir dir_;
  std::string db_;  // "" for HOME/cairn.db
  std::string allow_ = "sandbox-none";
  int calls_ = 0;
};

// A `cairn serve` process. Killed (SIGKILL) if a test leaves it running.
class daemon_process {
 public:
  daemon_process(const cairn_home& home, const std::string& name, std::vector<std::string> args = {},
                 const std::string& crash_point = "", const fs::path& own_home = {})
      : log_(home.file(name + ".log")) {
    args.insert(args.begin(), "serve");
    pid_ = home.spawn(args, log_, log_, crash_point, own_home);
  }
  ~daemon_process() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  daemon_process(const daemon_process&) = delete;
  daemon_process& operator=(const daemon_process&) = delete;

  pid_t pid() const { return pid_; }
  // Its output, and whether it still runs (for failure messages).
  std::string log() {
    std::string state = "(still running)";
    if (pid_ > 0) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        exited_ = status;
      }
    }
    if (exited_)
      state = WIFEXITED(*exited_) ? "(exited " + std::to_string(WEXITSTATUS(*exited_)) + ")"
                                  : "(killed by signal " + std::to_string(WTERMSIG(*exited_)) + ")";
    return "cairn serve " + state + ":\n" + slurp(log_);
  }

  // The wait status once the process has exited, or nullopt after `limit`.
  std::optional<int> wait_for(std::chrono::milliseconds limit) {
    const auto deadline = steady::now() + limit;
    for (;;) {
      if (pid_ <= 0) return exited_;
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        exited_ = status;
        continue;
      }
      if (steady::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(10ms);
    }
  }

  void kill9() {
    const bool running = pid_ > 0 && ::kill(pid_, SIGKILL) == 0;
    auto status = wait_for(10s);
    INFO(log());
    REQUIRE(running);
    REQUIRE(status);
    REQUIRE(WIFSIGNALED(*status));
    REQUIRE(WTERMSIG(*status) == SIGKILL);
  }

  // SIGTERM; the daemon must exit 0 within the engine's drain time and then some.
  void stop() {
    // Its SIGTERM handler is in place once it has said where it serves; a
    // SIGTERM before that would find the default action.
    const auto deadline = steady::now() + 10s;
    while (pid_ > 0 && slurp(log_).find("cairn serve: journal") == std::string::npos && steady::now() < deadline)
      std::this_thread::sleep_for(10ms);
    const bool running = pid_ > 0 && ::kill(pid_, SIGTERM) == 0;
    auto status = wait_for(20s);
    INFO(log());
    REQUIRE(running);
    REQUIRE(status);
    REQUIRE(WIFEXITED(*status));
    REQUIRE(WEXITSTATUS(*status) == 0);
  }

 private:
  fs::path log_;
  pid_t pid_ = -1;
  std::optional<int> exited_;  // its wait status, once reaped
};

// Polls `ready` until it holds; fails the test after `limit`, showing `context`.
void eventually(const std::string& what, const std::function<bool()>& ready,
                const std::function<std::string()>& context = {}, std::chrono::seconds limit = patience) {
  const auto deadline = steady::now() + limit;
  while (!ready()) {
    if (steady::now() >= deadline) FAIL("gave up after " << limit.count() << " s waiting until " << what << "\n"
                                                         << (context ? context() : ""));
    std::this_thread::sleep_for(10ms);
  }
}

bool has_event(storage::journal& j, const std::string& run, const std::string& kind) {
  for (const auto& e : j.events(run))
    if (e.kind == kind) return true;
  return false;
}

bool every_run_ended(const cairn_home& h) {
  auto j = h.journal();
  for (const auto& r : j->list_runs())
    if (!ended(r.status)) return false;
  return true;
}

// What each run has journaled at one moment (e.g. right after a SIGKILL).
using snapshot = std::map<std::string, std::vector<storage::step_record>>;

snapshot take_snapshot(const cairn_home& h) {
  auto j = h.journal();
  snapshot s;
  for (const auto& r : j->list_runs()) s[r.id] = j->steps(r.id);
  return s;
}

std::string show_runs(const cairn_home& h) {
  std::string out;
  auto j = h.journal();
  for (const auto& r : j->list_runs())
    out += r.id + " " + std::string(storage::to_string(r.status)) + " steps " + std::to_string(j->steps(r.id).size()) +
           (r.error ? " error: " + r.error->message : "") + "\n";
  return out;
}

// Waits until every run of `ids` is suspended (waiting, its sandbox gone) by `worker`.
void wait_suspended(const cairn_home& h, const std::vector<std::string>& ids, daemon_process& worker) {
  eventually("every run is suspended", [&] {
    auto j = h.journal();
    for (const auto& id : ids)
      if (j->find_run(id)->status != run_status::waiting || !has_event(*j, id, "suspended")) return false;
    return true;
  }, [&] { return worker.log() + show_runs(h); });
}

// Checks a completed run of wait_agent against its plan, and its children
// recursively: one step per operation, of the right kind, at the right seq;
// every step journaled in `before` unchanged and executed exactly once (no
// acknowledged step ran again); every timer set once and fired once, no
// earlier than it was set for; every signal delivered once, into one step;
// every child created once, with the id PARENT.SEQ, and joined with its output.
void check_completed(const cairn_home& h, const std::string& id, const json& plan, const snapshot& before) {
  INFO("run " << id);
  auto j = h.journal();
  auto run = j->find_run(id);
  REQUIRE(run);
  INFO((run->error ? run->error->message : ""));
  REQUIRE(run->status == run_status::completed);
  const auto steps = j->steps(id);

  const auto was = before.find(id);
  if (was != before.end()) {
    REQUIRE(was->second.size() <= steps.size());
    for (std::size_t i = 0; i < was->second.size(); ++i) {
      INFO("seq " << i);
      CHECK(steps[i].result.output == was->second[i].result.output);
      CHECK(steps[i].result.name == was->second[i].result.name);
    }
  }
  auto journaled_before = [&](std::uint64_t seq) { return was != before.end() && seq < was->second.size(); };

  std::uint64_t seq = 0;
  std::vector<std::pair<std::uint64_t, json>> children;  // the child op's seq, its plan
  json expected_output = json::array();
  auto next = [&](protocol::step_kind kind) -> const storage::step_record& {
    INFO("seq " << seq);
    REQUIRE(seq < steps.size());
    const auto& s = steps[seq];
    REQUIRE(s.result.seq == seq);
    CHECK(s.result.kind == kind);
    CHECK(s.result.ok);
    return s;
  };
  int signal_steps = 0;
  for (const auto& op : plan) {
    const std::string kind = op["op"];
    INFO("op " << op.dump() << " at seq " << seq);
    if (kind == "step" || kind == "slow") {
      const auto& s = next(protocol::step_kind::step);
      const std::string name = op["name"];
      CHECK(s.result.output == name);
      const int n = kind == "step" ? h.executions(id, "step " + name) : h.executions(id, "slow " + name + " ", true);
      if (journaled_before(seq)) CHECK(n == 1);
      else CHECK(n >= 1);
      expected_output.push_back(name);
    } else if (kind == "sleep" || kind == "sleep_until") {
      const auto& s = next(protocol::step_kind::sleep);
      int timers = 0;
      for (const auto& e : j->events_at(id, seq)) {
        if (e.kind != "timer_set") continue;
        ++timers;
        CHECK(s.result.output["until_ms"] == e.data["until_ms"]);  // the deadline survives every crash
      }
      CHECK(timers == 1);
      CHECK(s.result.output["fired_at_ms"].get<std::int64_t>() >= s.result.output["until_ms"].get<std::int64_t>());
      expected_output.push_back("slept");
    } else if (kind == "signal") {
      const auto& s = next(protocol::step_kind::signal);
      ++signal_steps;
      CHECK(s.result.output["timed_out"] == false);
      int delivered_here = 0;
      for (const auto& sig : j->signals(id)) {
        if (sig.delivered_seq != seq) continue;
        ++delivered_here;
        CHECK(sig.name == op["name"]);
        CHECK(s.result.output["payload"] == sig.payload);
        int events = 0;
        for (const auto& e : j->events(id)) events += e.kind == "signal_delivered" && e.data["signal_id"] == sig.id;
        CHECK(events == 1);
      }
      CHECK(delivered_here == 1);
      expected_output.push_back({{"signal", s.result.output["payload"]}});
    } else if (kind == "child") {
      const auto& s = next(protocol::step_kind::child);
      CHECK(s.result.output["run_id"] == id + "." + std::to_string(seq));
      children.emplace_back(seq, op["input"]["plan"]);
      expected_output.push_back(id + "." + std::to_string(seq));
    } else if (kind == "join_all") {
      json joined = json::array();
      for (const auto& [child_seq, child_plan] : children) {
        const auto& s = next(protocol::step_kind::join);
        auto child = j->find_run(id + "." + std::to_string(child_seq));
        REQUIRE(child);
        CHECK(s.result.output == child->output);
        joined.push_back(child->output);
        ++seq;
      }
      expected_output.push_back(joined);
      continue;  // one seq per join, counted above
    } else {
      FAIL("the test plan has an op this check does not know: " << kind);
    }
    ++seq;
  }
  CHECK(steps.size() == seq);
  CHECK(run->output == expected_output);

  auto signals = j->signals(id);
  CHECK(signals.size() == static_cast<std::size_t>(signal_steps));
  for (const auto& sig : signals) CHECK(sig.delivered_seq.has_value());

  auto rows = j->children(id);
  CHECK(rows.size() == children.size());
  for (const auto& [child_seq, child_plan] : children) {
    auto child = j->find_run(id + "." + std::to_string(child_seq));
    REQUIRE(child);
    CHECK(child->parent_id == id);
    check_completed(h, child->id, child_plan, before);
  }
}

// prefix + i (appending: GCC 12 warns, wrongly, about "x" + std::to_string(i)).
std::string numbered(std::string prefix, int i) { return prefix += std::to_string(i); }

json step(const std::string& name) { return {{"op", "step"}, {"name", name}}; }
json nap(int ms) { return {{"op", "sleep"}, {"ms", ms}}; }
json wait_for_signal(const std::string& name) { return {{"op", "signal"}, {"name", name}}; }
// A step of `ms`; with first_only, only in the run's first attempt (quick when rerun after a crash).
json slow(const std::string& name, int ms, bool first_only = false) {
  return {{"op", "slow"}, {"name", name}, {"ms", ms}, {"first_only", first_only}};
}
// A plan: always a JSON array (json{x} of one element x would be x itself).
json plan_of(std::vector<json> ops) { return json(std::move(ops)); }
json child(std::vector<json> plan) {
  return {{"op", "child"}, {"agent", "wait_agent"}, {"input", {{"plan", plan_of(std::move(plan))}}}};
}
json join_all() { return {{"op", "join_all"}}; }

// Each execution of a run, from attempt_started to the event that ends it.
std::vector<std::pair<std::int64_t, std::int64_t>> executions_of(storage::journal& j, const std::string& run) {
  static const std::set<std::string> ends = {"run_completed", "run_failed", "run_cancelled", "run_waiting",
                                             "run_released", "run_in_doubt"};
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  std::optional<std::int64_t> open;
  for (const auto& e : j.events(run)) {
    if (e.kind == "attempt_started" && !open) open = e.at_ms;
    if (ends.count(e.kind) && open) {
      out.emplace_back(*open, e.at_ms);
      open.reset();
    }
  }
  REQUIRE_FALSE(open);
  return out;
}

// The execution of each of `ids`, each checked to have completed in one attempt.
std::vector<std::pair<std::int64_t, std::int64_t>> single_executions(const cairn_home& h,
                                                                     const std::vector<std::string>& ids) {
  std::vector<std::pair<std::int64_t, std::int64_t>> intervals;
  auto j = h.journal();
  for (const auto& id : ids) {
    INFO(id);
    auto run = j->find_run(id);
    CHECK(run->status == run_status::completed);
    CHECK(run->attempts == 1);
    auto e = executions_of(*j, id);
    intervals.insert(intervals.end(), e.begin(), e.end());
  }
  return intervals;
}

// The most intervals open at one instant; an interval ending at t does not
// overlap one starting at t (a worker ends one run before it takes the next).
int max_overlap(const std::vector<std::pair<std::int64_t, std::int64_t>>& intervals) {
  std::vector<std::pair<std::int64_t, int>> edges;
  for (const auto& [from, to] : intervals) {
    edges.emplace_back(from, +1);
    edges.emplace_back(to, -1);
  }
  std::sort(edges.begin(), edges.end());  // at equal times -1 sorts first
  int now = 0, most = 0;
  for (const auto& [t, d] : edges) most = std::max(most, now += d);
  return most;
}

}  // namespace

TEST_CASE("cairn submit prints only the run id and returns without executing anything") {
  cairn_home h;
  auto r = h.cli({"submit", WAIT_AGENT, "--id", "q1", "--input", json{{"plan", plan_of({step("a")})}}.dump()});
  REQUIRE(r.code == 0);
  CHECK(r.out == "q1\n");
  CHECK_THAT(r.err, Catch::Contains("no `cairn serve` holds"));  // a hint, on stderr only
  {
    auto j = h.journal();
    auto run = j->find_run("q1");
    REQUIRE(run);
    CHECK(run->status == run_status::pending);
    CHECK(run->attempts == 0);
    CHECK(run->owner.empty());
    CHECK(j->steps("q1").empty());
  }

  auto generated = h.cli({"submit", WAIT_AGENT, "--input", json{{"plan", plan_of({step("a")})}}.dump()});
  REQUIRE(generated.code == 0);
  CHECK(std::regex_match(generated.out, std::regex("run-[0-9a-f]{12}\n")));
  CHECK(h.journal()->find_run(generated.out.substr(0, generated.out.size() - 1)));

  auto again = h.cli({"submit", WAIT_AGENT, "--id", "q1", "--input", json{{"plan", plan_of({step("other")})}}.dump()});
  CHECK(again.code == 0);
  CHECK(again.out == "q1\n");
  CHECK_THAT(again.err, Catch::Contains("run q1 already exists (pending)"));
  CHECK(h.journal()->find_run("q1")->input == json{{"plan", plan_of({step("a")})}});
}

TEST_CASE("cairn logs --follow prints a run that serve executes as it goes, waits with it, exits with its end's code") {
  cairn_home h(cairn_home::any_backend);
  h.submit("f1", plan_of({{{"op", "print"}, {"text", "hello"}}, step("a"), slow("s", 200), wait_for_signal("go"),
                          step("b"), {{"op", "print"}, {"text", "bye"}}, step("c")}));
  h.submit("f2", plan_of({step("a"), {{"op", "fail"}, {"message", "boom"}}}));
  // Followed from before any worker takes them: the followers are woken, not told to give up.
  const auto out1 = h.file("follow1.out"), out2 = h.file("follow2.out"), err = h.file("follow.err");
  const pid_t follow1 = h.spawn({"logs", "f1", "--follow"}, out1, err);
  const pid_t follow2 = h.spawn({"logs", "f2", "--follow", "--json"}, out2, err);
  daemon_process daemon(h, "serve");
  const auto exit_code = [&](pid_t pid) {
    const auto deadline = steady::now() + patience;
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (steady::now() >= deadline) {
        ::kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        FAIL("cairn logs --follow did not end: " << slurp(out1) << slurp(out2) << slurp(err) << daemon.log());
      }
      std::this_thread::sleep_for(10ms);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  };
  eventually("the follower says what f1 waits for",
             [&] { return slurp(out1).find("waits for signal 'go'") != std::string::npos; },
             [&] { return slurp(out1) + slurp(err) + daemon.log(); });
  h.signal("f1", "go", json("now"));
  CHECK(exit_code(follow1) == 0);
  const auto text = slurp(out1);
  INFO(text << slurp(err));
  for (const auto* name : {"step   a ", "step   s ", "signal go ", "step   b ", "step   c "})
    CHECK_THAT(text, Catch::Contains(name));
  CHECK_THAT(text, Catch::Contains("  | hello\n"));
  CHECK_THAT(text, Catch::Contains("  | bye\n"));
  CHECK_THAT(text, Catch::Contains("run f1 completed"));

  CHECK(exit_code(follow2) == 1);
  std::istringstream lines(slurp(out2));
  json last;
  for (std::string line; std::getline(lines, line);) last = json::parse(line);
  CHECK(last["type"] == "end");
  CHECK(last["run"]["status"] == "failed");
}

TEST_CASE("cairn resume of a run whose awaited signal is queued says it goes on, not to send it") {
  cairn_home h;
  const json plan = plan_of({step("a"), {{"op", "signal"}, {"name", "go"}}, step("b")});
  h.submit("q", plan);
  {
    daemon_process serve(h, "serve", {"--suspend-after", "0"});
    eventually("q waits, suspended",
               [&] {
                 auto run = h.journal()->find_run("q");
                 return run->status == run_status::waiting && run->owner.empty();
               },
               [&] { return serve.log() + show_runs(h); });
    serve.stop();
  }
  h.signal("q", "go", json("now"));  // no worker: it stays queued
  auto resumed = h.cli({"resume", "q"});
  INFO(resumed.out << resumed.err);
  CHECK(resumed.code == 0);
  CHECK_THAT(resumed.out, Catch::Contains("run q waited for signal 'go' (step 1), which is queued: it goes on now"));
  CHECK_THAT(resumed.out, !Catch::Contains("send it"));
  CHECK(h.journal()->find_run("q")->status == run_status::completed);
  CHECK(h.exec_log("q") == std::vector<std::string>{"step a", "step b"});
}

TEST_CASE("serve --max-concurrent 2 runs every submitted run, never more than 2 at once") {
  cairn_home h;
  const json plan = plan_of({step("a"), slow("s", 300), step("b")});
  std::vector<std::string> ids;
  for (int i = 0; i < 4; ++i) {
    ids.push_back(numbered("c", i));
    h.submit(ids.back(), plan);
  }
  daemon_process serve(h, "serve", {"--max-concurrent", "2", "--suspend-after", "500"});
  auto context = [&] { return serve.log() + show_runs(h); };
  eventually("the daemon starts a run", [&] { return h.journal()->find_run("c0")->attempts > 0; }, context);

  // Runs submitted while it serves: no hint, since a daemon holds the journal.
  for (int i = 4; i < 6; ++i) {
    ids.push_back(numbered("c", i));
    auto r = h.cli({"submit", WAIT_AGENT, "--id", ids.back(), "--input", json{{"plan", plan}}.dump()});
    REQUIRE(r.code == 0);
    CHECK(r.out == ids.back() + "\n");
    CHECK(r.err.empty());
  }

  eventually("every run completed", [&] { return every_run_ended(h); }, context);
  const auto intervals = single_executions(h, ids);
  CHECK(intervals.size() == ids.size());
  CHECK(max_overlap(intervals) == 2);  // the limit holds, and is used
  for (const auto& id : ids) check_completed(h, id, plan, {});
  serve.stop();
}

TEST_CASE("serve --log-format json: every line is one JSON object a machine reads, an agent's bytes escaped") {
  cairn_home h;
  const json plan = plan_of({step("a\x1b[2J\xc2\x9b"), step("b")});  // a name that would clear a terminal
  h.submit("j1", plan);
  daemon_process serve(h, "serve-json", {"--log-format", "json", "--log-level", "debug"});
  eventually("the run completed", [&] { return every_run_ended(h); }, [&] { return serve.log() + show_runs(h); });
  serve.stop();
  const auto log = slurp(h.file("serve-json.log"));
  INFO(log);
  CHECK(log.find('\x1b') == std::string::npos);
  CHECK(log.find("\xc2\x9b") == std::string::npos);
  std::set<std::string> events;
  std::set<std::string> levels;
  std::istringstream lines(log);
  int records = 0;
  for (std::string line; std::getline(lines, line);) {
    INFO(line);
    const auto record = json::parse(line);  // nothing but records: no line of other text
    REQUIRE(record.is_object());
    CHECK(record["time"].get<std::string>().size() == std::string("2026-12-07T11:52:31.123Z").size());
    CHECK(record["time"].get<std::string>().back() == 'Z');
    CHECK(record.contains("message"));
    levels.insert(record["level"].get<std::string>());
    events.insert(record["event"].get<std::string>());
    if (record["event"] == "step") CHECK(record["run"] == "j1");
    ++records;
  }
  CHECK(records >= 6);
  for (const char* e : {"started", "attempt_started", "step", "run_completed", "stopping", "stopped"})
    CHECK(events.count(e) == 1);
  CHECK(levels.count("debug") == 1);  // the steps, at --log-level debug

  // At warn, a run that completes logs nothing.
  h.submit("j2", plan);
  daemon_process quiet(h, "serve-warn", {"--log-format", "json", "--log-level", "warn"});
  eventually("the run completed", [&] { return every_run_ended(h); }, [&] { return quiet.log() + show_runs(h); });
  quiet.stop();
  CHECK(slurp(h.file("serve-warn.log")).find("j2") == std::string::npos);
}

TEST_CASE("serve --config reads its options from a TOML file; SIGHUP (systemctl reload) reads the log's again") {
  cairn_home h;
  const auto config = h.file("cairn.toml");
  auto write_config = [&](const std::string& least) {
    std::ofstream(config) << "[serve]\nmax-concurrent = 3\nlog-format = \"json\"\nlog-level = \"" << least << "\"\n";
  };
  write_config("warn");
  daemon_process serve(h, "serve-config", {"--config", config.string()});
  const auto log = [&] { return slurp(h.file("serve-config.log")); };
  eventually("it started", [&] { return log().find("\"event\":\"started\"") != std::string::npos; },
             [&] { return serve.log(); });
  CHECK_THAT(log(), Catch::Contains("up to 3 runs at once"));  // from the file
  const json plan = plan_of({step("a")});
  h.submit("quiet", plan);
  eventually("quiet completed", [&] { return every_run_ended(h); }, [&] { return serve.log() + show_runs(h); });
  CHECK(log().find("\"run\":\"quiet\"") == std::string::npos);  // at warn, a completed run logs nothing

  write_config("info");
  ::kill(serve.pid(), SIGHUP);
  eventually("it read its config again", [&] { return log().find("\"event\":\"reloaded\"") != std::string::npos; },
             [&] { return serve.log(); });
  h.submit("heard", plan);
  eventually("heard completed", [&] { return every_run_ended(h); }, [&] { return serve.log() + show_runs(h); });
  eventually("its end is logged", [&] { return log().find("\"run\":\"heard\"") != std::string::npos; },
             [&] { return serve.log(); });
  serve.stop();  // SIGHUP did not stop it; SIGTERM still stops it gracefully, exit 0

  // A key no option has (a typo) is refused, naming it, rather than ignored.
  std::ofstream(h.file("typo.toml")) << "[serve]\nmax_concurrent = 3\n";
  auto typo = h.cli({"--config", h.file("typo.toml").string(), "serve"});
  CHECK(typo.code == 2);
  CHECK_THAT(typo.err, Catch::Contains("serve.max_concurrent"));
}

TEST_CASE("SIGTERM: the step in progress finishes, the run is handed back, exit 0; the next daemon completes it") {
  cairn_home h;
  const json busy_plan = plan_of({step("a"), slow("s", 1500), step("b")});
  const json waiter_plan = plan_of({wait_for_signal("go"), step("after")});
  h.submit("busy", busy_plan);
  h.submit("waiter", waiter_plan);
  snapshot before;
  {
    daemon_process serve(h, "serve-1", {"--max-concurrent", "2", "--suspend-after", "500"});
    auto context = [&] { return serve.log() + show_runs(h); };
    eventually("busy is inside its slow step and waiter waits",
               [&] {
                 auto j = h.journal();
                 return h.executions("busy", "slow s ", true) == 1 && has_event(*j, "waiter", "wait_started");
               },
               context);
    serve.stop();
    before = take_snapshot(h);
    auto j = h.journal();
    auto busy = j->find_run("busy");
    INFO(serve.log());
    CHECK(busy->status == run_status::pending);
    CHECK(busy->owner.empty());
    CHECK(has_event(*j, "busy", "run_released"));
    REQUIRE(j->steps("busy").size() == 2);  // the slow step finished and was journaled
    CHECK(j->steps("busy")[1].result.output == "s");
    auto waiter = j->find_run("waiter");
    CHECK(waiter->status == run_status::waiting);  // suspended, not handed back: its wait is journaled
    REQUIRE(waiter->wait);
    CHECK(waiter->wait->kind == "signal");
    CHECK(waiter->wait->key == "go");
  }
  daemon_process serve(h, "serve-2", {"--suspend-after", "500"});
  h.signal("waiter", "go", {{"ok", true}});
  eventually("both runs completed", [&] { return every_run_ended(h); }, [&] { return serve.log() + show_runs(h); });
  check_completed(h, "busy", busy_plan, before);
  check_completed(h, "waiter", waiter_plan, before);
  CHECK(h.executions("busy", "step b") == 1);
  serve.stop();
}

TEST_CASE("SIGKILL of the daemon while runs sleep, wait for signals, have children in flight and are being cancelled") {
  cairn_home h(cairn_home::any_backend);
  // nap sleeps below --suspend-after (held with its sandbox), doze above it (suspended at once).
  json nap_plan = json::array();
  for (int i = 0; i < 20; ++i) {
    nap_plan.push_back(step(numbered("n", i)));
    nap_plan.push_back(nap(450));
  }
  nap_plan.push_back(step("end"));
  // Every nap and slow step below is long enough for all the runs to reach their places on a loaded machine.
  const json doze_plan = plan_of({step("d0"), nap(10000), step("d1")});
  // Signalled: early before the kill, late after the restart, queued before it even waits.
  const json early_plan = plan_of({step("e0"), wait_for_signal("go"), step("e1")});
  const json late_plan = plan_of({step("l0"), wait_for_signal("go"), step("l1")});
  const json queued_plan = plan_of({step("q0"), nap(300), wait_for_signal("go"), step("q1")});
  const json fan_plan =
      plan_of({step("f0"), child({step("c0"), slow("s", 10000, true), step("c1")}),  // fan.1: running at the kill
               child({step("c0"), nap(1200), step("c1")}),                           // fan.2: sleeping
               child({step("c0"), wait_for_signal("go"), step("c1")}),               // fan.3: signalled later
               join_all(), step("f1")});
  const json doomed_plan = plan_of({step("x0"), child({wait_for_signal("never")}), child({wait_for_signal("never")}),
                                    slow("s", 20000), step("x1")});
  std::ofstream(h.file("grace.json")) << R"({"timeouts": {"cancel_grace_seconds": 3}})";

  h.submit("nap", nap_plan);
  h.submit("doze", doze_plan);
  h.submit("early", early_plan);
  h.submit("late", late_plan);
  h.submit("queued", queued_plan);
  h.signal("queued", "go", {{"who", "queued"}});
  h.submit("fan", fan_plan);
  h.submit("doomed", doomed_plan, {"--policy", h.file("grace.json").string()});

  // nap is inside a held sleep with at least 150 ms of it left.
  auto nap_mid_sleep = [&] {
    auto j = h.journal();
    auto run = j->find_run("nap");
    if (run->status != run_status::running) return false;
    const auto steps = j->steps("nap").size();
    for (const auto& e : j->events_at("nap", steps))
      if (e.kind == "timer_set") return e.data["until_ms"].get<std::int64_t>() - storage::now_ms() >= 150;
    return false;
  };

  snapshot before;
  std::int64_t doze_wakes_at = 0;
  int doomed_attempts = 0;
  {
    daemon_process serve(h, "serve-1", {"--max-concurrent", "16", "--suspend-after", "500"});
    auto context = [&] { return serve.log() + show_runs(h); };
    bool early_sent = false;
    eventually("every run is where the kill should find it",
               [&] {
                 auto j = h.journal();
                 if (!early_sent && has_event(*j, "early", "wait_started")) {
                   h.signal("early", "go", {{"who", "early"}});
                   early_sent = true;
                 }
                 auto doze = j->find_run("doze");
                 return early_sent && doze->status == run_status::waiting && has_event(*j, "late", "wait_started") &&
                        j->children("fan").size() == 3 && h.executions("fan.1", "slow s ", true) == 1 &&
                        j->find_run("fan.1")->status == run_status::running && j->find_run("fan.3") &&
                        has_event(*j, "fan.3", "wait_started") && h.executions("doomed", "slow s ", true) == 1 &&
                        j->children("doomed").size() == 2;
               },
               context);
    auto cancel = h.cli({"cancel", "doomed", "--no-wait"});
    INFO(cancel.out << cancel.err);
    REQUIRE(cancel.code == 0);
    CHECK_THAT(cancel.out, Catch::Contains("cancel requested"));
    eventually("the agent of doomed is told to stop, and nap sleeps with its sandbox",
               [&] {
                 auto j = h.journal();
                 return has_event(*j, "doomed", "cancel_sent") && nap_mid_sleep();
               },
               context, 2s);  // well within the 3 s grace
    serve.kill9();

    before = take_snapshot(h);
    auto j = h.journal();
    // What the kill interrupted.
    auto nap = j->find_run("nap");
    CHECK(nap->status == run_status::running);
    CHECK(j->steps("nap").size() % 2 == 1);  // stopped at a sleep
    auto doze = j->find_run("doze");
    REQUIRE(doze->status == run_status::waiting);
    REQUIRE(doze->wait);
    CHECK(doze->owner.empty());
    doze_wakes_at = *doze->wait->wake_at_ms;
    CHECK(doze_wakes_at > storage::now_ms());
    auto doomed = j->find_run("doomed");
    CHECK(doomed->status == run_status::running);
    CHECK(doomed->cancel_requested_at_ms);
    doomed_attempts = doomed->attempts;
    CHECK(j->find_run("fan.1")->status == run_status::running);
  }

  // doze's timer comes due while no daemon runs.
  eventually("doze's timer is due", [&] { return storage::now_ms() > doze_wakes_at; });
  daemon_process serve(h, "serve-2", {"--max-concurrent", "16", "--suspend-after", "500"});
  h.signal("late", "go", {{"who", "late"}});
  h.signal("fan.3", "go", {{"who", "fan.3"}});
  eventually("every run ended", [&] { return every_run_ended(h); }, [&] { return serve.log() + show_runs(h); });
  serve.stop();

  INFO(serve.log());
  check_completed(h, "nap", nap_plan, before);
  check_completed(h, "doze", doze_plan, before);
  CHECK(h.journal()->steps("doze")[1].finished_at_ms >= doze_wakes_at);
  check_completed(h, "early", early_plan, before);
  check_completed(h, "late", late_plan, before);
  check_completed(h, "queued", queued_plan, before);
  check_completed(h, "fan", fan_plan, before);

  // The cancel survives the kill: doomed is cancelled without another attempt, its children with it.
  auto j = h.journal();
  auto doomed = j->find_run("doomed");
  REQUIRE(doomed->status == run_status::cancelled);
  REQUIRE(doomed->error);
  CHECK(doomed->error->type == "cancelled");
  CHECK(doomed->attempts == doomed_attempts);
  CHECK(j->steps("doomed").size() == 3);
  CHECK(j->steps("doomed").size() == before["doomed"].size());
  CHECK(h.executions("doomed", "slow s ", true) == 1);
  CHECK(h.executions("doomed", "step x1") == 0);
  auto doomed_children = j->children("doomed");
  REQUIRE(doomed_children.size() == 2);
  for (const auto& c : doomed_children) {
    INFO(c.id);
    CHECK(c.status == run_status::cancelled);
    CHECK(j->steps(c.id).empty());
  }
}

TEST_CASE("SIGKILL of the daemon at exact engine points, then a new daemon finishes every run") {
  const json w1 = plan_of({step("a"), nap(100), wait_for_signal("go"), step("b")});
  const json w2 = plan_of({step("a"), child({step("c"), nap(350), step("d")}),
                           child({step("c"), nap(350), step("d")}), join_all(), step("e")});
  const json w3 = plan_of({step("a"), nap(400), step("b"), wait_for_signal("late"), step("c")});
  // Sleeps below and above --suspend-after 250. Daemon 1 can reach 19 commits, about 10 hellos and 4 run
  // ends (w3 waits for a signal sent after the restart).
  const std::vector<std::string> points = {
      "after_spawn:2",    "after_hello:4",  "after_hello:7", "before_commit:1", "before_commit:6",
      "before_commit:16", "after_commit:3", "after_commit:9", "after_commit:14", "after_ack:2",
      "after_ack:7",      "after_ack:12",   "child_created:1", "child_created:2", "before_finish:1",
      "before_finish:3",  "before_finish:4"};
  for (const auto& point : points) {
    DYNAMIC_SECTION("CAIRN_CRASH_POINT=" << point) {
      cairn_home h(cairn_home::any_backend);
      h.submit("w1", w1);
      h.signal("w1", "go", {{"to", "w1"}});
      h.submit("w2", w2);
      h.submit("w3", w3);
      snapshot before;
      {
        daemon_process serve(h, "serve-1", {"--suspend-after", "250"}, point);
        auto status = serve.wait_for(patience);
        INFO(serve.log() << show_runs(h));
        REQUIRE(status);
        REQUIRE(WIFSIGNALED(*status));
        REQUIRE(WTERMSIG(*status) == SIGKILL);
        before = take_snapshot(h);
      }
      daemon_process serve(h, "serve-2", {"--suspend-after", "250"});
      h.signal("w3", "late", {{"to", "w3"}});
      eventually("every run ended", [&] { return every_run_ended(h); }, [&] { return serve.log() + show_runs(h); });
      serve.stop();
      INFO(serve.log());
      check_completed(h, "w1", w1, before);
      check_completed(h, "w2", w2, before);
      check_completed(h, "w3", w3, before);
    }
  }
}

TEST_CASE("a run the journal calls completed has its files in its workspace, even if the daemon dies right then") {
  cairn_home h;
  const json plan = plan_of({step("a"), step("b"), step("c")});
  for (int i = 0; i < 4; ++i) h.submit(numbered("r", i), plan);
  std::set<std::string> completed;
  {
    daemon_process serve(h, "serve-1", {"--max-concurrent", "4"});
    eventually("a run completed",
               [&] {
                 auto j = h.journal();
                 for (const auto& r : j->list_runs())
                   if (r.status == run_status::completed) completed.insert(r.id);
                 return !completed.empty();
               },
               [&] { return serve.log() + show_runs(h); });
    serve.kill9();
  }
  for (const auto& id : completed) {
    INFO(id);
    CHECK(h.exec_log(id) == std::vector<std::string>{"step a", "step b", "step c"});
    CHECK_FALSE(fs::exists(h.home() / "images" / (id + ".img")));  // nothing left for a later release
  }
  daemon_process serve(h, "serve-2");
  eventually("every run ended", [&] { return every_run_ended(h); }, [&] { return serve.log() + show_runs(h); });
  serve.stop();
  for (int i = 0; i < 4; ++i) check_completed(h, numbered("r", i), plan, {});
  CHECK(h.mounts().empty());
}

TEST_CASE("serve --warm --prestart: runs take sandboxes whose agent runs already, each in its own workspace") {
  cairn_home h;
  daemon_process serve(h, "serve", {"--warm", "1", "--prestart"});
  const json plan = plan_of({step("a"), step("b")});
  // The first run of the agent tells the pool which agent to start; each
  // run after it is submitted once the one before has completed, when the
  // pool has had time to start the agent in its next sandbox.
  std::vector<std::string> ids;
  auto started_ahead = [&] {
    for (const auto& id : ids)
      if (serve.log().find("run " + id + ": warm sandbox from the pool, its agent started already") !=
          std::string::npos)
        return true;
    return false;
  };
  for (int i = 0; i < 10 && !started_ahead(); ++i) {
    ids.push_back(numbered("p", i));
    h.submit(ids.back(), plan);
    eventually(ids.back() + " completed",
               [&] { return h.journal()->find_run(ids.back())->status == run_status::completed; },
               [&] { return serve.log() + show_runs(h); });
  }
  INFO(serve.log());
  CHECK(started_ahead());
  CHECK_THAT(serve.log(), Catch::Contains("1 sandboxes kept warm (agents started in them)"));
  // Each wrote its steps into its own workspace, once.
  for (const auto& id : ids) {
    INFO(id);
    CHECK(h.exec_log(id) == std::vector<std::string>{"step a", "step b"});
  }
  serve.stop();
}

TEST_CASE("serve --prestart without --warm is refused") {
  cairn_home h;
  auto r = h.cli({"serve", "--prestart"});
  CHECK(r.code != 0);
  CHECK_THAT(r.err, Catch::Contains("--warm"));
}

namespace {

// Everything a command could change in the journal, run by run.
json fingerprint(const cairn_home& h) {
  auto j = h.journal();
  json out = json::array();
  for (const auto& r : j->list_runs())
    out.push_back({r.id, storage::to_string(r.status), r.attempts, r.updated_at_ms,
                   r.cancel_requested_at_ms.has_value(), j->steps(r.id).size(), j->events(r.id).size(),
                   j->signals(r.id).size()});
  return out;
}

}  // namespace

TEST_CASE("bad input through the CLI: a clear message, the right exit code, and nothing else changed") {
  cairn_home h;
  auto done = h.cli({"run", WAIT_AGENT, "--id", "done", "--input", json{{"plan", plan_of({step("a")})}}.dump()});
  INFO(done.out << done.err);
  REQUIRE(done.code == 0);
  const json unchanged = fingerprint(h);

  SECTION("a signal for an unknown run") {
    auto r = h.cli({"signal", "ghost", "go", "--data", "{}"});
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::Contains("no run 'ghost'"));
    CHECK(r.out.empty());
  }
  SECTION("a signal for a completed run is not queued") {
    auto r = h.cli({"signal", "done", "go", "--data", "{}"});
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::Contains("run done already finished (completed)"));
    CHECK(h.journal()->signals("done").empty());
  }
  SECTION("a signal whose payload is not JSON") {
    auto r = h.cli({"signal", "done", "go", "--data", "{nope"});
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::Contains("--data is not valid JSON"));
  }
  SECTION("a cancel of a completed run") {
    auto r = h.cli({"cancel", "done"});
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::Contains("run done already ended (completed); there is nothing to cancel"));
    auto run = h.journal()->find_run("done");
    CHECK(run->status == run_status::completed);
    CHECK_FALSE(run->cancel_requested_at_ms);
    CHECK_FALSE(has_event(*h.journal(), "done", "cancel_requested"));
  }
  SECTION("a cancel of an unknown run") {
    auto r = h.cli({"cancel", "ghost", "--no-wait"});
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::Contains("no run 'ghost'"));
  }
  CHECK(fingerprint(h) == unchanged);
}

TEST_CASE("a timer in the past fires at once, with a warning, and is journaled as such") {
  cairn_home h;
  const std::int64_t at = storage::now_ms() - 60'000;
  const json plan = plan_of({json{{"op", "sleep_until"}, {"at_ms", at}}, step("after")});
  for (const bool as_json : {false, true}) {
    const std::string id = as_json ? "past-json" : "past";
    std::vector<std::string> args{"run", WAIT_AGENT, "--id", id, "--input", json{{"plan", plan}}.dump()};
    if (as_json) args.push_back("--json");
    auto r = h.cli(args);
    INFO(r.out << r.err);
    REQUIRE(r.code == 0);
    CHECK_THAT(r.err, Catch::Contains("in the past"));
    if (as_json) CHECK(json::parse(r.out)["status"] == "completed");
    auto j = h.journal();
    auto set = j->events_at(id, 0);
    REQUIRE(set.size() == 1);
    CHECK(set[0].kind == "timer_set");
    CHECK(set[0].data["in_past"] == true);
    CHECK(set[0].data["until_ms"] == at);
    auto steps = j->steps(id);
    REQUIRE(steps.size() == 2);
    CHECK(steps[0].result.kind == protocol::step_kind::sleep);
    CHECK(steps[0].result.output["until_ms"] == at);
    CHECK(j->find_run(id)->status == run_status::completed);
  }
}

TEST_CASE("a child agent that does not exist: the parent's step records no_such_agent, no child run is made") {
  cairn_home h;
  const json plan = plan_of({json{{"op", "child"}, {"agent", "no_such_agent"}}, step("after")});
  auto r = h.cli({"run", WAIT_AGENT, "--id", "parent", "--input", json{{"plan", plan}, {"catch", true}}.dump()});
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  auto j = h.journal();
  auto steps = j->steps("parent");
  REQUIRE(steps.size() == 2);
  CHECK(steps[0].result.kind == protocol::step_kind::child);
  CHECK_FALSE(steps[0].result.ok);
  CHECK(steps[0].result.error.type == "no_such_agent");
  CHECK_THAT(steps[0].result.error.message, Catch::Contains("no_such_agent"));
  auto run = j->find_run("parent");
  CHECK(run->status == run_status::completed);
  CHECK(run->output[0].contains("child_error"));
  CHECK(run->output[1] == "after");
  CHECK(j->children("parent").empty());
  CHECK_FALSE(j->find_run("parent.0"));
  CHECK(j->list_runs().size() == 1);
}

// Wake-ups: under a daemon whose idle check (its only periodic look at the
// journal) is ten hours apart, a run moves only when something wakes the
// daemon: another process's submit, signal or cancel, or the journal's next
// due time. Without them (old main's daemon, or notify() disabled) none of
// these runs would move within the test's patience.
class idle_check_hours {
 public:
  idle_check_hours() { ::setenv("CAIRN_TEST_IDLE_CHECK_MS", "36000000", 1); }
  ~idle_check_hours() { ::unsetenv("CAIRN_TEST_IDLE_CHECK_MS"); }
  idle_check_hours(const idle_check_hours&) = delete;
  idle_check_hours& operator=(const idle_check_hours&) = delete;
};

run_status status_of(const cairn_home& h, const std::string& id) {
  auto run = h.journal()->find_run(id);
  return run ? run->status : run_status::pending;
}

TEST_CASE("wake-ups: a submit and a signal from other processes move a parked run with no periodic check") {
  cairn_home h;
  idle_check_hours idle;
  daemon_process serve(h, "serve", {"--suspend-after", "0"});
  auto context = [&] { return serve.log() + show_runs(h); };
  h.submit("parked", plan_of({json{{"op", "signal"}, {"name", "go"}}, step("after")}));
  eventually("the run is parked", [&] { return status_of(h, "parked") == run_status::waiting; }, context);
  h.signal("parked", "go", {{"n", 1}});
  eventually("the signalled run completed", [&] { return status_of(h, "parked") == run_status::completed; }, context);
  CHECK(h.journal()->find_run("parked")->output[0]["signal"]["n"] == 1);
  serve.stop();
}

TEST_CASE("wake-ups: a cancel from another process reaches a run that holds its sandbox in a short wait") {
  cairn_home h;
  idle_check_hours idle;
  // The wait is held (not suspended) for a minute: longer than the patience below.
  daemon_process serve(h, "serve", {"--suspend-after", "60000"});
  auto context = [&] { return serve.log() + show_runs(h); };
  h.submit("held", plan_of({json{{"op", "signal"}, {"name", "never"}}}));
  eventually("the run holds its wait", [&] {
    auto j = h.journal();
    auto run = j->find_run("held");
    return run && run->status == run_status::running && has_event(*j, "held", "wait_started");
  }, context);
  const auto asked = steady::now();
  auto r = h.cli({"cancel", "held", "--reason", "enough"});
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("cancel requested"));
  // `cairn cancel` waits (on the run's wake-ups) until the run has ended.
  CHECK(status_of(h, "held") == run_status::cancelled);
  CHECK_THAT(r.out, Catch::Contains("run held cancelled"));
  CHECK(steady::now() - asked < 30s);
  CHECK(h.journal()->find_run("held")->error->message == "enough");
  serve.stop();
}

TEST_CASE("wake-ups: a suspended 2 s timer wakes its run when it is due, not at a periodic check") {
  cairn_home h;
  idle_check_hours idle;
  daemon_process serve(h, "serve", {"--suspend-after", "0"});
  auto context = [&] { return serve.log() + show_runs(h); };
  h.submit("timer", plan_of({json{{"op", "sleep"}, {"ms", 2000}}, step("after")}));
  eventually("the timer run completed", [&] { return status_of(h, "timer") == run_status::completed; }, context);
  auto j = h.journal();
  CHECK(has_event(*j, "timer", "run_waiting"));  // it was suspended, so the daemon woke it
  auto fired = j->steps("timer").at(0).result.output;
  INFO(fired.dump());
  // Late by a sandbox start at most, on a busy machine.
  CHECK(fired["fired_at_ms"].get<std::int64_t>() - fired["until_ms"].get<std::int64_t>() < 10'000);
  serve.stop();
}

TEST_CASE("wake-ups: forged, oversized and flooding datagrams to the wake socket are ignored; serve keeps working") {
  cairn_home h;
  idle_check_hours idle;
  daemon_process serve(h, "serve", {"--suspend-after", "0"});
  auto context = [&] { return serve.log() + show_runs(h); };
  const fs::path folder = h.db().string() + ".wake";
  std::vector<fs::path> sockets;
  eventually("serve listens", [&] {
    std::error_code ec;
    sockets.clear();
    for (const auto& e : fs::directory_iterator(folder, ec)) sockets.push_back(e.path());
    return !sockets.empty();
  }, context);
  struct stat st {};
  REQUIRE(::lstat(folder.c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0700);
  REQUIRE(sockets.size() == 1);
  REQUIRE(sockets[0].string().size() < sizeof(sockaddr_un::sun_path));
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strcpy(address.sun_path, sockets[0].c_str());
  int out = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK, 0);
  REQUIRE(out >= 0);
  auto send = [&](const std::string& datagram) {
    return ::sendto(out, datagram.data(), datagram.size(), 0, reinterpret_cast<const sockaddr*>(&address),
                    sizeof address);
  };
  CHECK(send(std::string(60'000, 'x')) > 0);
  CHECK(send("signalled " + std::string(4000, 'a')) > 0);
  CHECK(send(std::string("ended \0\xff\n", 9)) > 0);
  CHECK(send("nonsense no-such-run") > 0);
  CHECK(send("ended ../../etc/passwd") > 0);
  CHECK(send("") >= 0);
  int sent = 0;
  for (int i = 0; i < 100'000 && send("signalled no-such-run") > 0; ++i) ++sent;  // until its queue is full
  ::close(out);
  INFO(sent << " datagrams queued");
  // Still up, and still woken by a real submit.
  h.submit("after", plan_of({step("a")}));
  eventually("a run submitted after the forgeries completed",
             [&] { return status_of(h, "after") == run_status::completed; }, context);
  CHECK_THAT(serve.log(), !Catch::Contains("not executed"));
  serve.stop();
}

// `cairn submit --from FILE.jsonl`: a batch of runs queued in one
// transaction, all or none, by one command.
namespace {

// A run of wait_agent that journals one step, as a batch line with an id.
std::string batch_line(const std::string& id) {
  return json{{"input", {{"plan", plan_of({step("a")})}}}, {"id", id}}.dump();
}

fs::path write_lines(const fs::path& file, const std::vector<std::string>& lines) {
  std::ofstream out(file, std::ios::trunc);
  for (const auto& line : lines) out << line << '\n';
  return file;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

std::size_t runs_in(const cairn_home& h) { return fs::exists(h.db()) ? h.journal()->list_runs().size() : 0; }

// A `cairn submit --from` under a crash point: its exit status (the
// process kills itself there), and no more.
int submit_crashing_at(const cairn_home& h, const fs::path& file, const std::string& crash_point) {
  pid_t pid = h.spawn({"submit", "--from", file.string(), WAIT_AGENT, "--sandbox", "none"}, h.file("crash.out"),
                      h.file("crash.err"), crash_point);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

}  // namespace

TEST_CASE("submit --from: 1,000 lines queue 1,000 pending runs in one command; serve, woken by a batch, completes them") {
  cairn_home h;
  idle_check_hours idle;  // only the journal's first look and the batches' wake-ups move runs
  std::vector<std::string> ids, lines;
  for (int i = 0; i < 1000; ++i) {
    ids.push_back(numbered("b", i));
    lines.push_back(batch_line(ids.back()));
  }
  const auto file = write_lines(h.file("runs.jsonl"), lines);
  const auto started = steady::now();
  auto r = h.cli({"submit", "--from", file.string(), WAIT_AGENT, "--sandbox", "none"});
  const auto took = std::chrono::duration<double>(steady::now() - started).count();
  WARN("cairn submit --from with 1,000 lines took " << took << " s (process start included)");
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(lines_of(r.out) == ids);  // one id per line, in the file's order
  CHECK_THAT(r.err, Catch::Contains("no `cairn serve` holds"));
  {
    auto j = h.journal();
    auto counts = j->count_by_status();
    CHECK(counts[run_status::pending] == 1000);
    CHECK(j->list_runs().size() == 1000);
    auto b7 = j->find_run("b7");
    REQUIRE(b7);
    CHECK(b7->attempts == 0);
    CHECK(b7->sandbox == "none");
    CHECK(b7->input == json{{"plan", plan_of({step("a")})}});
  }

  daemon_process serve(h, "serve", {"--max-concurrent", "16"});
  auto context = [&] { return serve.log().substr(0, 4000) + "\n" + std::to_string(runs_in(h)) + " runs"; };
  eventually("all 1,000 runs completed", [&] { return h.journal()->count_by_status()[run_status::completed] == 1000; },
             context, 300s);

  // A batch submitted while it serves wakes it: no periodic check would come in hours.
  std::vector<std::string> late;
  for (int i = 0; i < 20; ++i) late.push_back(batch_line(numbered("late", i)));
  auto more = h.cli({"submit", "--from", write_lines(h.file("late.jsonl"), late).string(), WAIT_AGENT, "--sandbox",
                     "none"});
  INFO(more.err);
  REQUIRE(more.code == 0);
  CHECK(more.err.empty());  // a daemon holds the journal: no hint
  eventually("the 20 runs of the later batch completed",
             [&] { return h.journal()->count_by_status()[run_status::completed] == 1020; }, context, 120s);
  CHECK(h.executions("b999", "step a") == 1);
  CHECK(h.executions("late19", "step a") == 1);
  serve.stop();
}

TEST_CASE("retention removes ended runs in the background while 16 runs step, and every run completes") {
  cairn_home h;
  const auto config = h.file("cairn.toml");
  std::ofstream(config) << "[serve]\nmax-concurrent = 16\n";
  daemon_process serve(h, "serve", {"--config", config.string()});
  auto context = [&] { return serve.log().substr(0, 6000) + "\n" + show_runs(h); };
  // 100 runs end before retention is on.
  std::vector<std::string> old_runs, lines;
  for (int i = 0; i < 100; ++i) {
    old_runs.push_back(numbered("old", i));
    lines.push_back(batch_line(old_runs.back()));
  }
  auto r = h.cli({"submit", "--from", write_lines(h.file("old.jsonl"), lines).string(), WAIT_AGENT, "--sandbox", "none"});
  REQUIRE(r.code == 0);
  eventually("the 100 runs completed", [&] { return h.journal()->count_by_status()[run_status::completed] == 100; },
             context, 120s);

  // 16 runs of 30 steps each start, and retention comes on (SIGHUP) while they step: it keeps the 16 newest
  // completed runs, which are theirs once they end.
  std::vector<json> plan;
  for (int s = 0; s < 30; ++s) plan.push_back(step(numbered("s", s)));
  std::vector<std::string> stepping;
  lines.clear();
  for (int i = 0; i < 16; ++i) {
    stepping.push_back(numbered("live", i));
    lines.push_back(json{{"input", {{"plan", plan}}}, {"id", stepping.back()}}.dump());
  }
  r = h.cli({"submit", "--from", write_lines(h.file("live.jsonl"), lines).string(), WAIT_AGENT, "--sandbox", "none"});
  REQUIRE(r.code == 0);
  std::ofstream(config) << "[serve]\nmax-concurrent = 16\n[serve.retention]\nstatus = [\"completed\"]\n"
                           "keep-last = 16\nevery = \"1s\"\n";
  ::kill(serve.pid(), SIGHUP);
  // A pass removes a run's files once its deletion is synced (engine/retention.cpp): just after its row.
  eventually("the 16 runs completed and every older run was removed, its files too",
             [&] {
               auto j = h.journal();
               return j->count_by_status()[run_status::completed] == 16 && j->list_runs().size() == 16 &&
                      std::none_of(old_runs.begin(), old_runs.end(),
                                   [&](const std::string& id) { return fs::exists(h.workspace(id)); });
             },
             context, 120s);
  auto j = h.journal();
  for (const auto& id : stepping) {
    auto run = j->find_run(id);
    REQUIRE(run);
    CHECK(run->status == run_status::completed);
    CHECK(j->steps(id).size() == 30);
    CHECK(h.executions(id, "step s29") == 1);  // each step ran once: nothing was lost or replayed from scratch
  }
  const auto log = slurp(h.file("serve.log"));
  for (const auto& id : old_runs) {
    CHECK_FALSE(j->find_run(id));
    CHECK(log.find("run " + id + " completed") != std::string::npos);  // each had completed before it went
    CHECK_FALSE(fs::exists(h.workspace(id)));
  }
  CHECK_THAT(log, Catch::Contains("retention: removed"));
  CHECK_THAT(log, Catch::Contains("retention every 1s"));
  serve.stop();
}

TEST_CASE("submit --from: a bad line 3 of 5 queues nothing and names line 3") {
  cairn_home h;
  h.submit("before", plan_of({step("a")}));
  std::vector<std::string> lines;
  for (int i = 1; i <= 5; ++i) lines.push_back(batch_line(numbered("r", i)));
  std::string expected;
  SECTION("not JSON") {
    lines[2] = R"({"input": {"plan": [}, "id": "r3"})";
    expected = "the line is not valid JSON";
  }
  SECTION("nested deeper than an input may be") {
    lines[2] = std::string(200, '[') + std::string(200, ']');
    expected = "the input nests deeper than";
  }
  SECTION("an id that is not a run id") {
    lines[2] = json{{"input", 1}, {"id", "../../etc"}}.dump();
    expected = "is not a valid run id";
  }
  SECTION("an id that is not a string") {
    lines[2] = json{{"input", 1}, {"id", 3}}.dump();
    expected = "\"id\" is not a string";
  }
  SECTION("a key beside \"input\" other than \"id\"") {
    lines[2] = json{{"input", 1}, {"ID", "r3"}}.dump();
    expected = "the key \"ID\" beside \"input\"";
  }
  SECTION("a line longer than an input may be (16 MiB)") {
    lines[2] = "\"" + std::string((16u << 20) + 1, 'x') + "\"";
    expected = "the line is longer than 16777216 bytes";
  }
  const auto file = write_lines(h.file("runs.jsonl"), lines);
  auto r = h.cli({"submit", "--from", file.string(), WAIT_AGENT});
  CHECK(r.code == 2);
  CHECK(r.out.empty());
  CHECK_THAT(r.err, Catch::Contains("runs.jsonl line 3: ") && Catch::Contains(expected) &&
                        Catch::Contains("nothing was queued"));
  CHECK(r.err.size() < 1000);
  CHECK(runs_in(h) == 1);
}

TEST_CASE("submit --from: an id repeated within the file is refused, naming both lines; nothing is queued") {
  cairn_home h;
  const auto file = write_lines(h.file("runs.jsonl"),
                                {batch_line("one"), batch_line("two"), "", batch_line("three"), batch_line("two")});
  auto r = h.cli({"submit", "--from", file.string(), WAIT_AGENT});
  CHECK(r.code == 2);
  CHECK(r.out.empty());
  CHECK_THAT(r.err, Catch::Contains("runs.jsonl line 5: run id two is given on line 2 already"));
  CHECK(runs_in(h) == 0);
}

TEST_CASE("submit --from: the same file submitted twice creates nothing new the second time") {
  cairn_home h;
  const json plain = {{"plan", plan_of({step("plain")})}};
  const auto file = write_lines(h.file("runs.jsonl"), {batch_line("x1"), batch_line("x2"), batch_line("x3")});
  auto first = h.cli({"submit", "--from", file.string(), WAIT_AGENT});
  INFO(first.err);
  REQUIRE(first.code == 0);
  CHECK(first.out == "x1\nx2\nx3\n");
  CHECK(h.cli({"signal", "x2", "go"}).code == 0);  // something about x2 that a new run would not have

  auto second = h.cli({"submit", "--from", file.string(), WAIT_AGENT, "--max-attempts", "7", "--json"});
  INFO(second.err);
  REQUIRE(second.code == 0);
  const auto listed = json::parse(second.out);
  REQUIRE(listed.is_array());
  REQUIRE(listed.size() == 3);
  for (const auto& run : listed) {
    CHECK(run["created"] == false);
    CHECK(run["max_attempts"] == 3);  // the run as first submitted
  }
  CHECK(listed[1]["id"] == "x2");
  CHECK_THAT(second.err, Catch::Contains("3 of the 3 runs existed already") && Catch::Contains("x1, x2, x3"));
  auto j = h.journal();
  CHECK(j->list_runs().size() == 3);
  CHECK(j->signals("x2").size() == 1);
}

TEST_CASE("submit --from -: stdin is read; an endless stream or a line with no end is refused at its bound") {
  cairn_home h;
  // `cairn submit --from - ...` reading what `feed` (a shell command) writes, with CAIRN_HOME set.
  const auto fed = [&](const std::string& feed) {
    const std::string script = feed + " | \"$0\" submit --from - \"$1\" --sandbox none";
    return testing::run_program("/bin/sh", {"-c", script, CAIRN_BIN, WAIT_AGENT}, h.file(""),
                                {.env = {{"CAIRN_HOME", h.home().string()}}});
  };
  auto two = fed("printf '%s\\n\\n%s\\n' '{\"plan\": []}' '{\"input\": {\"plan\": []}, \"id\": \"s2\"}'");
  INFO(two.err);
  REQUIRE(two.code == 0);
  const auto ids = lines_of(two.out);
  REQUIRE(ids.size() == 2);
  CHECK(ids[1] == "s2");
  CHECK(h.journal()->find_run(ids[0])->input == json{{"plan", json::array()}});
  CHECK(runs_in(h) == 2);

  const auto started = steady::now();
  auto endless = fed("yes '{}'");
  CHECK(endless.code == 2);
  CHECK_THAT(endless.err, Catch::Contains("stdin holds more than 10000 runs") && Catch::Contains("nothing was queued"));
  auto unending = testing::run_program(CAIRN_BIN, {"submit", "--from", "/dev/zero", WAIT_AGENT}, h.file(""),
                                       {.env = {{"CAIRN_HOME", h.home().string()}}});
  CHECK(unending.code == 2);
  CHECK_THAT(unending.err, Catch::Contains("/dev/zero line 1: the line is longer than 16777216 bytes"));
  CHECK(steady::now() - started < 60s);  // each stops at its bound (about 0.3 s here), never at the end of its input
  CHECK(runs_in(h) == 2);
}

TEST_CASE("submit --from commits every run of the file at once: killed at its first commit, all are there; before it, none") {
  cairn_home h;
  std::vector<std::string> lines;
  for (int i = 0; i < 1000; ++i) lines.push_back(batch_line(numbered("c", i)));
  const auto file = write_lines(h.file("runs.jsonl"), lines);
  int status = submit_crashing_at(h, file, "before_group_commit:1");
  REQUIRE(WIFSIGNALED(status));
  CHECK(runs_in(h) == 0);
  status = submit_crashing_at(h, file, "after_group_commit.one:1");
  REQUIRE(WIFSIGNALED(status));
  CHECK(runs_in(h) == 1000);  // one commit per run would have left 1
}

namespace {

// The processes descended from `pid` (its agents, their sandboxes), from /proc.
std::set<pid_t> descendants(pid_t pid) {
  std::map<pid_t, pid_t> parent;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string stat = slurp(entry.path() / "stat");
    auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(stat.substr(close + 2));
    std::string state;
    pid_t ppid = 0;
    if (fields >> state >> ppid && state != "Z") parent[std::stoi(name)] = ppid;
  }
  std::set<pid_t> out;
  for (bool grew = true; grew;) {
    grew = false;
    for (const auto& [child, up] : parent)
      if ((up == pid || out.count(up)) && out.insert(child).second) grew = true;
  }
  return out;
}

bool alive(pid_t pid) {
  std::string stat = slurp("/proc/" + std::to_string(pid) + "/stat");
  auto close = stat.rfind(')');
  return close != std::string::npos && stat.size() > close + 2 && stat[close + 2] != 'Z';
}

std::string this_host() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return name;
}

// The worker row of the `cairn serve` with this pid, if it registered.
std::optional<storage::worker_record> worker_of(const cairn_home& h, pid_t pid) {
  std::vector<storage::worker_record> workers;
  try {
    workers = h.journal()->workers();
  } catch (const storage::storage_error& e) {
    if (e.code() != storage::errc::not_found) throw;  // no journal yet: nobody registered
  }
  for (auto& w : workers)
    if (w.id.find(":" + std::to_string(pid) + ":") != std::string::npos) return w;
  return std::nullopt;
}

}  // namespace

TEST_CASE("two serves on one journal share the runs, and each run is executed once") {
  cairn_home h(cairn_home::any_backend);
  const auto p = testing::test_prefix();
  const json plan = plan_of({step("a"), slow("s", 1000), step("b")});
  std::vector<std::string> ids;
  for (int i = 0; i < 8; ++i) {
    ids.push_back(numbered(p + "c", i));
    h.submit(ids.back(), plan, {"--sandbox", "none"});
  }
  daemon_process a(h, "a", {"--max-concurrent", "2", "--lease", "3"});
  daemon_process b(h, "b", {"--max-concurrent", "2", "--lease", "3"});
  auto context = [&] { return a.log() + b.log() + show_runs(h); };
  eventually("every run ended", [&] { return every_run_ended(h); }, context, 90s);
  const auto intervals = single_executions(h, ids);
  CHECK(intervals.size() == ids.size());
  for (const auto& id : ids) check_completed(h, id, plan, {});
  INFO(context());
  // Each took runs (one alone would run at most 2 at once), and together never more than both limits.
  CHECK(a.log().find("attempt 1") != std::string::npos);
  CHECK(b.log().find("attempt 1") != std::string::npos);
  CHECK(max_overlap(intervals) <= 4);
  a.stop();
  b.stop();
  CHECK(h.journal()->workers().empty());  // each removed itself
}

TEST_CASE("cairn workers lists the live workers and one whose lease expired") {
  cairn_home h(cairn_home::any_backend);
  daemon_process a(h, "a");
  daemon_process b(h, "b");
  daemon_process gone(h, "gone", {"--lease", "1"});
  auto context = [&] { return a.log() + b.log() + gone.log(); };
  eventually("three workers registered",
             [&] { return worker_of(h, a.pid()) && worker_of(h, b.pid()) && worker_of(h, gone.pid()); }, context);
  const pid_t gone_pid = gone.pid();
  gone.kill9();
  eventually("the killed worker's lease expired",
             [&] { return worker_of(h, gone_pid)->lease_expires_at_ms < storage::now_ms(); }, context);

  auto table = h.cli({"workers"});
  INFO(table.out << table.err);
  REQUIRE(table.code == 0);
  CHECK_THAT(table.out, Catch::Contains("pid " + std::to_string(a.pid()) + " on "));
  CHECK_THAT(table.out, Catch::Contains("pid " + std::to_string(b.pid()) + " on "));
  CHECK_THAT(table.out, Catch::Contains("pid " + std::to_string(gone_pid) + " on "));
  CHECK_THAT(table.out, Catch::Contains("expired"));

  auto listed = h.cli({"workers", "--json"});
  REQUIRE(listed.code == 0);
  const auto workers = json::parse(listed.out);
  REQUIRE(workers.size() == 3);
  int expired = 0;
  for (const auto& w : workers) {
    CHECK(w["host"] == this_host());
    CHECK(w["runs"] == 0);
    CHECK(w["fenced_writes"] == 0);
    const bool is_gone = w["id"].get<std::string>().find(":" + std::to_string(gone_pid) + ":") != std::string::npos;
    CHECK(w["lease_expired"] == is_gone);
    expired += w["lease_expired"].get<bool>();
  }
  CHECK(expired == 1);

  // One killed long ago, holding nothing: counted, not listed, unless --all.
  storage::worker_record long_gone;
  long_gone.id = "longgone:4242:1";
  long_gone.host = this_host();
  long_gone.started_at_ms = storage::now_ms() - 3'600'000;
  long_gone.renewed_at_ms = storage::now_ms();
  long_gone.lease_expires_at_ms = storage::now_ms() + 60'000;
  {
    // Registered alive (a registration forgets the long dead, itself too), then its lease set long past.
    auto writable = h.journal(/*writable=*/true);
    writable->register_worker(long_gone);
    REQUIRE(writable->renew_lease(long_gone.id, storage::now_ms() - storage::journal::forgotten_worker_ms - 60'000, 0));
  }
  auto short_list = h.cli({"workers"});
  INFO(short_list.out << short_list.err);
  CHECK_THAT(short_list.out, Catch::Contains("pid " + std::to_string(gone_pid) + " on "));
  CHECK_THAT(short_list.out, !Catch::Contains("4242") &&
                                 Catch::Contains("1 dead worker not shown: its lease expired over 5 minutes ago"));
  CHECK(json::parse(h.cli({"workers", "--json"}).out).size() == 3);
  auto everyone = h.cli({"workers", "--all", "--json"});
  REQUIRE(everyone.code == 0);
  CHECK(json::parse(everyone.out).size() == 4);
  a.stop();
  b.stop();
}

TEST_CASE("a worker paused past its lease loses its run to another; resumed, its writes are refused and it gives the run up") {
  cairn_home h(cairn_home::any_backend);
  const auto p = testing::test_prefix();
  const std::string id = p + "held";
  const json plan = plan_of({step("a"), slow("s", 4000), step("b")});
  h.submit(id, plan, {"--sandbox", "none"});
  daemon_process a(h, "a", {"--lease", "2"});
  auto context = [&] { return a.log() + show_runs(h); };
  eventually("worker a executes the slow step", [&] { return h.executions(id, "slow s ", true) == 1; }, context);
  const std::string a_owner = h.journal()->find_run(id)->owner;
  REQUIRE(worker_of(h, a.pid()));
  CHECK(worker_of(h, a.pid())->id == a_owner);
  const auto agents = descendants(a.pid());
  REQUIRE_FALSE(agents.empty());
  // `cairn ls` says who holds it.
  auto listed = h.cli({"ls"});
  CHECK_THAT(listed.out, Catch::Contains("pid " + std::to_string(a.pid()) + " on " + this_host()));
  listed = h.cli({"ls", "--json"});
  for (const auto& r : json::parse(listed.out))
    if (r["id"] == id) {
      CHECK(r["owner"] == a_owner);
      // On PostgreSQL worker a made the workspace on its own disk (no --workspace-root): it names the machine.
      CHECK(r["workspace_host"] == (h.on_postgres() ? this_host() : ""));
    }

  daemon_process b(h, "b", {"--lease", "2"});
  REQUIRE(::kill(a.pid(), SIGSTOP) == 0);
  const auto before = take_snapshot(h);
  auto both = [&] { return a.log() + b.log() + show_runs(h); };
  eventually("worker b takes the run over once a's lease expired", [&] {
    auto run = h.journal()->find_run(id);
    return run->owner != a_owner && run->epoch >= 2;
  }, both);
  CHECK(worker_of(h, a.pid())->lease_expires_at_ms < storage::now_ms());

  REQUIRE(::kill(a.pid(), SIGCONT) == 0);
  eventually("worker a reports its refused writes", [&] {
    auto w = worker_of(h, a.pid());
    return w && w->fenced_writes > 0 && w->lease_expires_at_ms > storage::now_ms();
  }, both);
  eventually("worker a's agent is gone", [&] {
    for (pid_t agent : agents)
      if (alive(agent)) return false;
    return true;
  }, both);
  eventually("the run completed", [&] { return h.journal()->find_run(id)->status == run_status::completed; }, both);
  INFO(both());
  CHECK_THAT(a.log(), Catch::Contains("run " + id + ": not executed: run " + id + " was taken over"));
  check_completed(h, id, plan, before);  // every step once, none rewritten, step a never executed again
  int completions = 0;
  for (const auto& e : h.journal()->events(id)) completions += e.kind == "run_completed";
  CHECK(completions == 1);
  a.stop();
  b.stop();
}

TEST_CASE("a run's workspace is chosen at submit on SQLite, and on PostgreSQL by the worker that first executes it") {
  cairn_home h(cairn_home::any_backend);
  const auto p = testing::test_prefix();
  const std::string id = p + "ws";
  const bool shared_journal = h.on_postgres();
  const auto root = h.file("shared");
  fs::create_directories(root);
  h.submit(id, plan_of({step("a")}), {"--sandbox", "none"});
  CHECK(h.journal()->find_run(id)->workspace == (shared_journal ? "" : h.workspace(id).string()));
  daemon_process serve(h, "serve", {"--workspace-root", root.string()});
  eventually("the run completed", [&] { return h.journal()->find_run(id)->status == run_status::completed; },
             [&] { return serve.log() + show_runs(h); });
  auto run = h.journal()->find_run(id);
  // Under --workspace-root the workspace is on storage every worker reaches: no machine is named.
  CHECK(run->workspace == (shared_journal ? (root / id).string() : h.workspace(id).string()));
  CHECK(run->workspace_host.empty());
  CHECK(slurp(fs::path(run->workspace) / "exec.log") == "step a\n");
  serve.stop();
}

// The layout docs/scale-out.md recommends: workers with homes of their own
// and one --workspace-root, runs with the default policy (a quota image
// under root). What a step wrote before a suspension is there after another
// worker woke the run, since the image lives beside the workspace under the
// root, not in the home of the worker that made it.
TEST_CASE("a worker's files reach the next worker: suspended on one worker with a home of its own, woken on another",
          "[postgres]") {
  cairn_home h(cairn_home::any_backend);
  const auto p = testing::test_prefix();
  const auto root = h.file("shared"), home_a = h.file("home-a"), home_b = h.file("home-b");
  fs::create_directories(root);
  std::vector<std::string> ids;
  for (int i = 1; i <= 4; ++i) {
    ids.push_back(p + "m-" + std::to_string(i));
    h.submit(ids.back(), plan_of({step("before"), wait_for_signal("go"), step("after")}));
  }
  const std::vector<std::string> worker_args = {"--workspace-root", root.string(), "--suspend-after", "200"};
  auto files = [&](const std::string& id) { return slurp(root / id / "exec.log"); };
  {
    daemon_process a(h, "a", worker_args, "", home_a);
    wait_suspended(h, ids, a);
    a.stop();
  }
  // Worker a kept nothing of the runs in its home: their images are under the root.
  for (const auto& id : ids) {
    CHECK_FALSE(fs::exists(home_a / "images" / (id + ".img")));
    CHECK(fs::exists(root / ".images" / (id + ".img")));
  }
  daemon_process b(h, "b", worker_args, "", home_b);
  for (const auto& id : ids) h.signal(id, "go", json{{"to", id}});
  eventually("every run completed on worker b", [&] {
    auto j = h.journal();
    for (const auto& id : ids)
      if (j->find_run(id)->status != run_status::completed) return false;
    return true;
  }, [&] { return b.log() + show_runs(h); });
  for (const auto& id : ids) {
    INFO(id << "\n" << b.log() << show_runs(h));
    CHECK(files(id) == "step before\nstep after\n");
    CHECK_FALSE(fs::exists(root / ".images" / (id + ".img")));  // released into the folder at the run's end
  }
  b.stop();
}

// Two workers never mount one run's image at once: worker a, paused past
// its lease inside a slow step, still has the run's image mounted when
// worker b takes the run over. b refuses to mount it too and hands the run
// back; once a, resumed, is fenced and lets go, b executes the run, and the
// files of the steps a committed are there.
TEST_CASE("a worker never mounts a run's image while a paused worker still has it mounted", "[postgres]") {
  cairn_home h(cairn_home::any_backend);
  const auto p = testing::test_prefix();
  const auto root = h.file("shared"), home_a = h.file("home-a"), home_b = h.file("home-b");
  fs::create_directories(root);
  const std::string id = p + "held";
  h.submit(id, plan_of({step("a"), slow("s", 6000, /*first_only=*/true), step("b")}));
  const std::vector<std::string> args = {"--workspace-root", root.string(), "--lease", "2"};
  daemon_process a(h, "a", args, "", home_a);
  auto both = [&] { return a.log() + show_runs(h); };
  eventually("worker a is inside the slow step", [&] {
    return slurp(root / id / "exec.log").find("slow s") != std::string::npos;
  }, both);
  REQUIRE(::kill(a.pid(), SIGSTOP) == 0);
  daemon_process b(h, "b", args, "", home_b);
  auto all = [&] { return a.log() + b.log() + show_runs(h); };
  eventually("worker b refuses to mount the image a holds, and hands the run back", [&] {
    for (const auto& e : h.journal()->events(id))
      if (e.kind == "run_released" && e.data.dump().find("in use by another cairn process") != std::string::npos)
        return true;
    return false;
  }, all);
  REQUIRE(::kill(a.pid(), SIGCONT) == 0);
  eventually("the run completed", [&] { return h.journal()->find_run(id)->status == run_status::completed; }, all,
             120s);
  INFO(all());
  const std::string files = slurp(root / id / "exec.log");
  CHECK(files.rfind("step a\n", 0) == 0);  // step a's file, written under a, is there
  CHECK(files.find("step b\n") != std::string::npos);
  a.stop();
  b.stop();
}

// An image an older cairn left in a worker's home for a run of the shared
// root is moved beside the workspace when that worker starts again, so
// another worker that wakes the run finds the files.
TEST_CASE("an image an older worker kept in its home for a run of the shared root moves under the root at its next start",
          "[postgres]") {
  cairn_home h(cairn_home::any_backend);
  const auto p = testing::test_prefix();
  const auto root = h.file("shared"), home_a = h.file("home-a"), home_b = h.file("home-b");
  fs::create_directories(root);
  const std::string id = p + "old";
  h.submit(id, plan_of({step("before"), wait_for_signal("go"), step("after")}));
  const std::vector<std::string> worker_args = {"--workspace-root", root.string(), "--suspend-after", "200"};
  const fs::path image = root / ".images" / (id + ".img"), old = home_a / "images" / (id + ".img");
  {
    daemon_process a(h, "a", worker_args, "", home_a);
    wait_suspended(h, {id}, a);
    a.stop();
  }
  // Where the layout before this one kept it.
  fs::create_directories(old.parent_path());
  fs::rename(image, old);
  {
    daemon_process a(h, "a-again", worker_args, "", home_a);
    eventually("worker a moved the image under the root", [&] { return fs::exists(image) && !fs::exists(old); },
               [&] { return a.log(); });
    a.stop();
  }
  daemon_process b(h, "b", worker_args, "", home_b);
  h.signal(id, "go", json{{"to", id}});
  eventually("the run completed on worker b", [&] { return h.journal()->find_run(id)->status == run_status::completed; },
             [&] { return b.log() + show_runs(h); });
  CHECK(slurp(root / id / "exec.log") == "step before\nstep after\n");
  b.stop();
}

// Without a shared root each worker's workspaces are its own: a worker with
// another CAIRN_HOME on the same machine never starts such a run on an empty
// folder; it refuses, says why in the run's events, and the run waits for its worker.
TEST_CASE("a worker refuses a run whose workspace is in another worker's home, and says why", "[postgres]") {
  cairn_home h(cairn_home::any_backend);
  const auto p = testing::test_prefix();
  const auto home_a = h.file("home-a"), home_b = h.file("home-b");
  const std::string id = p + "mine";
  h.submit(id, plan_of({step("before"), wait_for_signal("go"), step("after")}));
  {
    daemon_process a(h, "a", {"--suspend-after", "200"}, "", home_a);
    wait_suspended(h, {id}, a);
    a.stop();
  }
  const auto workspace = home_a / "workspaces" / id;
  CHECK(h.journal()->find_run(id)->workspace == workspace.string());
  daemon_process b(h, "b", {}, "", home_b);
  h.signal(id, "go", json{{"to", id}});
  auto refusal = [&] {
    for (const auto& e : h.journal()->events(id))
      if (e.kind == "sandbox_warning" && e.data.value("message", "").find("cannot be executed by") != std::string::npos)
        return e.data.value("message", "");
    return std::string();
  };
  eventually("worker b journals why it does not execute the run", [&] { return !refusal().empty(); },
             [&] { return b.log() + show_runs(h); });
  CHECK_THAT(refusal(), Catch::Contains("CAIRN_HOME=" + home_a.string()));
  auto run = h.journal()->find_run(id);
  CHECK(run->status == run_status::waiting);
  CHECK(h.journal()->steps(id).size() == 1);
  CHECK_FALSE(fs::exists(home_b / "workspaces" / id));
  b.stop();
  // Its own worker finishes it, with the files it wrote.
  daemon_process a(h, "a-again", {}, "", home_a);
  eventually("the run completed on its worker", [&] { return h.journal()->find_run(id)->status == run_status::completed; },
             [&] { return a.log() + show_runs(h); });
  CHECK(slurp(workspace / "exec.log") == "step before\nstep after\n");
  a.stop();
}

// docs/sandbox.md: a run cancelled while it waited has its files copied out
// of its quota image, as at any run's end; the image does not stay forever.
TEST_CASE("a run cancelled while suspended gets its files back in its folder, and its image goes") {
  cairn_home h(cairn_home::any_backend);
  const auto p = testing::test_prefix();
  const std::string id = p + "cancelled";
  h.submit(id, plan_of({step("before"), wait_for_signal("go"), step("after")}));
  const auto root = h.file("shared");
  fs::create_directories(root);
  std::vector<std::string> args = {"--suspend-after", "200"};
  if (h.on_postgres()) args.insert(args.end(), {"--workspace-root", root.string()});
  daemon_process worker(h, "worker", args);
  wait_suspended(h, {id}, worker);
  worker.stop();
  const auto run = h.journal()->find_run(id);
  const fs::path workspace = run->workspace;
  const fs::path image = h.on_postgres() ? root / ".images" / (id + ".img") : h.home() / "images" / (id + ".img");
  REQUIRE(fs::exists(image));
  auto cancelled = h.cli({"cancel", id});
  INFO(cancelled.out << cancelled.err);
  REQUIRE(cancelled.code == 0);
  CHECK(h.journal()->find_run(id)->status == run_status::cancelled);
  CHECK_FALSE(fs::exists(image));
  CHECK(slurp(workspace / "exec.log") == "step before\n");
}

// Whoever may write a shared journal must not choose what runs on a worker
// or as whom: rows asking for no sandbox, command tools on the host or a
// folder of the worker's are refused, at every attempt, unless the worker
// itself allows them; a refused row's folder is never touched.
TEST_CASE("a worker on a shared journal runs no row that asks for no sandbox, a host command or a folder of its own",
          "[postgres]") {
  cairn_home h(cairn_home::any_backend);
  h.allow("");
  const auto p = testing::test_prefix();
  const std::string bare = p + "bare", command = p + "command", folder = p + "folder", changed = p + "changed";
  h.submit(bare, plan_of({step("a")}), {"--sandbox", "none"});
  const auto policy = h.file("policy.json");
  std::ofstream(policy) << json{{"tools", {{"record", {{"command", {"/bin/true"}}, {"input", json::object()}, {"idempotency", "idempotent"}}}}}}.dump();
  h.submit(command, plan_of({step("a")}), {"--policy", policy.string()});
  // A root-only folder with a secret, given as the workspace.
  const auto closed = h.file("closed");
  fs::create_directories(closed);
  std::ofstream(closed / "secret") << "root's\n";
  ::chmod(closed.c_str(), 0700);
  struct stat before {};
  REQUIRE(::stat(closed.c_str(), &before) == 0);
  h.submit(folder, plan_of({step("a")}), {"--workspace", closed.string()});
  // A run that waits, whose row is changed before it is woken.
  h.submit(changed, plan_of({step("a"), wait_for_signal("go"), step("b")}));
  const auto root = h.file("shared");
  fs::create_directories(root);
  daemon_process worker(h, "worker", {"--workspace-root", root.string(), "--suspend-after", "200"});
  auto context = [&] { return worker.log() + show_runs(h); };
  auto failed_with = [&](const std::string& id, const std::string& flag) {
    auto run = h.journal()->find_run(id);
    INFO(id << ": " << (run->error ? run->error->message : "no error"));
    CHECK(run->status == run_status::failed);
    REQUIRE(run->error);
    CHECK(run->error->type == "refused");
    CHECK_THAT(run->error->message, Catch::Contains("--allow " + flag));
    CHECK(run->attempts == 0);  // no sandbox, no agent
  };
  eventually("the three rows are refused, the fourth waits", [&] {
    auto j = h.journal();
    return ended(j->find_run(bare)->status) && ended(j->find_run(command)->status) &&
           ended(j->find_run(folder)->status) && j->find_run(changed)->status == run_status::waiting;
  }, context);
  failed_with(bare, "sandbox-none");
  failed_with(command, "command-tools");
  failed_with(folder, "any-workspace");
  struct stat after {};
  REQUIRE(::stat(closed.c_str(), &after) == 0);
  CHECK(after.st_uid == before.st_uid);
  CHECK(after.st_mode == before.st_mode);
  CHECK_FALSE(fs::exists(closed / "exec.log"));

  // Someone with write access to the database turns the waiting run into
  // an unsandboxed shell; the worker checks the row again when it wakes it.
  auto sql = testing::run_program("/usr/bin/psql",
                                  {h.journal_path(), "-v", "ON_ERROR_STOP=1", "-c",
                                   "UPDATE runs SET sandbox = 'none', agent = '/bin/sh' WHERE id = '" + changed + "'"},
                                  h.file(""));
  INFO(sql.out << sql.err);
  REQUIRE(sql.code == 0);
  h.signal(changed, "go", json{{"to", changed}});
  eventually("the changed row is refused", [&] { return ended(h.journal()->find_run(changed)->status); }, context);
  auto run = h.journal()->find_run(changed);
  CHECK(run->status == run_status::failed);
  REQUIRE(run->error);
  CHECK_THAT(run->error->message, Catch::Contains("--allow sandbox-none"));
  CHECK(h.journal()->steps(changed).size() == 1);  // step a; the signal was never delivered to it
  worker.stop();
}

TEST_CASE("a worker never takes a run whose workspace is on another machine") {
  cairn_home h(cairn_home::any_backend);
  const auto p = testing::test_prefix();
  h.submit(p + "first", plan_of({step("a")}), {"--sandbox", "none"});  // creates the journal
  {
    auto j = storage::open_journal(h.journal_path());
    storage::new_run elsewhere;
    elsewhere.id = p + "elsewhere";
    elsewhere.agent = WAIT_AGENT;
    elsewhere.input = {{"plan", plan_of({step("a")})}};
    elsewhere.sandbox = "none";
    elsewhere.workspace = "/srv/other-machine/workspaces/" + elsewhere.id;
    elsewhere.workspace_host = "another-machine-" + p;
    j->create_run(elsewhere);
  }
  h.submit(p + "after", plan_of({step("a")}), {"--sandbox", "none"});
  daemon_process serve(h, "serve");
  // Runs are looked at oldest first: once the later one completed, the one between was passed over.
  eventually("the runs beside it completed", [&] {
    auto j = h.journal();
    return j->find_run(p + "first")->status == run_status::completed &&
           j->find_run(p + "after")->status == run_status::completed;
  }, [&] { return serve.log() + show_runs(h); });
  auto run = h.journal()->find_run(p + "elsewhere");
  CHECK(run->status == run_status::pending);
  CHECK(run->attempts == 0);
  CHECK(run->owner.empty());
  serve.stop();
}

TEST_CASE("a worker rides out a restart of PostgreSQL: it keeps serving, and no acknowledged step runs again",
          "[postgres]") {
  cairn_home h(cairn_home::any_backend);
  REQUIRE(h.on_postgres());  // ctest's daemon_test_postgres; the SQLite run leaves [postgres] out
  auto& cluster = testing::shared_pg_cluster();
  const auto p = testing::test_prefix();
  const json plan = plan_of({step("a"), slow("s", 1500), step("b"), nap(300), wait_for_signal("go"), step("c")});
  std::vector<std::string> ids;
  for (int i = 0; i < 4; ++i) {
    ids.push_back(numbered(p + "r", i));
    h.submit(ids.back(), plan);
  }
  daemon_process d(h, "d", {"--max-concurrent", "4", "--lease", "2"});
  auto context = [&] { return d.log(); };
  eventually("every run has journaled its first step", [&] {
    auto j = h.journal();
    return std::all_of(ids.begin(), ids.end(), [&](const auto& id) { return j->step_count(id) > 0; });
  }, context);
  const auto before = take_snapshot(h);

  cluster.stop(/*fast=*/false);  // an immediate shutdown: every connection cut
  eventually("the worker says the journal is out of reach",
             [&] { return d.log().find("the journal is out of reach") != std::string::npos; }, context);
  // Down past the worker's 2 s lease, so that its lease has expired when the server is back.
  std::this_thread::sleep_for(3s);
  CHECK_THAT(d.log(), Catch::StartsWith("cairn serve (still running)"));
  cluster.start();
  eventually("the worker says the journal answers again",
             [&] { return d.log().find("the journal answers again") != std::string::npos; }, context);
  for (const auto& id : ids) h.signal(id, "go", {{"id", id}});
  eventually("every run ended", [&] { return every_run_ended(h); }, [&] { return d.log() + show_runs(h); }, 90s);
  INFO(d.log());
  for (const auto& id : ids) check_completed(h, id, plan, before);
  CHECK_THAT(d.log(), Catch::StartsWith("cairn serve (still running)"));
  d.stop();
}
