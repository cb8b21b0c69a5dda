// End-to-end runs of real agents in bwrap sandboxes, driven in-process.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <fstream>
#include <map>
#include <sstream>

#include "engine/engine.hpp"
#include "engine/owner.hpp"
#include "tests/capabilities.hpp"
#include "tests/engine/proc_ticks.hpp"
#include "tests/temp_dir.hpp"

using namespace cairn;
using json = nlohmann::json;

namespace {

struct recorder : engine::run_observer {
  std::vector<std::string> warnings;
  std::vector<int> attempts;
  std::vector<std::string> crashes;
  void on_attempt(const storage::run_record&, int attempt) override { attempts.push_back(attempt); }
  void on_attempt_failed(int, const std::string& reason, bool) override { crashes.push_back(reason); }
  void on_warning(const std::string& w) override { warnings.push_back(w); }
};

struct harness {
  testing::temp_dir dir;
  std::unique_ptr<storage::journal> journal = storage::open_journal(dir / "cairn.db");
  engine::engine eng{*journal, options()};
  recorder watch;

  engine::engine_options options() {
    engine::engine_options o;
    o.home = dir / "home";
    o.retry_backoff = std::chrono::milliseconds(10);
    return o;
  }

  storage::run_record run(const std::string& id, json input, std::string sandbox = "bwrap",
                          std::string agent = STEP_AGENT) {
    engine::run_request r;
    r.id = id;
    r.agent = agent;
    r.input = std::move(input);
    r.workspace = dir / "ws" / id;
    r.sandbox = std::move(sandbox);
    eng.submit(r);
    return eng.execute(id, &watch);
  }

  // seq -> how many times its body really executed, from the agent's exec.log.
  std::map<int, int> executions(const std::string& id) {
    std::map<int, int> count;
    std::ifstream in(dir / "ws" / id / "exec.log");
    for (std::string line; std::getline(in, line);) ++count[std::stoi(line)];
    return count;
  }
};

}  // namespace

TEST_CASE("a multi-step run completes in bwrap and journals every step once") {
  harness h;
  auto run = h.run("ok", {{"steps", 6}});
  REQUIRE(run.status == storage::run_status::completed);
  CHECK(run.output["steps"] == 6);
  auto steps = h.journal->steps("ok");
  REQUIRE(steps.size() == 6);
  for (std::size_t i = 0; i < steps.size(); ++i) {
    CHECK(steps[i].result.seq == i);
    CHECK(steps[i].result.name == "step " + std::to_string(i));
    CHECK(steps[i].result.ok);
    CHECK(steps[i].result.output == run.output["outputs"][i]);
  }
  for (auto [seq, n] : h.executions("ok")) CHECK(n == 1);
  // Without root a sandbox has no totals or quota, and says so; as root every limit holds.
  if (testing::require_capability("root", ::geteuid() == 0, "that a root run warns of nothing it cannot enforce"))
    CHECK(h.watch.warnings.empty());
}

TEST_CASE("submitting an existing id returns that run unchanged") {
  harness h;
  h.run("same", {{"steps", 2}});
  engine::run_request again;
  again.id = "same";
  again.agent = STEP_AGENT;
  again.input = {{"steps", 9}};
  again.workspace = h.dir / "elsewhere";
  auto [run, created] = h.eng.submit(again);
  CHECK_FALSE(created);
  CHECK(run.input["steps"] == 2);
  CHECK(run.status == storage::run_status::completed);
  auto rerun = h.eng.execute("same");
  CHECK(h.journal->steps("same").size() == 2);
  CHECK(rerun.attempts == 1);
}

TEST_CASE("a failing step is retried with backoff inside the run and each failure is journaled") {
  harness h;
  auto run = h.run("retry", {{"steps", 4}, {"fail_first", {{"2", 2}}}});
  REQUIRE(run.status == storage::run_status::completed);
  auto steps = h.journal->steps("retry");
  CHECK(steps[2].result.attempt == 3);
  int retries = 0;
  for (const auto& e : h.journal->events("retry"))
    if (e.kind == "step_retry") {
      CHECK(e.seq == 2u);
      ++retries;
    }
  CHECK(retries == 2);
}

TEST_CASE("a terminal step error fails the run without retries, with the step's message") {
  harness h;
  auto run = h.run("terminal", {{"steps", 4}, {"terminal_at", 1}});
  REQUIRE(run.status == storage::run_status::failed);
  REQUIRE(run.error);
  CHECK_THAT(run.error->message, Catch::Contains("step 1 cannot succeed"));
  CHECK(run.attempts == 1);
  auto steps = h.journal->steps("terminal");
  REQUIRE(steps.size() == 2);
  CHECK_FALSE(steps[1].result.ok);
  CHECK(steps[1].result.attempt == 1);
}

