// Long-running runs driven in-process: durable timers, signals, child runs,
// cancellation, step and run timeouts, run retries and a graceful stop. The
// agent is tests/agents/wait_agent (a plan of ops; exec.log in its workspace
// counts real executions of step bodies, so a replay shows as no new line).
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <future>
#include <thread>

#include "engine/engine.hpp"
#include "engine/scheduler.hpp"
#include "tests/temp_dir.hpp"

using namespace cairn;
using namespace std::chrono_literals;
using json = nlohmann::json;
using storage::run_status;

namespace {

using steady = std::chrono::steady_clock;

json op_step(const std::string& name) { return {{"op", "step"}, {"name", name}}; }
json op_sleep(std::int64_t ms) { return {{"op", "sleep"}, {"ms", ms}}; }
json op_signal(const std::string& name, std::optional<std::int64_t> timeout_ms = std::nullopt) {
  json op = {{"op", "signal"}, {"name", name}};
  if (timeout_ms) op["timeout_ms"] = *timeout_ms;
  return op;
}
json op_child(const json& input, const std::string& agent = "wait_agent") {
  return {{"op", "child"}, {"agent", agent}, {"input", input}};
}
json op_slow(const std::string& name, int ms, int timeout_ms = 0, int attempts = 1, bool first_only = false) {
  return {{"op", "slow"}, {"name", name}, {"ms", ms}, {"timeout_ms", timeout_ms}, {"attempts", attempts},
          {"first_only", first_only}};
}
json op_join_all() { return {{"op", "join_all"}}; }
json op_fail(const std::string& message) { return {{"op", "fail"}, {"message", message}}; }
json op_crash() { return {{"op", "crash"}}; }
json plan(std::vector<json> ops, bool catch_errors = false) { return {{"plan", ops}, {"catch", catch_errors}}; }

struct watcher : engine::run_observer {
  std::vector<std::string> warnings;
  void on_warning(const std::string& w) override { warnings.push_back(w); }
};

// Polls `condition` every 10 ms for up to `limit`.
template <class F>
bool eventually(F condition, std::chrono::milliseconds limit = 20s) {
  const auto until = steady::now() + limit;
  while (!condition()) {
    if (steady::now() > until) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

struct refusal {
  std::optional<engine::errc> code;
  std::string message;
};
template <class F>
refusal refusal_of(F call) {
  try {
    call();
  } catch (const engine::engine_error& e) {
    return {e.code(), e.what()};
  }
  return {};
}

std::int64_t ms_since(steady::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(steady::now() - t0).count();
}

struct fixture {
  testing::temp_dir dir;
  std::unique_ptr<storage::journal> journal = storage::open_journal(dir / "cairn.db");
  engine::engine_options options;
  std::unique_ptr<engine::engine> eng;
  watcher watch;

  explicit fixture(std::chrono::milliseconds suspend_after = 300ms, bool fast_retry = true) {
    options.home = dir / "home";
    if (fast_retry) options.retry_backoff = 10ms;
    options.suspend_after = suspend_after;
    eng = std::make_unique<engine::engine>(*journal, options);
  }

  void submit(const std::string& id, const json& input, const engine::policy& p = engine::default_policy(),
              int max_attempts = 3) {
    engine::run_request r;
    r.id = id;
    r.agent = WAIT_AGENT;
    r.input = input;
    r.workspace = dir / "ws" / id;
    r.policy = p;
    r.max_attempts = max_attempts;
    REQUIRE(eng->submit(r).second);
  }
  storage::run_record execute(const std::string& id) { return eng->execute(id, &watch); }
  storage::run_record run(const std::string& id, const json& input, const engine::policy& p = engine::default_policy(),
                          int max_attempts = 3) {
    submit(id, input, p, max_attempts);
    return execute(id);
  }
  storage::run_record record(const std::string& id) { return *journal->find_run(id); }

  // Executes the run on another thread, with its own journal (one per thread) and engine.
  std::future<storage::run_record> execute_elsewhere(const std::string& id, engine::engine_options o) {
    return std::async(std::launch::async, [db = dir / "cairn.db", o, id] {
      std::unique_ptr<storage::journal> j = storage::open_journal(db);
      engine::engine e(*j, o);
      return e.execute(id);
    });
  }

  // How many times the agent really executed `line` (e.g. "step a"). Under
  // root a run's files stay in its quota image until it ends (a suspended
  // run's image is only unmounted): then they are read with debugfs.
  int executed(const std::string& id, const std::string& line) {
    const auto ws = dir / "ws" / id, image = options.home / "images" / (id + ".img");
    std::stringstream log;
    if (std::filesystem::exists(image)) {
      const std::string read = "debugfs -R 'cat /exec.log' " + image.string() + " 2>/dev/null";
      std::unique_ptr<FILE, int (*)(FILE*)> out(::popen(read.c_str(), "r"), ::pclose);
      char buffer[4096];
      for (std::size_t n; out && (n = std::fread(buffer, 1, sizeof buffer, out.get())) > 0;) log.write(buffer, n);
    } else {
      log << std::ifstream(ws / "exec.log").rdbuf();
    }
    return count_lines(log, line);
  }

  // How many times the agent of the live run `id` logged `line`, read
  // through its workspace as its sandbox sees it (mounted, where it has an
  // image: the image file itself lags behind).
  int executing(const std::string& id, const std::string& line) {
    std::ifstream log(dir / "ws" / id / "exec.log");
    return count_lines(log, line);
  }

  static int count_lines(std::istream& log, const std::string& line) {
    int n = 0;
    for (std::string l; std::getline(log, l);) n += l == line;
    return n;
  }

  std::vector<storage::event_record> events(const std::string& id, const std::string& kind) {
    std::vector<storage::event_record> out;
    for (auto& e : journal->events(id))
      if (e.kind == kind) out.push_back(std::move(e));
    return out;
  }
};

// A scheduler over the fixture's journal on its own thread, stopped
// (gracefully) by stop() or at the end of the scope.
class running_scheduler {
 public:
  explicit running_scheduler(fixture& f, int max_concurrent = 6) : sched_(options_of(f, max_concurrent)) {
    thread_ = std::thread([this] { sched_.run({}, stop_); });
  }
  ~running_scheduler() { stop(); }
  void stop() {
    stop_.raise();
    if (thread_.joinable()) thread_.join();
  }

 private:
  static engine::scheduler_options options_of(fixture& f, int max_concurrent) {
    engine::scheduler_options o;
    o.db = f.dir / "cairn.db";
    o.engine = f.options;
    o.max_concurrent = max_concurrent;
    return o;
  }
  engine::stop_flag stop_;
  engine::scheduler sched_;
  std::thread thread_;
};

bool ended(run_status s) {
  return s == run_status::completed || s == run_status::failed || s == run_status::cancelled;
}

}  // namespace

// ---------------------------------------------------------------- timers

TEST_CASE("a short sleep is held with the sandbox alive and fires after its time") {
  fixture f;
  const auto before = storage::now_ms();
  auto run = f.run("nap", plan({op_step("a"), op_sleep(150), op_step("b")}));
  REQUIRE(run.status == run_status::completed);
  CHECK(run.output == json({"a", "slept", "b"}));
  CHECK(run.attempts == 1);
  CHECK(f.events("nap", "run_waiting").empty());
  auto steps = f.journal->steps("nap");
  REQUIRE(steps.size() == 3);
  CHECK(steps[1].result.kind == protocol::step_kind::sleep);
  const auto until = steps[1].result.output.at("until_ms").get<std::int64_t>();
  CHECK(until >= before + 150);
  CHECK(steps[1].result.output.at("fired_at_ms").get<std::int64_t>() >= until);
}

TEST_CASE("a long sleep suspends the run without a sandbox; the timer fires once and nothing before it reruns") {
  fixture f;
  // Long enough that the run is back, suspended, well before its time on a loaded machine.
  auto run = f.run("long", plan({op_step("a"), op_sleep(3000), op_step("b")}));
  REQUIRE(run.status == run_status::waiting);
  REQUIRE(run.wait);
  CHECK(run.wait->kind == "timer");
  CHECK(run.wait->seq == 1u);
  REQUIRE(run.wait->wake_at_ms);
  CHECK(run.owner.empty());
  CHECK(run.attempts == 1);
  CHECK(f.executed("long", "step a") == 1);
  const auto wake = *run.wait->wake_at_ms;

  // Before the time: nothing starts, the run stays as it is.
  int early = 0;
  while (storage::now_ms() < wake - 100) {
    auto again = f.execute("long");
    CHECK(again.status == run_status::waiting);
    CHECK(again.attempts == 1);
    ++early;
    std::this_thread::sleep_for(50ms);
  }
  CHECK(early > 0);
  CHECK(f.events("long", "attempt_started").size() == 1);

  REQUIRE(eventually([&] { return storage::now_ms() >= wake; }));
  run = f.execute("long");
  REQUIRE(run.status == run_status::completed);
  CHECK(run.output == json({"a", "slept", "b"}));
  CHECK(run.attempts == 2);
  auto steps = f.journal->steps("long");
  REQUIRE(steps.size() == 3);
  CHECK(steps[1].result.kind == protocol::step_kind::sleep);
  CHECK(steps[1].result.output.at("until_ms") == wake);
  CHECK(steps[1].result.output.at("fired_at_ms").get<std::int64_t>() >= wake);
  auto set = f.events("long", "timer_set");
  REQUIRE(set.size() == 1);
  CHECK(set[0].seq == 1u);
  CHECK(f.executed("long", "step a") == 1);
  CHECK(f.executed("long", "step b") == 1);
}

TEST_CASE("a timer that came due while no host ran fires once, late, at the next execution") {
  fixture f;
  auto run = f.run("down", plan({op_sleep(400), op_step("after")}));
  REQUIRE(run.status == run_status::waiting);
  const auto wake = *run.wait->wake_at_ms;
  // The host is down: nothing executes until well past the wake time.
  std::this_thread::sleep_until(std::chrono::system_clock::time_point(std::chrono::milliseconds(wake + 600)));

  run = f.execute("down");
  REQUIRE(run.status == run_status::completed);
  auto steps = f.journal->steps("down");
  REQUIRE(steps.size() == 2);
  CHECK(steps[0].result.output.at("until_ms") == wake);
  CHECK(steps[0].result.output.at("fired_at_ms").get<std::int64_t>() >= wake + 600);
  CHECK(f.events("down", "timer_set").size() == 1);
  CHECK(f.executed("down", "step after") == 1);
}

TEST_CASE("a timer set in the past fires at once, says so, and changes nothing else") {
  fixture f;
  const auto at = storage::now_ms() - 3'600'000;
  auto run = f.run("past", plan({op_step("a"), {{"op", "sleep_until"}, {"at_ms", at}}, op_step("b")}));
  REQUIRE(run.status == run_status::completed);
  CHECK(run.output == json({"a", "slept", "b"}));
  CHECK(run.attempts == 1);
  CHECK(f.events("past", "run_waiting").empty());
  auto set = f.events("past", "timer_set");
  REQUIRE(set.size() == 1);
  CHECK(set[0].data.at("in_past") == true);
  CHECK(set[0].data.at("until_ms") == at);
  auto steps = f.journal->steps("past");
  REQUIRE(steps.size() == 3);
  CHECK(steps[1].result.output.at("until_ms") == at);
  CHECK(steps[1].result.ok);
  bool warned = false;
  for (const auto& w : f.watch.warnings) warned |= w.find("in the past") != std::string::npos;
  CHECK(warned);
  CHECK(f.executed("past", "step a") == 1);
  CHECK(f.executed("past", "step b") == 1);
}

// ---------------------------------------------------------------- signals

TEST_CASE("a signal queued before the run waits is delivered when it waits, payload intact") {
  fixture f;
  const json payload = {{"approved", true},
                        {"by", "Zoë ✓"},
                        {"notes", {1, 2.5, nullptr, "x"}},
                        {"nested", {{"k", {{"deep", json::array()}}}}}};
  f.submit("early", plan({op_step("a"), op_signal("approval")}));
  auto queued = f.eng->signal("early", "approval", payload);
  CHECK_FALSE(queued.delivered_seq);
  CHECK(f.events("early", "signal_queued").size() == 1);

  auto run = f.execute("early");
  REQUIRE(run.status == run_status::completed);
  CHECK(run.attempts == 1);
  CHECK(run.output[1] == json({{"signal", payload}}));
  auto steps = f.journal->steps("early");
  REQUIRE(steps.size() == 2);
  CHECK(steps[1].result.kind == protocol::step_kind::signal);
  CHECK(steps[1].result.output.at("timed_out") == false);
  CHECK(steps[1].result.output.at("payload") == payload);
  auto signals = f.journal->signals("early");
  REQUIRE(signals.size() == 1);
  CHECK(signals[0].delivered_seq == std::optional<std::uint64_t>(1));
}

TEST_CASE("a signal is delivered once: a second wait for the same name waits for a second signal") {
  fixture f;
  f.submit("twice", plan({op_signal("approval"), op_signal("approval")}));
  f.eng->signal("twice", "approval", {{"n", 1}});
  auto run = f.execute("twice");
  REQUIRE(run.status == run_status::waiting);
  REQUIRE(run.wait);
  CHECK(run.wait->kind == "signal");
  CHECK(run.wait->key == "approval");
  CHECK(run.wait->seq == 1u);
  CHECK_FALSE(run.wait->wake_at_ms);
  CHECK(f.journal->steps("twice").size() == 1);

  // Nothing new to deliver: executing it again starts nothing.
  run = f.execute("twice");
  CHECK(run.status == run_status::waiting);
  CHECK(run.attempts == 1);

  f.eng->signal("twice", "approval", {{"n", 2}});
  run = f.execute("twice");
  REQUIRE(run.status == run_status::completed);
  CHECK(run.output == json::array({json{{"signal", {{"n", 1}}}}, json{{"signal", {{"n", 2}}}}}));
  auto signals = f.journal->signals("twice");
  REQUIRE(signals.size() == 2);
  CHECK(signals[0].delivered_seq == std::optional<std::uint64_t>(0));
  CHECK(signals[1].delivered_seq == std::optional<std::uint64_t>(1));
  CHECK(f.events("twice", "signal_delivered").size() == 2);
}

TEST_CASE("a signal wait times out, held or suspended") {
  fixture f;
  // 100 ms: held with the sandbox; 800 ms: longer than suspend_after, suspended.
  auto run = f.run("late", plan({op_signal("x", 100), op_signal("y", 800)}));
  REQUIRE(run.status == run_status::waiting);
  REQUIRE(run.wait);
  CHECK(run.wait->kind == "signal");
  REQUIRE(run.wait->wake_at_ms);
  const auto deadline = *run.wait->wake_at_ms;
  REQUIRE(eventually([&] { return storage::now_ms() >= deadline; }));
  run = f.execute("late");
  REQUIRE(run.status == run_status::completed);
  CHECK(run.output == json::array({json{{"timed_out", true}}, json{{"timed_out", true}}}));
  auto steps = f.journal->steps("late");
  REQUIRE(steps.size() == 2);
  for (const auto& s : steps) {
    CHECK(s.result.kind == protocol::step_kind::signal);
    CHECK(s.result.output.at("timed_out") == true);
  }
  CHECK(steps[1].finished_at_ms >= deadline);
}

TEST_CASE("a signal for an unknown or ended run is refused and writes nothing") {
  fixture f;
  auto unknown = refusal_of([&] { f.eng->signal("nobody", "approval", {}); });
  CHECK(unknown.code == engine::errc::not_found);
  CHECK_THAT(unknown.message, Catch::Contains("nobody"));
  CHECK_FALSE(f.journal->find_run("nobody"));

  REQUIRE(f.run("over", plan({op_step("a")})).status == run_status::completed);
  const auto events_before = f.journal->events("over").size();
  auto ended_run = refusal_of([&] { f.eng->signal("over", "approval", {{"x", 1}}); });
  CHECK(ended_run.code == engine::errc::bad_request);
  CHECK(f.journal->signals("over").empty());
  CHECK(f.journal->events("over").size() == events_before);
  CHECK(f.record("over").status == run_status::completed);
}

// ---------------------------------------------------------------- children

TEST_CASE("a fan-out of four children runs them concurrently and joins their outputs in order") {
  fixture f;
  std::vector<json> ops;
  // Each child's step is long enough for all four sandboxes to start on a loaded machine.
  for (int i = 0; i < 4; ++i) ops.push_back(op_child(plan({op_slow("c" + std::to_string(i), 4000)})));
  ops.push_back(op_join_all());
  f.submit("fan", plan(ops));
  {
    running_scheduler sched(f);
    REQUIRE(eventually([&] { return ended(f.record("fan").status); }, 30s));
  }
  auto run = f.record("fan");
  REQUIRE(run.status == run_status::completed);
  json joined = json::array();
  for (int i = 0; i < 4; ++i) joined.push_back(json::array({"c" + std::to_string(i)}));
  CHECK(run.output == json::array({"fan.0", "fan.1", "fan.2", "fan.3", joined}));
  auto children = f.journal->children("fan");
  REQUIRE(children.size() == 4);
  std::int64_t last_start = 0, first_end = INT64_MAX;
  for (const auto& c : children) {
    CHECK(c.parent_id == "fan");
    CHECK(c.status == run_status::completed);
    auto steps = f.journal->steps(c.id);
    REQUIRE(steps.size() == 1);
    last_start = std::max(last_start, steps[0].started_at_ms);
    first_end = std::min(first_end, steps[0].finished_at_ms);
  }
  CHECK(last_start < first_end);  // every child was inside its step at once
}

TEST_CASE("a failed child's error reaches its parent: caught, or failing the parent") {
  fixture f;
  const json failing = plan({op_fail("boom in the child")});
  f.submit("caught", plan({op_child(failing), op_join_all(), op_step("after")}, true));
  f.submit("uncaught", plan({op_child(failing), op_join_all(), op_step("after")}));
  {
    running_scheduler sched(f);
    REQUIRE(eventually([&] { return ended(f.record("caught").status) && ended(f.record("uncaught").status); }, 30s));
  }
  CHECK(f.record("caught.0").status == run_status::failed);
  auto caught = f.record("caught");
  REQUIRE(caught.status == run_status::completed);
  CHECK_THAT(caught.output[1].value("child_failed", ""),
             Catch::Contains("caught.0") && Catch::Contains("boom in the child"));
  CHECK(caught.output[2] == "after");
  auto join = f.journal->steps("caught").at(1).result;
  CHECK(join.kind == protocol::step_kind::join);
  CHECK_FALSE(join.ok);
  CHECK(join.error.type == "child_failed");

  auto uncaught = f.record("uncaught");
  REQUIRE(uncaught.status == run_status::failed);
  REQUIRE(uncaught.error);
  CHECK(uncaught.error->type == "child_failed");
  CHECK_THAT(uncaught.error->message, Catch::Contains("boom in the child"));
  CHECK(f.executed("uncaught", "step after") == 0);
}

TEST_CASE("a child agent that does not exist is a child_error and the run goes on") {
  fixture f;
  auto run = f.run("orphan", plan({op_child(plan({}), "no_such_agent"), op_step("after")}, true));
  REQUIRE(run.status == run_status::completed);
  CHECK_THAT(run.output[0].value("child_error", ""), Catch::Contains("no_such_agent"));
  CHECK(run.output[1] == "after");
  auto step = f.journal->steps("orphan").at(0).result;
  CHECK(step.kind == protocol::step_kind::child);
  CHECK_FALSE(step.ok);
  CHECK(step.error.type == "no_such_agent");
  CHECK(f.journal->children("orphan").empty());
}

TEST_CASE("a child agent outside the parent's folder runs only when the policy lists it") {
  fixture f;
  auto p = engine::parse_policy({{"children", {{"agents", {STEP_AGENT}}}}});
  auto run = f.run("paths", plan({op_child({{"steps", 1}}, STEP_AGENT), op_child(json::object(), TOOL_AGENT)}, true), p);
  REQUIRE(run.status == run_status::completed);
  CHECK(run.output[0] == "paths.0");
  CHECK_THAT(run.output[1].value("child_error", ""), Catch::Contains("children.agents"));
  CHECK(f.journal->steps("paths").at(1).result.error.type == "refused");
  auto children = f.journal->children("paths");
  REQUIRE(children.size() == 1);
  CHECK(children[0].agent == std::filesystem::path(STEP_AGENT).lexically_normal().string());
}

TEST_CASE("a cancelled child reaches its joining parent as child_cancelled") {
  fixture f;
  f.submit("waiter", plan({op_child(plan({op_signal("never")})), op_join_all(), op_step("after")}, true));
  running_scheduler sched(f);
  REQUIRE(eventually([&] { return f.journal->find_run("waiter.0") && !f.events("waiter.0", "wait_started").empty(); }));
  f.eng->cancel("waiter.0", "not this one");
  REQUIRE(eventually([&] { return ended(f.record("waiter").status); }));
  sched.stop();
  CHECK(f.record("waiter.0").status == run_status::cancelled);
  auto run = f.record("waiter");
  REQUIRE(run.status == run_status::completed);
  CHECK_THAT(run.output[1].value("child_failed", ""), Catch::Contains("was cancelled"));
  CHECK(run.output[2] == "after");
  CHECK(f.journal->steps("waiter").at(1).result.error.type == "child_cancelled");
}

TEST_CASE("children.max refuses the next child; children left unfinished are cancelled when the parent ends") {
  fixture f;
  auto p = engine::parse_policy({{"children", {{"max", 2}}}});
  const json kid = plan({op_step("kid")});
  auto run = f.run("capped", plan({op_child(kid), op_child(kid), op_child(kid), op_step("after")}, true), p);
  REQUIRE(run.status == run_status::completed);
  CHECK(run.output[0] == "capped.0");
  CHECK(run.output[1] == "capped.1");
  CHECK_THAT(run.output[2].value("child_error", ""), Catch::Contains("children.max"));
  CHECK(run.output[3] == "after");
  CHECK(f.journal->steps("capped").at(2).result.error.type == "refused");
  auto children = f.journal->children("capped");
  REQUIRE(children.size() == 2);
  for (const auto& c : children) {
    CHECK(c.status == run_status::cancelled);
    REQUIRE(c.error);
    CHECK_THAT(c.error->message, Catch::Contains("capped"));
  }
  CHECK_FALSE(f.journal->find_run("capped.2"));
}

TEST_CASE("cancelling a parent cancels its unfinished children") {
  fixture f;
  const json waits = plan({op_step("k"), op_signal("never")});
  f.submit("boss", plan({op_child(waits), op_child(waits), op_join_all()}));
  running_scheduler sched(f);
  REQUIRE(eventually([&] {
    return f.record("boss").status == run_status::waiting && f.journal->children("boss").size() == 2 &&
           !f.events("boss.0", "wait_started").empty() && !f.events("boss.1", "wait_started").empty();
  }));
  CHECK(f.eng->cancel("boss", "the user gave up") == engine::engine::cancel_outcome::cancelled);
  CHECK(f.record("boss").status == run_status::cancelled);
  REQUIRE(eventually([&] {
    return f.record("boss.0").status == run_status::cancelled && f.record("boss.1").status == run_status::cancelled;
  }));
  sched.stop();
  for (const auto* id : {"boss.0", "boss.1"}) {
    auto child = f.record(id);
    REQUIRE(child.error);
    CHECK(child.error->type == "cancelled");
    CHECK_THAT(child.error->message, Catch::Contains("boss"));  // says why: its parent was cancelled
    CHECK(f.journal->steps(id).size() == 1);                     // the signal never came
  }
}

// ---------------------------------------------------------------- cancel

TEST_CASE("a waiting run is cancelled at once, without a sandbox") {
  fixture f;
  auto run = f.run("idle", plan({op_step("a"), op_signal("go")}));
  REQUIRE(run.status == run_status::waiting);
  CHECK(f.eng->cancel("idle", "not needed any more") == engine::engine::cancel_outcome::cancelled);
  run = f.record("idle");
  CHECK(run.status == run_status::cancelled);
  REQUIRE(run.error);
  CHECK(run.error->type == "cancelled");
  CHECK(run.error->message == "not needed any more");
  CHECK_FALSE(run.wait);
  CHECK(run.finished_at_ms);
  CHECK(run.attempts == 1);
  CHECK(f.events("idle", "run_cancelled").size() == 1);
  run = f.execute("idle");
  CHECK(run.status == run_status::cancelled);
  CHECK(f.events("idle", "attempt_started").size() == 1);
}

TEST_CASE("a run executing a held wait stops by itself when cancelled, well within the grace period") {
  fixture f;
  f.submit("held", plan({op_step("a"), op_signal("go")}));
  auto o = f.options;
  o.suspend_after = 60s;  // held with the sandbox alive
  auto done = f.execute_elsewhere("held", o);
  REQUIRE(eventually([&] { return !f.events("held", "wait_started").empty(); }));
  const auto t0 = steady::now();
  CHECK(f.eng->cancel("held", "stop it") == engine::engine::cancel_outcome::requested);
  REQUIRE(done.wait_for(20s) == std::future_status::ready);
  auto run = done.get();
  const auto took = ms_since(t0);
  CHECK(run.status == run_status::cancelled);
  REQUIRE(run.error);
  CHECK(run.error->type == "cancelled");
  CHECK(run.error->message == "stop it");
  // That the agent stopped by itself, not killed when the grace ran out, is
  // shown where no clock decides it: fake_sandbox_test.cpp counts the kills.
  INFO("the cancel took " << took << " ms");
  CHECK(f.events("held", "cancel_sent").size() == 1);
  CHECK(f.journal->steps("held").size() == 1);
  CHECK(run.attempts == 1);
}

TEST_CASE("a run inside a long step is killed after the cancel grace period") {
  fixture f;
  auto p = engine::parse_policy({{"timeouts", {{"cancel_grace_seconds", 1}}}});
  f.submit("stubborn", plan({op_step("a"), op_slow("s", 60000), op_step("b")}), p);
  auto done = f.execute_elsewhere("stubborn", f.options);
  // Cancelled inside "s": begun (the agent logged it), not yet journaled.
  REQUIRE(eventually([&] {
    return f.executing("stubborn", "slow s attempt 1") == 1 && f.journal->steps("stubborn").size() == 1;
  }));
  CHECK(f.eng->cancel("stubborn", "stop it") == engine::engine::cancel_outcome::requested);
  REQUIRE(done.wait_for(20s) == std::future_status::ready);
  auto run = done.get();
  CHECK(run.status == run_status::cancelled);
  REQUIRE(run.error);
  CHECK(run.error->message == "stop it");
  // That it had its grace period, to the millisecond, is shown on the engine's fake clock (fake_clock_test.cpp).
  // and was killed long before its step would have ended: that step and the next were never journaled
  CHECK(f.journal->steps("stubborn").size() == 1);
  CHECK(f.executed("stubborn", "slow s attempt 1") == 1);
  CHECK(f.executed("stubborn", "step b") == 0);
}

TEST_CASE("cancelling an ended or unknown run is refused and changes nothing") {
  fixture f;
  REQUIRE(f.run("finished", plan({op_step("a")})).status == run_status::completed);
  const auto events_before = f.journal->events("finished").size();
  auto refused = refusal_of([&] { f.eng->cancel("finished", "too late"); });
  CHECK(refused.code == engine::errc::bad_request);
  CHECK_THAT(refused.message, Catch::Contains("already ended"));
  auto run = f.record("finished");
  CHECK(run.status == run_status::completed);
  CHECK_FALSE(run.cancel_requested_at_ms);
  CHECK(f.journal->events("finished").size() == events_before);
  CHECK(refusal_of([&] { f.eng->cancel("nobody", "x"); }).code == engine::errc::not_found);
}

// ---------------------------------------------------------------- step timeouts

TEST_CASE("a step over its timeout is killed and retried, its new sandbox counted against the run's attempts") {
  fixture f;
  auto run =
      f.run("slowpoke", plan({op_slow("s", 60000, 300, 2, true), op_step("after")}), engine::default_policy(), 2);
  REQUIRE(run.status == run_status::completed);
  CHECK(run.output == json({"s", "after"}));
  auto retries = f.events("slowpoke", "step_retry");
  REQUIRE(retries.size() == 1);
  CHECK(retries[0].seq == 0u);
  CHECK(retries[0].data.at("error").at("type") == "timeout");
  auto steps = f.journal->steps("slowpoke");
  REQUIRE(steps.size() == 2);
  CHECK(steps[0].result.ok);
  CHECK(steps[0].result.attempt == 2);
  // What the killed attempt wrote was rolled back to the files before the
  // step; the retry's write is the one kept.
  CHECK(f.executed("slowpoke", "slow s attempt 1") == 0);
  CHECK(f.executed("slowpoke", "slow s attempt 2") == 1);
  CHECK(f.events("slowpoke", "attempt_crashed").size() == 1);
}

TEST_CASE("a step out of attempts after a timeout is journaled failed with type timeout") {
  fixture f;
  const json slow = op_slow("s", 3000, 300, 1);
  SECTION("uncaught, the run fails") {
    auto run = f.run("timeout", plan({slow, op_step("after")}));
    REQUIRE(run.status == run_status::failed);
    REQUIRE(run.error);
    CHECK_THAT(run.error->message, Catch::Contains("timed out"));
    auto steps = f.journal->steps("timeout");
    REQUIRE(steps.size() == 1);
    CHECK_FALSE(steps[0].result.ok);
    CHECK(steps[0].result.error.type == "timeout");
    CHECK(f.executed("timeout", "step after") == 0);
  }
  SECTION("caught, the workflow goes on") {
    auto run = f.run("timeout", plan({slow, op_step("after")}, true));
    REQUIRE(run.status == run_status::completed);
    CHECK_THAT(run.output[0].value("step_failed", ""), Catch::Contains("timed out"));
    CHECK(run.output[1] == "after");
    CHECK(f.journal->steps("timeout").at(0).result.error.type == "timeout");
  }
}

TEST_CASE("the policy's step timeout applies to a step that sets none") {
  fixture f;
  auto p = engine::parse_policy({{"timeouts", {{"step_seconds", 1}}}});
  auto run = f.run("policed", plan({op_slow("s", 60000)}), p);
  REQUIRE(run.status == run_status::failed);
  auto step = f.journal->steps("policed").at(0).result;
  CHECK(step.error.type == "timeout");
  CHECK_THAT(step.error.message, Catch::Contains("1000 ms"));
}

// ---------------------------------------------------------------- run timeouts

TEST_CASE("a run over timeouts.run_seconds fails with type timeout, held or suspended") {
  auto p = engine::parse_policy({{"timeouts", {{"run_seconds", 1}}}});
  SECTION("held: the host stops the agent at the deadline") {
    fixture f(60s);
    auto run = f.run("deadline", plan({op_sleep(50000), op_step("after")}), p);
    REQUIRE(run.status == run_status::failed);
    REQUIRE(run.error);
    CHECK(run.error->type == "timeout");
    CHECK_THAT(run.error->message, Catch::Contains("run_seconds"));
    CHECK(f.journal->steps("deadline").empty());
  }
  SECTION("suspended: executed after the deadline, it fails without a new attempt") {
    fixture f;
    auto run = f.run("deadline", plan({op_sleep(3000), op_step("after")}), p);
    REQUIRE(run.status == run_status::waiting);
    REQUIRE(run.deadline_ms);
    const auto deadline = *run.deadline_ms;
    CHECK(deadline < *run.wait->wake_at_ms);
    REQUIRE(eventually([&] { return storage::now_ms() >= deadline; }));
    run = f.execute("deadline");
    REQUIRE(run.status == run_status::failed);
    REQUIRE(run.error);
    CHECK(run.error->type == "timeout");
    CHECK(run.attempts == 1);
    CHECK(*run.finished_at_ms < f.events("deadline", "timer_set").at(0).data.at("until_ms").get<std::int64_t>());
    CHECK(f.journal->steps("deadline").empty());
    CHECK(f.executed("deadline", "step after") == 0);
  }
}

// ---------------------------------------------------------------- run retries

TEST_CASE("a run that crashes every attempt fails with each attempt's error; executing it again gives fresh attempts") {
  fixture f;
  auto run = f.run("doomed", plan({op_step("a"), op_crash()}), engine::default_policy(), 3);
  REQUIRE(run.status == run_status::failed);
  REQUIRE(run.error);
  CHECK_THAT(run.error->message, Catch::Contains("gave up after 3 crashed attempts"));
  CHECK(run.attempts == 3);
  auto crashes = f.events("doomed", "attempt_crashed");
  REQUIRE(crashes.size() == 3);
  for (std::size_t i = 0; i < crashes.size(); ++i) {
    CHECK(crashes[i].data.at("attempt") == i + 1);
    CHECK_THAT(crashes[i].data.at("error").get<std::string>(), Catch::Contains("SIGABRT"));
    CHECK(crashes[i].data.at("will_retry") == (i < 2));
  }
  CHECK(f.executed("doomed", "step a") == 1);  // replayed by attempts 2 and 3

  // What `cairn resume` does.
  run = f.execute("doomed");
  REQUIRE(run.status == run_status::failed);
  CHECK(run.attempts == 3);  // a fresh set, not 6
  CHECK(f.events("doomed", "run_reset").size() == 1);
  CHECK(f.events("doomed", "attempt_crashed").size() == 6);
  CHECK(f.events("doomed", "attempt_started").size() == 6);
  CHECK(f.executed("doomed", "step a") == 1);
}

TEST_CASE("crashed attempts are retried after the policy's backoff, capped at its max") {
  fixture f(300ms, false);
  auto p = engine::parse_policy({{"retry", {{"initial_ms", 300}, {"multiplier", 3}, {"max_ms", 300}, {"jitter", 0}}}});
  auto run = f.run("backoff", plan({op_crash()}), p, 3);
  REQUIRE(run.status == run_status::failed);
  auto crashes = f.events("backoff", "attempt_crashed");
  auto starts = f.events("backoff", "attempt_started");
  REQUIRE(crashes.size() == 3);
  REQUIRE(starts.size() == 3);
  for (int i = 0; i < 2; ++i) {
    const auto gap = starts[i + 1].at_ms - crashes[i].at_ms;
    CHECK(gap >= 299);
    CHECK(gap < 800);  // without the cap the second gap would be 900 ms
  }
}

// ---------------------------------------------------------------- graceful stop

TEST_CASE("a graceful stop lets the step in flight finish, hands the run back, and nothing reruns") {
  fixture f(60s);  // a wait is held until the stop
  f.submit("handed", plan({op_step("a"), op_slow("s", 1500), op_step("b")}));
  f.submit("patient", plan({op_step("p"), op_signal("go")}));
  running_scheduler sched(f, 2);
  // The stop comes with "s" in flight: begun (the agent logged it), not yet journaled.
  REQUIRE(eventually([&] {
    return f.executing("handed", "slow s attempt 1") == 1 && f.journal->steps("handed").size() == 1 &&
           !f.events("patient", "wait_started").empty();
  }));
  sched.stop();

  auto patient = f.record("patient");
  CHECK(patient.status == run_status::waiting);
  CHECK(patient.owner.empty());
  REQUIRE(patient.wait);
  CHECK(patient.wait->kind == "signal");
  f.eng->signal("patient", "go", "now");
  patient = f.execute("patient");
  CHECK(patient.status == run_status::completed);
  CHECK(patient.output[1] == json({{"signal", "now"}}));
  CHECK(f.executed("patient", "step p") == 1);

  auto run = f.record("handed");
  CHECK(run.status == run_status::pending);
  CHECK(run.owner.empty());
  CHECK(f.events("handed", "run_released").size() == 1);
  auto steps = f.journal->steps("handed");
  REQUIRE(steps.size() == 2);
  CHECK(steps[1].result.name == "s");
  CHECK(steps[1].result.ok);

  run = f.execute("handed");
  REQUIRE(run.status == run_status::completed);
  CHECK(run.output == json({"a", "s", "b"}));
  CHECK(f.executed("handed", "step a") == 1);
  CHECK(f.executed("handed", "slow s attempt 1") == 1);
  CHECK(f.executed("handed", "step b") == 1);
}
