// A broken or hostile agent fails its own run with a message naming what was
// wrong; the host, the journal and other runs go on.
#include <catch2/catch.hpp>

#include <future>
#include <thread>

#include "engine/engine.hpp"
#include "tests/temp_dir.hpp"

using namespace cairn;

namespace {

struct hostile_case {
  const char* mode;
  const char* message;       // expected in the run's error
  std::size_t steps_kept;    // journaled steps that must survive
};

engine::engine_options options_in(const testing::temp_dir& dir) {
  engine::engine_options options;
  options.home = dir / "home";
  // Long enough for any agent started on a loaded machine; the silent one sleeps 60 s.
  options.hello_timeout = std::chrono::seconds(5);
  options.retry_backoff = std::chrono::milliseconds(1);
  return options;
}

// Submits run `id` of `agent` with its workspace in `dir`; returns its outcome.
storage::run_record run_to_end(engine::engine& eng, const testing::temp_dir& dir, const std::string& id,
                               const char* agent, engine::json input = engine::json::object()) {
  engine::run_request r;
  r.id = id;
  r.agent = agent;
  r.input = std::move(input);
  r.workspace = dir / "ws" / id;
  r.max_attempts = 2;
  eng.submit(r);
  return eng.execute(id);
}

}  // namespace

TEST_CASE("hostile agents fail their run and leave the journal and other runs intact") {
  testing::temp_dir dir;
  auto journal = storage::open_journal(dir / "cairn.db");
  engine::engine eng(*journal, options_in(dir));

  const hostile_case cases[] = {
      {"garbage", "length prefix", 0},
      {"huge_length", "exceeds the limit", 0},
      {"no_hello", "first message must be hello", 0},
      {"bad_version", "protocol v99", 0},
      {"invalid_json", "not valid JSON", 0},
      {"wrong_type", "field 'seq' must be an integer", 0},
      {"unknown_type", "unknown message type 'teleport'", 0},
      {"dup_seq", "step for seq 0, which is already journaled", 1},
      {"skip_seq", "step for seq 5 skips ahead (next is 1)", 1},
      {"after_done", "sent a frame after done", 1},
      {"false_patch", "a patch marker that is not status ok with output true", 0},
      {"patch_begin", "a begin of kind patch", 0},
      {"silent", "did not say hello", 0},
      {"deep_output", "output of step 0 nests deeper than 125 levels", 0},
      {"truncated", "in the middle of a frame", 0},
  };
  for (const auto& c : cases) {
    DYNAMIC_SECTION(c.mode) {
      const std::string id = std::string(c.mode) + ".1";
      auto run = run_to_end(eng, dir, id, HOSTILE_AGENT);
      REQUIRE(run.status == storage::run_status::failed);
      REQUIRE(run.error);
      CHECK_THAT(run.error->message, Catch::Contains(c.message));
      CHECK(journal->steps(id).size() == c.steps_kept);

      // The host goes on: a well-behaved run in the same journal completes.
      CHECK(run_to_end(eng, dir, std::string("good-after-") + c.mode, STEP_AGENT, {{"steps", 2}}).status ==
            storage::run_status::completed);
    }
  }
}

TEST_CASE("forged and foreign messages fail only their own run, journal nothing, and another run goes on meanwhile") {
  testing::temp_dir dir;
  auto journal = storage::open_journal(dir / "cairn.db");
  engine::engine eng(*journal, options_in(dir));

  const hostile_case cases[] = {
      {"forged_tool_step", "a step of kind tool: only the host records those", 0},
      {"forged_signal_begin", "a begin of kind signal", 0},
      {"second_hello", "a second hello", 0},
      {"deep_nesting", "nests deeper than 128 levels", 0},
      {"foreign_join", "which is not a child of run foreign_join.1", 0},
  };
  for (const auto& c : cases) {
    DYNAMIC_SECTION(c.mode) {
      // Another run, on its own thread with its own journal object on the same
      // database, is in the middle of its steps when the hostile one fails.
      const std::string good_id = std::string("neighbour-of-") + c.mode;
      constexpr int good_steps = 100;  // 5 s at least: longer than the hostile run takes to fail
      std::promise<storage::run_record> good_outcome;
      std::thread neighbour([&] {
        try {
          auto own = storage::open_journal(dir / "cairn.db");
          engine::engine other(*own, options_in(dir));
          good_outcome.set_value(
              run_to_end(other, dir, good_id, STEP_AGENT, {{"steps", good_steps}, {"sleep_ms", 50}}));
        } catch (...) {
          good_outcome.set_exception(std::current_exception());
        }
      });
      auto good_outcome_ready = good_outcome.get_future();
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (journal->step_count(good_id) == 0 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));

      const std::string id = std::string(c.mode) + ".1";
      // foreign_join joins the neighbour, which is no child of it.
      auto run = run_to_end(eng, dir, id, HOSTILE_AGENT, {{"join", good_id}});
      const auto good_steps_meanwhile = journal->step_count(good_id);

      auto good = good_outcome_ready.get();
      neighbour.join();
      REQUIRE(run.status == storage::run_status::failed);
      REQUIRE(run.error);
      CHECK_THAT(run.error->message, Catch::Contains(c.message));
      // Nothing of the hostile message was journaled: no step, no event at any seq.
      CHECK(journal->steps(id).size() == c.steps_kept);
      for (const auto& event : journal->events(id)) {
        INFO(event.kind << " " << event.data.dump());
        CHECK_FALSE(event.seq);
      }
      CHECK(good_steps_meanwhile > 0);
      CHECK(good_steps_meanwhile < static_cast<std::uint64_t>(good_steps));  // it was still running
      CHECK(good.status == storage::run_status::completed);
      CHECK(journal->steps(good_id).size() == static_cast<std::size_t>(good_steps));
    }
  }
}

TEST_CASE("a child run whose output is too deep for its parent's replay fails instead of completing") {
  testing::temp_dir dir;
  auto journal = storage::open_journal(dir / "cairn.db");
  engine::engine eng(*journal, options_in(dir));
  engine::run_request parent;
  parent.id = "deep_done";
  parent.agent = STEP_AGENT;
  eng.submit(parent);
  storage::new_run child;
  child.id = "deep_done.1";  // the agent's mode: deep_done
  child.agent = HOSTILE_AGENT;
  child.sandbox = "bwrap";
  child.max_attempts = 1;
  child.workspace = (dir / "home" / "workspaces" / child.id).string();
  child.policy = engine::to_json(engine::default_policy());
  child.parent_id = parent.id;
  journal->create_run(child);
  auto run = eng.execute(child.id);
  REQUIRE(run.status == storage::run_status::failed);
  REQUIRE(run.error);
  CHECK_THAT(run.error->message, Catch::Contains("the run's output nests deeper than 125 levels"));
  CHECK(run.output.is_null());
  CHECK(journal->steps(child.id).size() == 1);
}
