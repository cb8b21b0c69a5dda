// A broken or hostile agent fails its own run with a message naming what was
// wrong; the host, the journal and other runs go on.
#include <catch2/catch.hpp>

#include "engine/engine.hpp"
#include "tests/temp_dir.hpp"

using namespace cairn;

namespace {

struct hostile_case {
  const char* mode;
  const char* message;       // expected in the run's error
  std::size_t steps_kept;    // journaled steps that must survive
};

}  // namespace

TEST_CASE("hostile agents fail their run and leave the journal and other runs intact") {
  testing::temp_dir dir;
  storage::journal journal(dir / "cairn.db");
  engine::engine_options options;
  options.home = dir / "home";
  options.hello_timeout = std::chrono::milliseconds(500);
  options.retry_backoff = std::chrono::milliseconds(1);
  engine::engine eng(journal, options);

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
      {"silent", "did not say hello", 0},
      {"truncated", "in the middle of a frame", 0},
  };
  for (const auto& c : cases) {
    DYNAMIC_SECTION(c.mode) {
      engine::run_request r;
      r.id = std::string(c.mode) + ".1";
      r.agent = HOSTILE_AGENT;
      r.workspace = dir / "ws" / c.mode;
      r.max_attempts = 2;
      eng.submit(r);
      auto run = eng.execute(r.id);
      REQUIRE(run.status == storage::run_status::failed);
      REQUIRE(run.error);
      CHECK_THAT(run.error->message, Catch::Contains(c.message));
      CHECK(journal.steps(r.id).size() == c.steps_kept);

      // The host goes on: a well-behaved run in the same journal completes.
      engine::run_request good;
      good.id = std::string("good-after-") + c.mode;
      good.agent = STEP_AGENT;
      good.input = {{"steps", 2}};
      good.workspace = dir / "ws" / good.id;
      eng.submit(good);
      CHECK(eng.execute(good.id).status == storage::run_status::completed);
    }
  }
}
