// The host decides attempts and time, and never blocks on an agent: attacks
// on the restart budget, on timer arithmetic, on the host's send, and on the
// size of a run tree, each mounted by an agent as it would be.
#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include <catch2/catch.hpp>

#include "engine/engine.hpp"
#include "engine/scheduler.hpp"
#include "storage/journal.hpp"
#include "tests/cairn_cli.hpp"
#include "tests/host/engine_host.hpp"
#include "tests/temp_dir.hpp"

using namespace cairn;
using namespace std::chrono_literals;
using json = nlohmann::json;
using storage::run_status;
using steady = std::chrono::steady_clock;

namespace {

bool ended(run_status s) {
  return s == run_status::completed || s == run_status::failed || s == run_status::cancelled;
}

double seconds_since(steady::time_point t0) {
  return std::chrono::duration<double>(steady::now() - t0).count();
}

struct host : testing::engine_host {
  host() : engine_host(500ms) {}

  std::optional<json> event(const std::string& id, const std::string& kind) {
    for (const auto& e : journal->events(id))
      if (e.kind == kind) return e.data;
    return std::nullopt;
  }
  storage::run_record record(const std::string& id) { return *journal->find_run(id); }

  // Runs the scheduler (`slots` at once) until every run in `ids` has ended or `limit` passed.
  void schedule(const std::vector<std::string>& ids, int slots, std::chrono::seconds limit) {
    engine::scheduler_options o;
    o.db = dir / "cairn.db";
    o.engine = options;
    o.max_concurrent = slots;
    o.idle_check = 50ms;  // done() has a time limit of its own
    engine::scheduler sched(o);
    engine::stop_flag stop;
    const auto deadline = steady::now() + limit;
    sched.run(
        [&](storage::journal& j) {
          if (steady::now() > deadline) return true;
          for (const auto& id : ids)
            if (auto r = j.find_run(id); !r || !ended(r->status)) return false;
          return true;
        },
        stop);
  }

  // Executes the run on another thread, with its own journal and engine.
  std::future<storage::run_record> execute_elsewhere(const std::string& id) {
    return std::async(std::launch::async, [db = dir / "cairn.db", o = options, id] {
      auto j = storage::open_journal(db);
      engine::engine e(*j, o);
      return e.execute(id);
    });
  }
};

}  // namespace

// ---------------------------------------------------------------- the host decides attempts

TEST_CASE("a step that times out forever restarts its sandbox no more than --max-attempts, while another run goes on") {
  host h;
  const json policy = {{"limits", {{"wall_seconds", 5}}}};
  const int max_attempts = GENERATE(1, 3);
  SECTION("the C++ SDK, a 50 ms step timeout and a retry_policy of a million attempts") {
    h.submit("attack", ATTEMPTS_RESTART_AGENT_PATH, json::object(), policy, max_attempts);
  }
  SECTION("a raw agent that claims attempt 1 of 1,000,000 in every begin") {
    h.submit("attack", ATTEMPTS_LIAR_AGENT_PATH, {{"attack", "timeout_loop"}}, policy, max_attempts);
  }
  h.submit("honest", STEP_AGENT, {{"steps", 3}});
  const auto t0 = steady::now();
  h.schedule({"attack", "honest"}, 2, 60s);
  CHECK(seconds_since(t0) < 30);
  auto attack = h.record("attack");
  REQUIRE(attack.status == run_status::failed);
  CHECK_THAT(attack.error->message, Catch::Contains("timed out"));
  CHECK(h.count("attack", "attempt_started") == max_attempts);  // sandbox starts
  CHECK(h.record("honest").status == run_status::completed);
}

TEST_CASE("limits.run_wall_seconds ends a run across all its attempts, limit_exceeded, naming the key") {
  host h;
  h.submit("attack", ATTEMPTS_LIAR_AGENT_PATH, {{"attack", "timeout_loop"}},
           {{"limits", {{"run_wall_seconds", 3}, {"wall_seconds", 60}}}}, 1000);
  const auto t0 = steady::now();
  auto run = h.eng->execute("attack");
  CHECK(seconds_since(t0) < 20);
  REQUIRE(run.status == run_status::failed);
  CHECK(run.error->type == "limit_exceeded");
  CHECK_THAT(run.error->message, Catch::Contains("limits.run_wall_seconds"));
  CHECK(run.attempts < 1000);
}

