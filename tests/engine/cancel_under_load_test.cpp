// A cancel reaches its sandbox while slow tool calls hold their threads
// (issue 41, "an event loop that never blocks"): the kill after the grace
// period runs on threads tool calls never take (engine/io.hpp). Asserted by
// what happened, not by how long it took: the time is reported only.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "engine/engine.hpp"
#include "engine/scheduler.hpp"
#include "tests/temp_dir.hpp"

using namespace cairn;
using namespace std::chrono_literals;
using json = nlohmann::json;
using storage::run_status;
using steady = std::chrono::steady_clock;

namespace {

constexpr int callers = 16;
constexpr auto call_length = 30s;  // the tool's timeout ends each call: a slow model's answer

template <class F>
bool eventually(F condition, std::chrono::milliseconds limit) {
  const auto until = steady::now() + limit;
  while (!condition()) {
    if (steady::now() > until) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

}  // namespace

TEST_CASE("a cancel kills its sandbox while 16 tool calls of 30 s are in flight and none of them ends") {
  testing::temp_dir dir;
  const auto calls_log = dir / "calls.log";
  setenv("CAIRN_TEST_TOOL_LOG", calls_log.c_str(), 1);
  auto journal = storage::open_journal(dir / "cairn.db");
  engine::engine_options options;
  options.home = dir / "home";
  engine::engine eng(*journal, options);

  // Each caller asks once for a "model" that never answers: the call ends at its timeout.
  const auto model = engine::parse_policy(
      {{"tools",
        {{"model",
          {{"command", {RECORD_TOOL}},
           {"input", {{"to", "string"}, {"mode?", "string"}}},
           {"idempotency", "idempotent"},
           {"timeout_ms", std::chrono::milliseconds(call_length).count()},
           {"env", {"CAIRN_TEST_TOOL_LOG"}}}}}}});
  for (int i = 0; i < callers; ++i) {
    engine::run_request r;
    r.id = "caller-" + std::to_string(i);
    r.agent = TOOL_AGENT;
    r.input = {{"calls", {{{"tool", "model"}, {"args", {{"to", "x"}, {"mode", "hang"}}}}}}};
    r.workspace = dir / "ws" / r.id;
    r.policy = model;
    REQUIRE(eng.submit(r).second);
  }
  // The run to cancel is inside a long step, deaf to the cancel: only the kill ends it.
  const auto grace = 1s;
  engine::run_request stubborn;
  stubborn.id = "stubborn";
  stubborn.agent = WAIT_AGENT;
  stubborn.input = {{"plan", {{{"op", "slow"}, {"name", "s"}, {"ms", 600'000}}}}, {"catch", false}};
  stubborn.workspace = dir / "ws" / "stubborn";
  stubborn.policy = engine::parse_policy({{"timeouts", {{"cancel_grace_seconds", grace.count()}}}});
  REQUIRE(eng.submit(stubborn).second);

  engine::scheduler_options so;
  so.db = dir / "cairn.db";
  so.engine = options;
  so.max_concurrent = callers + 1;
  engine::scheduler sched(so);
  engine::stop_flag stop;
  std::thread scheduling([&] { sched.run({}, stop); });

  auto calls_made = [&] {
    std::ifstream in(calls_log);
    int n = 0;
    for (std::string line; std::getline(in, line);) ++n;
    return n;
  };
  auto stubborn_in_step = [&] {
    std::ifstream in(dir / "ws" / "stubborn" / "exec.log");
    for (std::string line; std::getline(in, line);)
      if (line == "slow s attempt 1") return true;
    return false;
  };
  // Every caller is in its call (a call stuck behind others would show as missing here).
  eventually([&] { return calls_made() == callers && stubborn_in_step(); }, 20s);
  CHECK(calls_made() == callers);
  REQUIRE(stubborn_in_step());

  const auto t0 = steady::now();
  CHECK(eng.cancel("stubborn", "stop it") == engine::engine::cancel_outcome::requested);
  // Cancelled is written once the sandbox was killed and taken down.
  REQUIRE(eventually([&] { return journal->find_run("stubborn")->status == run_status::cancelled; }, 120s));
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(steady::now() - t0);
  // Whatever the machine's load: the kill did not wait for a call to end,
  // every caller is still in its call, none of them journaled.
  int callers_done = 0;
  for (int i = 0; i < callers; ++i) callers_done += journal->steps("caller-" + std::to_string(i)).size() > 1;
  INFO("the cancel took " << took.count() << " ms");
  CHECK(callers_done == 0);
  CHECK(took < call_length);

  stop.raise();  // the callers are handed back once their calls end
  scheduling.join();
  unsetenv("CAIRN_TEST_TOOL_LOG");
}
