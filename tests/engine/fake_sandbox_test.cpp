// The fake sandbox backend (tests/support/fake_sandbox.hpp) held to the real
// thing: the same runs, once of the real step_agent as a process (--sandbox
// none) and once of its workflow as a fake agent in this process, leave the
// same journal: the same steps with the same attempts, the same events in
// the same order, the same end. Then what only the fake can show without
// the machine's clock: a kill that lands inside a step.
#include <catch2/catch.hpp>

#include <csignal>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include "engine/engine.hpp"
#include "tests/support/fake_sandbox.hpp"
#include "tests/temp_dir.hpp"

using namespace cairn;
using json = nlohmann::json;
using storage::run_status;

namespace {

// tests/agents/step_agent.cpp's workflow (steps, fail_first, crash_at,
// terminal_at, sleep_ms), as a fake agent: its files through env.
json step_workflow(context& ctx, const json& input, const testing::fake_agent_env& env) {
  const int steps = input.value("steps", 5);
  const int crash_at = input.value("crash_at", -1);
  const int terminal_at = input.value("terminal_at", -1);
  const int sleep_ms = input.value("sleep_ms", 0);
  const json fail_first = input.value("fail_first", json::object());
  std::mt19937_64 nonces(std::random_device{}());
  json outputs = json::array();
  for (int i = 0; i < steps; ++i) {
    int tries = 0;
    auto body = [&] {
      ++tries;
      env.append("began.log", std::to_string(i));
      if (sleep_ms > 0 && env.sleep(std::chrono::milliseconds(sleep_ms))) env.crash(SIGKILL);  // killed inside
      const auto nonce = std::to_string(nonces());
      env.append("exec.log", std::to_string(i) + " " + nonce + " attempt " + std::to_string(ctx.attempt()));
      if (i == crash_at && ctx.attempt() == 1) env.crash(SIGABRT);
      if (i == terminal_at) throw terminal_error("step " + std::to_string(i) + " cannot succeed");
      if (fail_first.contains(std::to_string(i)) && tries <= fail_first[std::to_string(i)].get<int>())
        throw std::runtime_error("transient failure " + std::to_string(tries));
      return json{{"i", i}, {"nonce", nonce}};
    };
    retry_policy policy;
    policy.max_attempts = 4;
    policy.initial_delay = std::chrono::milliseconds(10);
    outputs.push_back(ctx.step("step " + std::to_string(i), body, policy));
  }
  return json{{"steps", outputs.size()}, {"outputs", outputs}};
}

// Whether `condition` came true: looked at until it does, within a bound
// that only a broken run reaches (what happens, not a clock, decides the test).
template <class F>
bool once(F condition) {
  const auto limit = std::chrono::steady_clock::now() + std::chrono::minutes(2);
  while (!condition() && std::chrono::steady_clock::now() < limit) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return condition();
}

struct host {
  testing::temp_dir dir;
  std::shared_ptr<testing::fake_backend> fake = std::make_shared<testing::fake_backend>();
  std::filesystem::path fake_agent = fake->add_agent(dir / "agents", "step_agent", step_workflow);
  std::unique_ptr<storage::journal> journal = storage::open_journal(dir / "cairn.db");
  engine::engine eng{*journal, options()};

  engine::engine_options options() {
    engine::engine_options o;
    o.home = dir / "home";
    o.retry_backoff = std::chrono::milliseconds(10);
    o.allow.sandbox_none = true;
    o.backends = [fake = fake, real = engine::default_backends()](const std::string& name)
        -> std::shared_ptr<runtime::sandbox_backend> { return name == "fake" ? fake : real(name); };
    return o;
  }

  void submit(const std::string& id, const json& input, bool on_fake, json policy = json::object()) {
    engine::run_request r;
    r.id = id;
    r.agent = on_fake ? fake_agent.string() : std::string(STEP_AGENT);
    r.input = input;
    r.workspace = dir / "ws" / id;
    r.sandbox = on_fake ? "fake" : "none";
    r.policy = engine::parse_policy(policy);
    eng.submit(r);
  }

  storage::run_record run(const std::string& id, const json& input, bool on_fake) {
    submit(id, input, on_fake);
    return eng.execute(id);
  }

  std::map<int, int> executions(const std::string& id) {
    std::map<int, int> count;
    std::ifstream in(dir / "ws" / id / "exec.log");
    for (std::string line; std::getline(in, line);) ++count[std::stoi(line)];
    return count;
  }