TEST_CASE("the host counts a step's failed attempts: a liar's retries end at retry.step_attempts, the step failed") {
  host h;
  h.submit("liar", ATTEMPTS_LIAR_AGENT_PATH, {{"attack", "retry_loop"}}, {{"retry", {{"step_attempts", 3}}}}, 3);
  const auto t0 = steady::now();
  auto run = h.eng->execute("liar");
  CHECK(seconds_since(t0) < 30);
  REQUIRE(run.status == run_status::completed);  // the host acknowledged the third failure as final
  CHECK(run.output == "acked");
  CHECK(h.count("liar", "step_retry") == 2);
  auto steps = h.journal->steps("liar");
  REQUIRE(steps.size() == 1);
  CHECK_FALSE(steps[0].result.ok);
  CHECK(steps[0].result.error.message == "again");
  CHECK(steps[0].result.attempt == 3);  // the host's count, not the agent's "attempt 1"
  CHECK(run.attempts == 1);
}

TEST_CASE("a retry_policy asking for more attempts than retry.step_attempts gets the policy's number") {
  host h;
  h.submit("capped", ATTEMPTS_RESTART_AGENT_PATH, json::object(), {{"retry", {{"step_attempts", 2}}}}, 10);
  auto run = h.eng->execute("capped");
  REQUIRE(run.status == run_status::failed);
  CHECK(h.count("capped", "step_retry") == 1);
  REQUIRE(h.journal->steps("capped").size() == 1);
  CHECK(h.journal->steps("capped")[0].result.error.type == "timeout");
  CHECK(run.attempts == 3);  // two timeouts, then the failed step replayed
}

// ---------------------------------------------------------------- time saturates

TEST_CASE("a duration beyond 100 years from a raw agent is a protocol violation, and no timer goes negative") {
  host h;
  const std::string attack = GENERATE("sleep_max", "sleep_until_far", "wait_max", "begin_1e13");
  h.submit("overflow", ATTEMPTS_LIAR_AGENT_PATH, {{"attack", attack}});
  const auto t0 = steady::now();
  auto run = h.eng->execute("overflow");
  CHECK(seconds_since(t0) < 20);
  REQUIRE(run.status == run_status::failed);
  CHECK(run.error->type == "protocol");
  CHECK_THAT(run.error->message, Catch::Contains("100 years"));
  CHECK(h.count("overflow", "timer_set") == 0);
  CHECK(h.count("overflow", "wait_started") == 0);
  CHECK(h.journal->steps("overflow").empty());
}

TEST_CASE("through the C++ SDK, milliseconds::max() waits as long as it can instead of not at all") {
  host h;
  SECTION("wait_signal(name, milliseconds::max()) waits without a timeout") {
    h.submit("wait", ATTEMPTS_OVERFLOW_AGENT_PATH, {{"use", "wait_max"}});
    auto run = h.eng->execute("wait");
    REQUIRE(run.status == run_status::waiting);
    CHECK_FALSE(run.wait->wake_at_ms);
    REQUIRE(h.event("wait", "wait_started"));
    CHECK(h.event("wait", "wait_started")->at("deadline_ms").is_null());
    h.eng->signal("wait", "go", "hi");
    CHECK(h.eng->execute("wait").output == "hi");
  }
  SECTION("sleep(milliseconds::max()) sleeps 100 years") {
    h.submit("sleep", ATTEMPTS_OVERFLOW_AGENT_PATH, {{"use", "sleep_max"}});
    auto run = h.eng->execute("sleep");
    REQUIRE(run.status == run_status::waiting);
    const auto until = h.event("sleep", "timer_set")->at("until_ms").get<std::int64_t>();
    CHECK(until > storage::now_ms() + 99ll * 365 * 24 * 3600 * 1000);
    CHECK(run.wait->wake_at_ms == until);
  }
  SECTION("a step timeout of 1e13 ms does not kill a 1.5 s step") {
    h.submit("step", ATTEMPTS_OVERFLOW_AGENT_PATH, {{"use", "step_1e13"}});
    auto run = h.eng->execute("step");
    REQUIRE(run.status == run_status::completed);
    CHECK(run.output == "finished");
    CHECK(h.count("step", "step_retry") == 0);
    CHECK(run.attempts == 1);
  }
}

