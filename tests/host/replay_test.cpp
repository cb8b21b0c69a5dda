// Protocol v2 replay: a history of any size comes back to the agent in chunks
// it pulls, exactly as journaled, after a suspension or a killed host; an
// agent of protocol v1 is refused; an agent cannot make the host serve a
// step twice or out of order.
#include <signal.h>

#include <chrono>
#include <future>
#include <thread>

#include <catch2/catch.hpp>

#include "engine/engine.hpp"
#include "engine/owner.hpp"
#include "storage/journal.hpp"
#include "tests/cairn_cli.hpp"
#include "tests/host/engine_host.hpp"
#include "tests/temp_dir.hpp"

using namespace cairn;
using namespace std::chrono_literals;
using json = nlohmann::json;
using storage::run_status;

namespace {

struct host : testing::engine_host {
  host() : engine_host(200ms) {}

  // Executes the run until it ends, resuming it when a suspension is over; at most 120 s.
  storage::run_record finish(const std::string& id) {
    const auto until = std::chrono::steady_clock::now() + 120s;
    for (;;) {
      auto run = eng->execute(id);
      if (run.status != run_status::waiting && run.status != run_status::pending) return run;
      REQUIRE(std::chrono::steady_clock::now() < until);
      std::this_thread::sleep_for(20ms);
    }
  }
};

// Polls `ready` every 20 ms; false after `limit`.
bool eventually(const std::function<bool()>& ready, std::chrono::seconds limit = 120s) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!ready()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(20ms);
  }
  return true;
}

// `cairn run` of `input` in the background; once the run has journaled
// `steps` steps, SIGKILLs the host that owns it (its sandbox dies with it),
// then `cairn resume`s the run and returns what resume printed. The input
// parks the first sandbox in a step for 120 s, long enough to be killed and
// short enough that a failed test does not wait long for the run.
testing::cli_result kill_then_resume(const testing::temp_dir& dir, const json& input, std::uint64_t steps) {
  const auto home = dir / "home";
  testing::cli_options o;
  o.env = {{"CAIRN_HOME", home.string()}};
  const std::vector<std::string> run{"run", REPLAY_AGENT_PATH, "--id", "big", "--input", input.dump()};
  auto first = std::async(std::launch::async, [&] { return testing::run_program(CAIRN_BIN, run, dir.path(), o); });
  std::optional<pid_t> host_pid;
  const bool parked = eventually([&] {
    if (first.wait_for(0s) == std::future_status::ready) return true;
    try {
      auto j = storage::open_journal(home / "cairn.db", {.read_only = true});
      auto r = j->find_run("big");
      if (!r || j->step_count("big") < steps) return false;
      if (auto owner = engine::owner_id::parse(r->owner)) host_pid = owner->pid;
      return host_pid.has_value();
    } catch (const storage::storage_error&) {
      return false;  // `cairn run` is still creating the journal
    }
  });
  REQUIRE(parked);
  REQUIRE(host_pid);
  ::kill(*host_pid, SIGKILL);
  auto killed = first.get();
  INFO(killed.out << killed.err);
  REQUIRE(killed.code == 128 + SIGKILL);
  return testing::run_program(CAIRN_BIN, {"resume", "big"}, dir.path(), o);
}

}  // namespace

TEST_CASE("a history larger than the frame limit comes back exactly after a suspension") {
  host h;
  // 6 x 4 MB of random text, 24 MB: the v1 start frame could not carry it (16 MiB).
  const json input = {{"blobs", 6}, {"blob_bytes", 4'000'000}, {"sleep_ms", 1000}};
  h.submit("big", REPLAY_AGENT_PATH, input);
  REQUIRE(h.eng->execute("big").status == run_status::waiting);
  // What a replay carries, as read back (the journal stores it compressed).
  std::uint64_t history = 0;
  for (const auto& s : h.journal->steps("big")) history += s.result.output.dump().size();
  REQUIRE(history > 24'000'000);
  auto run = h.finish("big");
  INFO((run.error ? run.error->message : std::string()));
  REQUIRE(run.status == run_status::completed);
  CHECK(run.output["blobs_verified"] == 6);
  CHECK(run.output["attempt"] == 2);  // the wake-up replayed all 12 steps and the sleep
  CHECK(h.journal->step_count("big") == 14);
}

