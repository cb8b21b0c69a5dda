// The engine on a fake clock (engine/clock.hpp): leases, suspensions,
// timers and a cancel's grace period tested by moving the clock, not by
// waiting for it. The fake clock moves only where a test moves it, so what
// these tests assert of time is exact (an instant, not a margin), and a
// loaded machine only makes them slower.
#include <catch2/catch.hpp>

#include <chrono>
#include <csignal>
#include <fstream>
#include <future>
#include <iterator>
#include <optional>
#include <thread>

#include "engine/fake_clock.hpp"
#include "engine/engine.hpp"
#include "engine/ledger.hpp"
#include "engine/worker_lease.hpp"
#include "storage/memory/memory_journal.hpp"
#include "tests/support/fake_sandbox.hpp"
#include "tests/temp_dir.hpp"

using namespace cairn;
using namespace std::chrono_literals;
using json = nlohmann::json;
using storage::run_status;

namespace {

// Whether `condition` came true, looked at until it does: the bound is
// real time that only a broken engine reaches, never the fake clock.
template <class F>
bool once(F condition) {
  const auto limit = std::chrono::steady_clock::now() + std::chrono::minutes(2);
  while (!condition() && std::chrono::steady_clock::now() < limit) std::this_thread::sleep_for(2ms);
  return condition();
}

struct host {
  engine::fake_clock clock;
  testing::temp_dir dir;
  std::shared_ptr<testing::fake_backend> fake = std::make_shared<testing::fake_backend>();
  std::unique_ptr<storage::journal> journal = storage::open_journal(dir / "cairn.db");
  std::unique_ptr<storage::journal> reader = storage::open_journal(dir / "cairn.db");
  engine::engine eng{*journal, options()};

  engine::engine_options options() {
    engine::engine_options o;
    o.home = dir / "home";
    o.suspend_after = 2s;
    o.backends = [fake = fake](const std::string&) -> std::shared_ptr<runtime::sandbox_backend> { return fake; };
    return o;
  }

  void submit(const std::string& id, const testing::fake_agent& agent, json policy = json::object()) {
    engine::run_request r;
    r.id = id;
    r.agent = fake->add_agent(dir / "agents", id, agent).string();
    r.workspace = dir / "ws" / id;
    r.sandbox = "fake";
    r.policy = engine::parse_policy(policy);
    eng.submit(r);
  }

  // The first event of `kind` of the run, read on a connection of its own.
  std::optional<storage::event_record> event(const std::string& id, const std::string& kind) {
    for (auto& e : reader->events(id))
      if (e.kind == kind) return e;
    return std::nullopt;
  }
};

}  // namespace

// Runs what the loop has ready once the clock has moved: its timers are
// looked at within a millisecond of real time on a fake clock
// (engine::clock_wait_traits), so a few milliseconds see every one due.
void run_due(boost::asio::io_context& io) {
  io.restart();
  io.run_for(5ms);
}