  // The journal of a run as a user compares it: each step (name, kind, ok,
  // attempt, error type) and each event's kind, in order; what the backends
  // may say differently (their warnings, a crash's log) left out.
  json shape(const std::string& id) {
    json out = {{"steps", json::array()}, {"events", json::array()}};
    for (const auto& s : journal->steps(id))
      out["steps"].push_back({s.result.name, protocol::to_string(s.result.kind), s.result.ok, s.result.attempt,
                              s.result.ok ? "" : s.result.error.type});
    for (const auto& e : journal->events(id))
      if (e.kind != "sandbox_warning") out["events"].push_back(e.kind);
    const auto run = *journal->find_run(id);
    out["status"] = storage::to_string(run.status);
    out["attempts"] = run.attempts;
    out["error_type"] = run.error ? run.error->type : "";
    return out;
  }
};

}  // namespace

TEST_CASE("the fake backend's runs leave the journal a real agent's leave") {
  const std::vector<std::pair<std::string, json>> scenarios = {
      {"plain", {{"steps", 4}}},
      {"retried", {{"steps", 4}, {"fail_first", {{"1", 2}}}}},
      {"terminal", {{"steps", 4}, {"terminal_at", 2}}},
      {"crashed", {{"steps", 4}, {"crash_at", 2}}},
  };
  for (const auto& [name, input] : scenarios) {
    INFO("scenario " << name << ": " << input.dump());
    host h;
    const auto real = h.run("real", input, false);
    const auto fake = h.run("fake", input, true);
    CHECK(fake.status == real.status);
    CHECK(h.shape("fake") == h.shape("real"));
    CHECK(h.executions("fake") == h.executions("real"));
    if (real.status == run_status::completed) CHECK(fake.output["steps"] == real.output["steps"]);
  }
}

TEST_CASE("on the fake backend, a cancel of a run inside a long step kills it after the grace period, and the "
          "step is never journaled") {
  host h;
  h.submit("long", {{"steps", 3}, {"sleep_ms", 3'600'000}}, true, {{"timeouts", {{"cancel_grace_seconds", 1}}}});
  std::thread executing([&] { h.eng.execute("long"); });
  // Inside step 0 (its body began) before the cancel: no clock decides it.
  auto began = [&] {
    std::ifstream log(h.dir / "ws" / "long" / "began.log");
    std::string line;
    return static_cast<bool>(std::getline(log, line));
  };
  REQUIRE(once(began));
  CHECK(h.eng.cancel("long", "enough") == engine::engine::cancel_outcome::requested);
  executing.join();
  const auto run = *h.journal->find_run("long");
  CHECK(run.status == run_status::cancelled);
  CHECK(run.error->message == "enough");
  CHECK(h.journal->steps("long").empty());
  CHECK(h.fake->kills == 1);
  CHECK(h.fake->agents == 1);
  CHECK(h.executions("long").empty());
}

TEST_CASE("on the fake backend, a run waiting for a signal in its sandbox stops by itself when cancelled: never "
          "killed") {
  host h;
  const auto waiter = h.fake->add_agent(h.dir / "agents", "waiter", [](context& ctx, const json&, const auto&) {
    ctx.step("a", [] { return json(1); });
    return ctx.wait_signal("go").value_or(json());
  });
  engine::run_request r;
  r.id = "held";
  r.agent = waiter.string();
  r.workspace = h.dir / "ws" / "held";
  r.sandbox = "fake";
  h.eng.submit(r);
  auto o = h.options();
  o.suspend_after = std::chrono::hours(1);  // held with its sandbox alive
  engine::engine held_here(*h.journal, o);
  std::thread executing([&] { held_here.execute("held"); });
  auto waiting = [&] {
    for (const auto& e : h.journal->events("held"))
      if (e.kind == "wait_started") return true;
    return false;
  };
  REQUIRE(once(waiting));
  CHECK(h.eng.cancel("held", "stop it") == engine::engine::cancel_outcome::requested);
  executing.join();
  const auto run = *h.journal->find_run("held");
  CHECK(run.status == run_status::cancelled);
  CHECK(run.error->message == "stop it");
  // The default grace is 10 s: the agent heard the cancel and ended; nothing was killed.
  CHECK(h.fake->kills == 0);
  CHECK(h.journal->steps("held").size() == 1);
}