TEST_CASE("cairn resume replays a history after the host was killed: larger than the frame limit, or 3,000 steps") {
  struct history {
    json input;
    std::uint64_t steps;  // journaled when the host is killed
    const char* verified;
    int count;
  };
  // 6 x 4 MB of random text (24 MB, beyond a 16 MiB frame), or 3,000 small steps.
  const auto h = GENERATE(history{{{"blobs", 6}, {"blob_bytes", 4'000'000}, {"park_ms", 120'000}}, 12, "blobs_verified", 6},
                          history{{{"small", 3000}, {"park_ms", 120'000}}, 3000, "small_verified", 3000});
  testing::temp_dir dir;
  auto resumed = kill_then_resume(dir, h.input, h.steps);
  INFO(resumed.out << resumed.err);
  REQUIRE(resumed.code == 0);
  auto run = storage::open_journal(dir / "home" / "cairn.db", {.read_only = true})->find_run("big");
  REQUIRE(run);
  CHECK(run->status == run_status::completed);
  CHECK(run->output[h.verified] == h.count);
  CHECK(run->output["attempt"] == 2);
}

TEST_CASE("an agent of protocol v1 is refused with both versions named, and nothing of it is journaled") {
  host h;
  h.submit("v1", REPLAY_V1_AGENT_PATH, json::object());
  auto run = h.eng->execute("v1");
  REQUIRE(run.status == run_status::failed);
  CHECK(run.error->type == "protocol");
  CHECK_THAT(run.error->message, Catch::Contains("v1") && Catch::Contains("v2"));
  CHECK(run.attempts == 1);
  CHECK(h.journal->step_count("v1") == 0);
  CHECK(h.count("v1", "step_retry") == 0);
}

TEST_CASE("an agent asking for history out of order, past its end or twice fails the run as a protocol violation") {
  host h;
  const std::string attack = GENERATE("out_of_order", "past_end", "twice");
  h.submit("pull", REPLAY_RAW_AGENT_PATH, {{"attack", attack}});
  const auto t0 = std::chrono::steady_clock::now();
  auto run = h.eng->execute("pull");
  CHECK(std::chrono::steady_clock::now() - t0 < 30s);
  REQUIRE(run.status == run_status::failed);
  CHECK(run.error->type == "protocol");
  CHECK_THAT(run.error->message, Catch::Contains("history from seq"));
  CHECK(run.attempts == 2);
  CHECK(h.journal->step_count("pull") == 3);  // what the first sandbox journaled, unchanged
}

TEST_CASE("the host decides a step's retries: delays from the agent's request, attempts capped by the policy") {
  host h;
  SECTION("a step that throws twice then succeeds: two step_retry events with the host's delays") {
    h.submit("flaky", REPLAY_RETRY_AGENT_PATH, {{"fail", 2}, {"max_attempts", 5}});
    auto run = h.finish("flaky");
    REQUIRE(run.status == run_status::completed);
    CHECK(run.output["attempts"] == 3);
    CHECK(run.output["waited_ms"] >= 150);  // the SDK waited the host's 50 + 100 ms
    std::vector<std::int64_t> delays;
    for (const auto& e : h.journal->events("flaky"))
      if (e.kind == "step_retry") delays.push_back(e.data["delay_ms"]);
    CHECK(delays == std::vector<std::int64_t>{50, 100});
    CHECK(h.journal->steps("flaky").at(0).result.attempt == 3);
  }
  SECTION("an agent asking for 50 attempts under retry.step_attempts 3 gets 3") {
    h.submit("greedy", REPLAY_RETRY_AGENT_PATH, {{"fail", 1000}, {"max_attempts", 50}},
             {{"retry", {{"step_attempts", 3}}}});
    auto run = h.finish("greedy");
    REQUIRE(run.status == run_status::failed);
    CHECK(h.count("greedy", "step_retry") == 2);
    auto steps = h.journal->steps("greedy");
    REQUIRE(steps.size() == 1);
    CHECK_FALSE(steps[0].result.ok);
    CHECK(steps[0].result.attempt == 3);
    CHECK(run.attempts == 1);  // the failure was final in the same sandbox
  }
  SECTION("a terminal error is not retried") {
    h.submit("doomed", REPLAY_RETRY_AGENT_PATH, {{"fail", 1}, {"terminal", true}, {"max_attempts", 5}});
    auto run = h.finish("doomed");
    REQUIRE(run.status == run_status::failed);
    CHECK_THAT(run.error->message, Catch::Contains("cannot succeed"));
    CHECK(h.count("doomed", "step_retry") == 0);
    CHECK(h.journal->steps("doomed").at(0).result.attempt == 1);
  }
}
