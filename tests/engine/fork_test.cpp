// engine::fork on every journal (SQLite, PostgreSQL, in memory), with fake
// agents: the fork replays the prefix it copied (a signal, a child run and
// plain steps) without running any of it again, goes on with another input,
// joins the child of the run it came from, and is linked to it both ways; a
// fork of the fork too. Each refusal leaves the journal as it was.
#include <catch2/catch.hpp>

#include <mutex>

#include "engine/engine.hpp"
#include "engine/owner.hpp"
#include "tests/support/fake_sandbox.hpp"
#include "tests/support/test_db.hpp"

using namespace cairn;
using json = nlohmann::json;
using storage::run_status;

namespace {

// How many times each step body really ran, in every run of a test.
struct tally {
  std::mutex mutex;
  std::map<std::string, int> ran;
  void count(const std::string& what) {
    std::lock_guard lock(mutex);
    ++ran[what];
  }
  int of(const std::string& what) {
    std::lock_guard lock(mutex);
    return ran[what];
  }
};

struct host {
  explicit host(const std::string& backend) : location(backend) {}
  testing::temp_dir dir;
  testing::journal_location location;
  tally bodies;
  std::shared_ptr<testing::fake_backend> fake = std::make_shared<testing::fake_backend>();
  std::unique_ptr<storage::journal> journal = location.open();
  engine::engine eng{*journal, options()};

  engine::engine_options options() {
    engine::engine_options o;
    o.home = dir / "home";
    o.retry_backoff = std::chrono::milliseconds(10);
    o.suspend_after = std::chrono::milliseconds(0);  // a wait suspends the run at once: execute() returns
    o.ledger = std::make_shared<engine::ledger>(location.open());
    o.backends = [fake = fake](const std::string&) -> std::shared_ptr<runtime::sandbox_backend> { return fake; };
    return o;
  }

  // seq 0 a step, 1 the signal "go", 2 a child run, 3-6 steps, 7 a step that
  // fails when the input says so ("fail"), or a wait for a signal nobody
  // sends ("stuck"), 8 the child joined, 9 a step.
  std::filesystem::path add_agents() {
    fake->add_agent(dir / "agents", "kid", [this](context& ctx, const json&, const testing::fake_agent_env&) {
      return ctx.step("kid", [&] {
        bodies.count("kid");
        return json("kid's answer");
      });
    });
    return fake->add_agent(dir / "agents", "parent", [this](context& ctx, const json& input,
                                                            const testing::fake_agent_env&) {
      auto step = [&](int i) {
        return ctx.step("s" + std::to_string(i), [&] {
          bodies.count("s" + std::to_string(i));
          if (i == 7 && input.value("fail", false)) throw terminal_error("step 7 is broken");
          return json(i);
        });
      };
      step(0);
      const auto go = ctx.wait_signal("go");
      const auto kid = ctx.start_child("kid");
      for (int i = 3; i <= 6; ++i) step(i);
      if (input.value("stuck", false)) ctx.wait_signal("never");
      step(7);
      const auto answer = ctx.join(kid);
      step(9);
      return json{{"go", go ? *go : json()}, {"kid", answer}};
    });
  }

  // Run "orig" of the agents with `input`, its signal "go" sent ahead; returns how it stopped.
  storage::run_record run_orig(const json& input, const json& go) {
    engine::run_request r;
    r.id = "orig";
    r.agent = add_agents();
    r.input = input;
    r.sandbox = "fake";
    eng.submit(r);
    eng.signal("orig", "go", go);
    return eng.execute("orig");
  }

  // What a refusal must leave alone: every run, its steps and its events.
  json snapshot() {
    json out = json::array();
    for (const auto& r : journal->list_runs())
      out.push_back({r.id, storage::to_string(r.status), r.owner, journal->step_count(r.id), journal->events(r.id).size()});
    return out;
  }
};

json steps_of(storage::journal& journal, const std::string& id, std::uint64_t through) {
  json out = json::array();
  for (const auto& s : journal.steps(id))
    if (s.result.seq <= through)
      out.push_back({s.result.seq, s.result.name, protocol::to_string(s.result.kind), s.result.ok, s.result.output});
  return out;
}

}  // namespace