// ---------------------------------------------------------------- the host never blocks on the agent

TEST_CASE("an agent reading its start frame 64 KiB every 4 s is killed within the wall limit or the cancel grace") {
  host h;
  const json input = {{"pad", std::string(4u << 20, 'x')}};  // a 4 MiB start frame: 256 s at that pace
  auto reads = [&] { return testing::slurp(h.options.home / "logs" / "slow.log").size(); };
  SECTION("cancelled: dead within the grace period") {
    h.submit("slow", ATTEMPTS_SLOW_READER_AGENT_PATH, input,
             {{"limits", {{"wall_seconds", 600}}}, {"timeouts", {{"cancel_grace_seconds", 2}}}});
    auto done = h.execute_elsewhere("slow");
    const auto begun = steady::now();
    while (reads() == 0 && seconds_since(begun) < 30) std::this_thread::sleep_for(50ms);
    REQUIRE(reads() > 0);
    const auto t0 = steady::now();
    auto cancel = testing::run_program(CAIRN_BIN, {"--db", (h.dir / "cairn.db").string(), "cancel", "slow", "--no-wait"},
                                       h.dir.path());
    REQUIRE(cancel.code == 0);
    REQUIRE(done.wait_for(120s) == std::future_status::ready);
    const double took = seconds_since(t0);
    CHECK(took < 2 + 60);  // the grace, and slack for a loaded machine; unbounded, 256 s
    CHECK(done.get().status == run_status::cancelled);
    const auto after = reads();
    std::this_thread::sleep_for(4500ms);
    CHECK(reads() == after);  // nothing reads any more
  }
  SECTION("not cancelled: dead at wall_seconds") {
    h.submit("slow", ATTEMPTS_SLOW_READER_AGENT_PATH, input, {{"limits", {{"wall_seconds", 3}}}});
    const auto t0 = steady::now();
    auto done = h.execute_elsewhere("slow");
    REQUIRE(done.wait_for(120s) == std::future_status::ready);
    CHECK(seconds_since(t0) < 3 + 60);  // unbounded, 256 s
    auto run = done.get();
    REQUIRE(run.status == run_status::failed);
    CHECK(run.error->type == "limit_exceeded");
    CHECK_THAT(run.error->message, Catch::Contains("wall_seconds"));
  }
}

// ---------------------------------------------------------------- children are bounded

TEST_CASE("children.max bounds the whole run tree and children.max_depth its depth; refusals are journaled") {
  host h;
  SECTION("children.max=2, max_depth=3, two children each: three runs in all") {
    h.submit("root", ATTEMPTS_FANOUT_AGENT_PATH, {{"width", 2}}, {{"children", {{"max", 2}, {"max_depth", 3}}}});
    h.schedule({"root"}, 4, 90s);
    CHECK(h.journal->list_runs().size() <= 3);
    REQUIRE(h.record("root").status == run_status::completed);
    int refused = 0;
    for (const auto& run : h.journal->list_runs())
      for (const auto& s : h.journal->steps(run.id))
        if (s.result.kind == protocol::step_kind::child && !s.result.ok) {
          CHECK(s.result.error.type == "refused");
          CHECK_THAT(s.result.error.message, Catch::Contains("children.max"));
          ++refused;
        }
    CHECK(refused == 4);  // each of the two children tried two of its own
  }
  SECTION("children.max_depth=2, one child each: root, child, grandchild") {
    h.submit("root", ATTEMPTS_FANOUT_AGENT_PATH, {{"width", 1}}, {{"children", {{"max_depth", 2}}}});
    h.schedule({"root"}, 4, 90s);
    REQUIRE(h.journal->list_runs().size() == 3);
    REQUIRE(h.record("root").status == run_status::completed);
    auto last = h.journal->steps("root.0.0");
    REQUIRE(last.size() >= 1);
    CHECK_FALSE(last[0].result.ok);
    CHECK(last[0].result.error.type == "refused");
    CHECK_THAT(last[0].result.error.message, Catch::Contains("children.max_depth"));
  }
}