TEST_CASE("a workflow can catch a failed step and go on") {
  harness h;
  auto run = h.run("caught", {{"steps", 3}, {"terminal_at", 1}, {"catch_failure", true}});
  REQUIRE(run.status == storage::run_status::completed);
  CHECK_THAT(run.output["outputs"][1]["caught"].get<std::string>(), Catch::Contains("cannot succeed"));
}

TEST_CASE("a sandbox that crashes mid-run is retried from the journal without redoing finished steps") {
  harness h;
  auto run = h.run("crash", {{"steps", 6}, {"crash_at", 3}});
  REQUIRE(run.status == storage::run_status::completed);
  CHECK(run.attempts == 2);
  REQUIRE(h.watch.crashes.size() == 1);
  CHECK_THAT(h.watch.crashes[0], Catch::Contains("SIGABRT"));
  auto runs = h.executions("crash");
  CHECK(runs[0] == 1);
  CHECK(runs[1] == 1);
  CHECK(runs[2] == 1);
  // Its first execution aborted before the result was sent: what it wrote
  // was rolled back to step 2's checkpoint, and the log holds the execution
  // whose result was journaled, attempt 2's.
  CHECK(runs[3] == 1);
  CHECK(runs[4] == 1);
  std::ifstream in(h.dir / "ws" / "crash" / "exec.log");
  std::string line;
  for (int i = 0; i <= 3; ++i) std::getline(in, line);
  CHECK_THAT(line, Catch::StartsWith("3 ") && Catch::EndsWith("attempt 2"));
}

TEST_CASE("a sandbox that crashes every time fails the run after max attempts, naming the crash") {
  harness h;
  engine::run_request r;
  r.agent = HOSTILE_AGENT;  // journals one step, then exits, on every attempt
  r.id = "exit_midway.1";
  r.workspace = h.dir / "ws" / "x";
  r.max_attempts = 2;
  h.eng.submit(r);
  auto run = h.eng.execute(r.id, &h.watch);
  REQUIRE(run.status == storage::run_status::failed);
  CHECK_THAT(run.error->message, Catch::Contains("gave up after 2 crashed attempts"));
  CHECK_THAT(run.error->message, Catch::Contains("exited with code 7"));
  CHECK(h.journal->steps(r.id).size() == 2);  // one per attempt, each kept
}

TEST_CASE("replay that asks for a different step fails the run with a non-determinism error naming both") {
  harness h;
  auto run = h.run("nondet", {{"steps", 5}, {"crash_at", 3}, {"rename_on_attempt2", 1}});
  REQUIRE(run.status == storage::run_status::failed);
  CHECK(run.error->type == "nondeterminism");
  CHECK_THAT(run.error->message, Catch::Contains("'step 1'"));
  CHECK_THAT(run.error->message, Catch::Contains("'renamed 1'"));
  CHECK(h.journal->steps("nondet").size() == 3);
}

TEST_CASE("a run owned by a live process is refused; one owned by a dead process is taken over") {
  harness h;
  engine::run_request r;
  r.id = "orphan";
  r.agent = STEP_AGENT;
  r.input = {{"steps", 2}};
  r.workspace = h.dir / "ws" / "orphan";
  h.eng.submit(r);

  engine::owner_id live = engine::current_owner();
  live.pid = getppid();  // alive, but not us
  live.start_ticks = proc_start_ticks(live.pid);
  REQUIRE(h.journal->claim_run("orphan", "", live.str()));
  CHECK(engine::check_owner(live.str()) == engine::owner_state::alive);
  CHECK_THROWS_WITH(h.eng.execute("orphan"), Catch::Contains("is being executed by pid"));
  CHECK(h.eng.orphaned_runs().empty());

  engine::owner_id dead = live;
  dead.start_ticks += 1;  // same pid, another process: the original is gone
  REQUIRE(h.journal->claim_run("orphan", live.str(), dead.str()));
  auto orphans = h.eng.orphaned_runs();
  REQUIRE(orphans.size() == 1);
  CHECK(orphans[0].id == "orphan");
  CHECK(h.eng.execute("orphan").status == storage::run_status::completed);
}

TEST_CASE("a failed run resumed gets a fresh set of attempts") {
  harness h;
  auto failed = h.run("again", {{"steps", 3}, {"terminal_at", 2}});
  REQUIRE(failed.status == storage::run_status::failed);
  // The journaled failure of step 2 is final: replay raises it again.
  auto again = h.eng.execute("again");
  CHECK(again.status == storage::run_status::failed);
  CHECK(again.attempts == 1);
  CHECK(h.executions("again")[2] == 1);
}