TEST_CASE("a worker renews its lease every third of it, and hears it lost when paused past it") {
  engine::fake_clock clock;
  storage::memory::database db;
  engine::ledger writes{db.open()};
  auto reader = db.open();
  boost::asio::io_context io;
  int lost = 0;
  std::optional<engine::worker_lease> held;
  auto& lease = held.emplace(writes, io, engine::lease_settings{15s, ""}, [&] { ++lost; }, nullptr);
  const auto registered = clock.wall_ms();
  CHECK(reader->find_worker(lease.id())->lease_expires_at_ms == registered + 15'000);
  run_due(io);  // its renewals start on its loop

  clock.advance(4'999ms);
  run_due(io);
  CHECK(reader->find_worker(lease.id())->lease_expires_at_ms == registered + 15'000);
  clock.advance(1ms);
  run_due(io);  // the renewal's write commits on this thread: the ledger is idle
  CHECK(reader->find_worker(lease.id())->lease_expires_at_ms == registered + 5'000 + 15'000);
  CHECK(lost == 0);

  // Paused (this loop did not run) for longer than the lease: the next
  // renewal finds it expired, says so once, and registers afresh.
  clock.advance(40s);
  run_due(io);
  CHECK(lost == 1);
  CHECK(reader->find_worker(lease.id())->lease_expires_at_ms == clock.wall_ms() + 15'000);

  // A lease stops on its loop (its destructor waits for that), and removes its row.
  const auto id = lease.id();
  io.restart();
  std::thread loop([&] { io.run(); });
  held.reset();
  loop.join();
  CHECK_FALSE(reader->find_worker(id));
}

TEST_CASE("a sleep longer than suspend_after suspends the run at once, until its wake time and not a moment before") {
  host h;
  h.submit("sleeper", [](context& ctx, const json&, const testing::fake_agent_env& env) {
    ctx.step("a", [&] {
      env.append("exec.log", "a");
      return 1;
    });
    ctx.sleep(std::chrono::hours(1));
    ctx.step("b", [&] {
      env.append("exec.log", "b");
      return 2;
    });
    return json("done");
  });
  // The clock does not move: an hour's sleep is suspended without waiting for anything.
  auto run = h.eng.execute("sleeper");
  REQUIRE(run.status == run_status::waiting);
  const auto timer = *h.event("sleeper", "timer_set");
  const auto wake_at = timer.data.at("until_ms").get<std::int64_t>();
  CHECK(wake_at == timer.at_ms + 3'600'000);
  REQUIRE(run.wait);
  CHECK(run.wait->kind == "timer");
  CHECK(run.wait->wake_at_ms == wake_at);
  CHECK(h.event("sleeper", "suspended")->at_ms == timer.at_ms);

  // Never early: a millisecond before its wake time the run is left waiting.
  h.clock.advance(std::chrono::milliseconds(wake_at - h.clock.wall_ms() - 1));
  CHECK_FALSE(engine::wait_is_over(*h.journal, *h.journal->find_run("sleeper")));
  CHECK(h.eng.execute("sleeper").status == run_status::waiting);
  h.clock.advance(1ms);
  CHECK(engine::wait_is_over(*h.journal, *h.journal->find_run("sleeper")));
  run = h.eng.execute("sleeper");
  CHECK(run.status == run_status::completed);
  const auto steps = h.journal->steps("sleeper");
  REQUIRE(steps.size() == 3);
  CHECK(steps[1].result.kind == protocol::step_kind::sleep);
  CHECK(steps[1].finished_at_ms == wake_at);
  // Step a ran once: the resumed agent replayed it.
  std::ifstream log(h.dir / "ws" / "sleeper" / "exec.log");
  std::string all((std::istreambuf_iterator<char>(log)), {});
  CHECK(all == "a\nb\n");
}

TEST_CASE("a wait for a signal keeps its sandbox for suspend_after on the engine's clock, then is suspended") {
  host h;
  h.submit("waiter", [](context& ctx, const json&, const testing::fake_agent_env&) {
    auto got = ctx.wait_signal("go");
    return got ? *got : json(nullptr);
  });
  auto first = std::async(std::launch::async, [&] { return h.eng.execute("waiter"); });
  REQUIRE(once([&] { return h.event("waiter", "wait_started").has_value(); }));
  const auto began = h.event("waiter", "wait_started")->at_ms;
  // The clock moves only here, a tenth of a second at a time, until the run is suspended.
  while (first.wait_for(2ms) != std::future_status::ready) h.clock.advance(100ms);
  auto run = first.get();
  REQUIRE(run.status == run_status::waiting);
  CHECK(run.wait->kind == "signal");
  CHECK(h.event("waiter", "suspended")->at_ms - began >= 2'000);

  engine::engine sender{*h.reader, h.options()};
  sender.signal("waiter", "go", json{{"ok", true}});
  run = h.eng.execute("waiter");
  CHECK(run.status == run_status::completed);
  CHECK(run.output == json{{"ok", true}});
}

TEST_CASE("an agent that ignores a cancel is killed when its grace period ends on the engine's clock, not before") {
  host h;
  h.submit(
      "stubborn",
      [](context& ctx, const json&, const testing::fake_agent_env& env) {
        ctx.step("slow", [&] {
          env.append("began.log", "slow");
          if (env.sleep(std::chrono::minutes(10))) env.crash(SIGKILL);  // killed inside its step
          return 1;
        });
        return json("never");
      },
      {{"timeouts", {{"cancel_grace_seconds", 3}}}});
  auto done = std::async(std::launch::async, [&] { return h.eng.execute("stubborn"); });
  REQUIRE(once([&] { return std::filesystem::exists(h.dir / "ws" / "stubborn" / "began.log"); }));
  // `cairn cancel`: another engine, on a connection of its own (an engine is one thread's).
  engine::engine canceller{*h.reader, h.options()};
  CHECK(canceller.cancel("stubborn", "stop it") == engine::engine::cancel_outcome::requested);
  REQUIRE(once([&] { return h.event("stubborn", "cancel_sent").has_value(); }));
  const auto sent_at = h.event("stubborn", "cancel_sent")->at_ms;

  // Within its grace the agent is left alone, however long the machine takes.
  h.clock.advance(2'999ms);
  h.clock.advance(1ms);
  REQUIRE(once([&] { return done.wait_for(0s) == std::future_status::ready; }));
  const auto run = done.get();
  CHECK(run.status == run_status::cancelled);
  CHECK(h.fake->kills == 1);
  // Killed at the end of its grace, to the millisecond: the clock moved only here.
  REQUIRE(run.finished_at_ms);
  CHECK(*run.finished_at_ms == sent_at + 3'000);
  CHECK(h.journal->steps("stubborn").empty());
}

// The engine's clock moves a tenth of a second at a time until `done` is
// ready: for what a test cannot see the driver begin to time (a step's
// begin, a hold), so its instant is not asserted, only its order.
template <class T>
T advancing(engine::fake_clock& clock, std::future<T>& done) {
  while (done.wait_for(2ms) != std::future_status::ready) clock.advance(100ms);
  return done.get();
}

TEST_CASE("a step over the policy's step timeout is stopped at the timeout on the engine's clock, not at its end") {
  host h;
  h.submit(
      "policed",
      [](context& ctx, const json&, const testing::fake_agent_env& env) {
        return ctx.step("s", [&] {
          if (env.sleep(std::chrono::minutes(10))) env.crash(SIGKILL);  // killed inside its step
          return json("finished");
        });
      },
      {{"timeouts", {{"step_seconds", 1}}}});
  auto done = std::async(std::launch::async, [&] { return h.eng.execute("policed"); });
  const auto started = h.clock.wall_ms();
  const auto run = advancing(h.clock, done);
  REQUIRE(run.status == run_status::failed);
  const auto steps = h.journal->steps("policed");
  REQUIRE(steps.size() == 1);
  CHECK(steps[0].result.error.type == "timeout");
  CHECK_THAT(steps[0].result.error.message, Catch::Contains("1000 ms"));
  CHECK(steps[0].finished_at_ms - started >= 1'000);
  CHECK(h.fake->kills >= 1);  // the agent never finished its step: it was killed in it
}

TEST_CASE("a run over timeouts.run_seconds fails at its deadline on the engine's clock, long before its sleep ends") {
  host h;
  h.submit(
      "deadline",
      [](context& ctx, const json&, const testing::fake_agent_env&) {
        ctx.sleep(std::chrono::milliseconds(1'500));  // held: shorter than suspend_after
        return json("never");
      },
      {{"timeouts", {{"run_seconds", 1}}}});
  auto done = std::async(std::launch::async, [&] { return h.eng.execute("deadline"); });
  const auto run = advancing(h.clock, done);
  REQUIRE(run.status == run_status::failed);
  REQUIRE(run.error);
  CHECK(run.error->type == "timeout");
  CHECK_THAT(run.error->message, Catch::Contains("run_seconds"));
  REQUIRE(run.deadline_ms);
  CHECK(*run.finished_at_ms >= *run.deadline_ms);
  CHECK(h.journal->steps("deadline").empty());  // the sleep never fired
}