TEST_CASE("a fork replays its prefix without running it again and goes on; a fork of it too") {
  const std::string backend = GENERATE("sqlite", "postgresql", "memory");
  INFO("backend " << backend);
  host h(backend);
  // Stuck at seq 7, not ended: its child is not cancelled, and it finishes.
  REQUIRE(h.run_orig({{"stuck", true}}, {{"n", 1}}).status == run_status::waiting);
  REQUIRE(h.eng.execute("orig.2").status == run_status::completed);
  REQUIRE(h.journal->step_count("orig") == 7);

  auto forked = h.eng.fork({.from = "orig", .seq = 6, .id = "fixed", .input = json{{"stuck", false}}});
  CHECK(forked.workspace_restored);  // from the checkpoints of "orig" (its baseline at least)
  CHECK(forked.run.status == run_status::pending);
  CHECK(forked.run.owner == engine::current_owner().str());
  CHECK(forked.run.agent == h.journal->find_run("orig")->agent);
  CHECK(forked.run.policy == h.journal->find_run("orig")->policy);
  CHECK(forked.run.parent_id.empty());  // a fork is no child
  CHECK(steps_of(*h.journal, "fixed", 99) == steps_of(*h.journal, "orig", 6));
  // The events at the copied steps came along (the signal's), none after.
  for (const auto& e : h.journal->events("fixed")) CHECK((!e.seq || *e.seq <= 6));
  CHECK(engine::forked_from(*h.journal, "fixed") == engine::fork_link{"orig", 6});
  CHECK(engine::forks_of(*h.journal, "orig") == std::vector<engine::fork_link>{{"fixed", 6}});
  CHECK_FALSE(engine::forked_from(*h.journal, "orig"));

  const auto done = h.eng.execute("fixed");
  REQUIRE(done.status == run_status::completed);
  CHECK(done.output == json{{"go", {{"n", 1}}}, {"kid", "kid's answer"}});
  for (const char* once : {"s0", "s3", "s4", "s5", "s6", "s9", "kid"}) {
    INFO(once);
    CHECK(h.bodies.of(once) == 1);
  }
  CHECK(h.bodies.of("s7") == 1);  // the fork's
  CHECK(h.journal->find_run("orig")->status == run_status::waiting);  // left as it was
  CHECK(h.journal->children("fixed").empty());  // its child step found orig's child, started no other
  CHECK_FALSE(h.journal->find_run("fixed.2"));
  CHECK(h.journal->signals("fixed").empty());  // the signal reached it as its journaled step

  auto again = h.eng.fork({.from = "fixed", .seq = 8, .id = "fixed-again", .hold = false});
  CHECK(again.run.owner.empty());
  CHECK(again.run.input == json{{"stuck", false}});  // the fork's own input
  CHECK(engine::forked_from(*h.journal, "fixed-again") == engine::fork_link{"fixed", 8});
  CHECK(engine::forks_of(*h.journal, "fixed") == std::vector<engine::fork_link>{{"fixed-again", 8}});
  CHECK(h.eng.execute("fixed-again").output == done.output);
  CHECK(h.bodies.of("s7") == 1);
  CHECK(h.bodies.of("s9") == 2);
}

TEST_CASE("a fork that cannot be made is refused, and the journal stays as it was") {
  const std::string backend = GENERATE("sqlite", "postgresql", "memory");
  INFO("backend " << backend);
  host h(backend);
  REQUIRE(h.run_orig({{"fail", true}}, json::object()).status == run_status::failed);
  const auto before = h.snapshot();

  const auto refused = [&](engine::fork_request request, engine::errc code, const std::string& says) {
    INFO(says);
    try {
      h.eng.fork(request);
      FAIL("the fork was made");
    } catch (const engine::engine_error& e) {
      CHECK(e.code() == code);
      CHECK_THAT(e.what(), Catch::Contains(says));
    }
    CHECK(h.snapshot() == before);
  };
  refused({.from = "nope", .seq = 0}, engine::errc::not_found, "no run 'nope'");
  refused({.from = "orig", .seq = 8}, engine::errc::bad_request, "run orig has no step 8: its journal ends at step 7");
  refused({.from = "orig", .seq = 3, .id = "orig"}, engine::errc::bad_request, "run orig exists already");
  refused({.from = "orig", .seq = 3, .id = "orig.2"}, engine::errc::bad_request, "run orig.2 exists already");
  refused({.from = "orig", .seq = 3, .id = "../up"}, engine::errc::bad_request, "is not a valid run id");
  refused({.from = "orig", .seq = 3, .agent = h.dir / "missing"}, engine::errc::bad_request, "--agent: no program");

  // An at-most-once call started at the next step and never recorded.
  h.eng.reopen("orig");
  engine::ledger(h.location.open())
      .apply("orig", {engine::effects::tool_started{8, "email.send", "at_most_once", json::object()}});
  const auto with_doubt = h.snapshot();
  try {
    h.eng.fork({.from = "orig", .seq = 8});
    FAIL("the fork was made");
  } catch (const engine::engine_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("step 8 of run orig is a call of tool 'email.send' in doubt: settle it "
                                         "first: cairn settle orig 8"));
  }
  CHECK(h.snapshot() == with_doubt);
  // Before it, the prefix is settled: a fork may go on from there.
  CHECK(h.eng.fork({.from = "orig", .seq = 7, .id = "before-doubt"}).run.status == run_status::pending);
}