TEST_CASE("--sandbox none runs the agent as a plain process and warns on every run") {
  harness h;
  auto run = h.run("plain", {{"steps", 3}}, "none");
  REQUIRE(run.status == storage::run_status::completed);
  // First the missing isolation, then what the plain process lacks (no totals, no quota).
  REQUIRE(h.watch.warnings.size() >= 1);
  CHECK_THAT(h.watch.warnings[0], Catch::Contains("WITHOUT a sandbox"));
}

TEST_CASE("an unknown sandbox name is rejected before anything is written") {
  harness h;
  engine::run_request r;
  r.id = "x";
  r.agent = STEP_AGENT;
  r.sandbox = "docker";
  r.workspace = h.dir / "ws";
  CHECK_THROWS_WITH(h.eng.submit(r), Catch::Contains("unknown sandbox 'docker'"));
  CHECK_FALSE(h.journal->find_run("x"));
}

// engine::submit_many: a batch of runs queued all together or not at all.
namespace {

// A run of step_agent with this id and input, in its default workspace.
engine::run_request batch_request(const std::string& id, json input) {
  engine::run_request r;
  r.id = id;
  r.agent = STEP_AGENT;
  r.input = std::move(input);
  return r;
}

// `n` requests b0..b(n-1), input {"i": i}.
std::vector<engine::run_request> batch_of(int n) {
  std::vector<engine::run_request> out;
  for (int i = 0; i < n; ++i) out.push_back(batch_request("b" + std::to_string(i), {{"i", i}}));
  return out;
}

json nested(std::size_t depth) {
  json v = 0;
  for (std::size_t i = 0; i < depth; ++i) v = json::array({v});
  return v;
}

}  // namespace

TEST_CASE("submit_many queues every run pending, in order, each in its own workspace") {
  harness h;
  auto requests = batch_of(5);
  requests[2].id.clear();  // generated
  const auto runs = h.eng.submit_many(requests);
  REQUIRE(runs.size() == 5);
  for (int i = 0; i < 5; ++i) {
    INFO(i);
    CHECK(runs[i].created);
    if (i != 2) CHECK(runs[i].id == "b" + std::to_string(i));
    const auto run = h.journal->find_run(runs[i].id);
    REQUIRE(run);
    CHECK(run->status == storage::run_status::pending);
    CHECK(run->input == json{{"i", i}});
    CHECK(run->workspace == (h.dir / "home" / "workspaces" / run->id).string());
  }
  CHECK(runs[2].id.rfind("run-", 0) == 0);
  CHECK(h.journal->list_runs().size() == 5);
}

TEST_CASE("submit_many returns runs that exist unchanged and creates only the others") {
  harness h;
  h.eng.submit(batch_request("b1", {{"old", true}}));
  const auto runs = h.eng.submit_many(batch_of(3));
  REQUIRE(runs.size() == 3);
  CHECK(runs[0].created);
  CHECK_FALSE(runs[1].created);
  CHECK(runs[1].id == "b1");
  CHECK(h.journal->find_run("b1")->input == json{{"old", true}});
  CHECK(runs[2].created);
  const auto again = h.eng.submit_many(batch_of(3));
  for (const auto& run : again) CHECK_FALSE(run.created);
  CHECK(h.journal->list_runs().size() == 3);
}

TEST_CASE("one bad request refuses the whole batch, names its place, and writes nothing") {
  harness h;
  auto requests = batch_of(5);
  std::string expected;
  SECTION("an invalid id") {
    requests[2].id = "../escape";
    expected = "is not a valid run id";
  }
  SECTION("an input nested too deep") {
    requests[2].input = nested(protocol::max_input_depth + 1);
    expected = "nests deeper than";
  }
  SECTION("an id given twice") {
    requests[2].id = "b0";
    expected = "run id b0 was given to run 1 already";
  }
  SECTION("a workspace given") {
    requests[2].workspace = h.dir / "shared";
    expected = "cannot be given a workspace";
  }
  SECTION("an unknown sandbox") {
    requests[2].sandbox = "docker";
    expected = "unknown sandbox 'docker'";
  }
  try {
    h.eng.submit_many(requests);
    FAIL("the batch was accepted");
  } catch (const engine::engine_error& e) {
    CHECK(e.code() == engine::errc::bad_request);
    CHECK_THAT(e.what(), Catch::StartsWith("run 3 of the batch: ") && Catch::Contains(expected));
  }
  CHECK(h.journal->list_runs().empty());
}
