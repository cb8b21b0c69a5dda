// Tool calls cross the boundary through the host: checked against the run's
// policy, executed outside the sandbox, journaled before the agent sees the
// result, and never called again on replay.
#include <catch2/catch.hpp>

#include <csignal>
#include <fstream>

#include "engine/engine.hpp"
#include "engine/tool_broker.hpp"
#include "tests/cairn_cli.hpp"
#include "tests/temp_dir.hpp"

using namespace cairn;
using json = nlohmann::json;

namespace {

struct harness {
  testing::temp_dir dir;
  std::unique_ptr<storage::journal> journal = storage::open_journal(dir / "cairn.db");
  engine::engine eng{*journal, options()};

  harness() { setenv("CAIRN_TEST_TOOL_LOG", (dir / "calls.log").c_str(), 1); }
  ~harness() { unsetenv("CAIRN_TEST_TOOL_LOG"); }

  engine::engine_options options() {
    engine::engine_options o;
    o.home = dir / "home";
    o.retry_backoff = std::chrono::milliseconds(10);
    return o;
  }

  static json mailer_policy_json(const std::string& idempotency) {
    return {{"tools",
             {{"mailer",
               {{"command", {RECORD_TOOL}},
                {"input", {{"to", "string"}, {"mode?", "string"}}},
                {"idempotency", idempotency},
                {"timeout_ms", 1000},
                {"max_output_bytes", 65536},
                {"env", {"CAIRN_TEST_TOOL_LOG"}}}}}}};
  }
  static engine::policy mailer_policy(const std::string& idempotency = "at_most_once") {
    return engine::parse_policy(mailer_policy_json(idempotency));
  }

  // Starts run `id` with `cairn run` on this journal and kills that host
  // (SIGKILL, at the crash point) once the durable started record of its
  // first tool call is written, before the tool is called: what a host that
  // died inside the call leaves behind.
  void crash_inside_first_call(const std::string& id, json input, const std::string& idempotency) {
    const auto policy = dir / ("policy-" + id + ".json");
    std::ofstream(policy) << mailer_policy_json(idempotency).dump();
    testing::cli_options o;
    // The same home as this process's engine: a worker of another home would refuse the run it leaves.
    o.env = {{"CAIRN_HOME", (dir / "home").string()},
             {"CAIRN_DB", (dir / "cairn.db").string()},
             {"CAIRN_CRASH_POINT", "tool_started:1"}};
    auto killed = testing::run_program(CAIRN_BIN, {"run", TOOL_AGENT, "--id", id, "--policy", policy.string(),
                                                   "--input", input.dump()},
                                       dir.path(), o);
    INFO(killed.out << killed.err);
    REQUIRE(killed.code == 128 + SIGKILL);
    REQUIRE(journal->steps(id).size() == 1);  // the step before the call
    REQUIRE(journal->events_at(id, 1).size() == 1);  // its tool_started
  }

  storage::run_record run(const std::string& id, json input, engine::policy p = mailer_policy()) {
    engine::run_request r;
    r.id = id;
    r.agent = TOOL_AGENT;
    r.input = std::move(input);
    r.workspace = dir / "ws" / id;
    r.policy = std::move(p);
    eng.submit(r);
    return eng.execute(id);
  }

  std::vector<std::string> calls() {
    std::vector<std::string> lines;
    std::ifstream in(dir / "calls.log");
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }
};

json call(const std::string& tool, json args) { return {{"tool", tool}, {"args", std::move(args)}}; }

}  // namespace

TEST_CASE("a granted tool runs on the host and its result is journaled before the agent sees it") {
  harness h;
  auto run = h.run("t1", {{"calls", {call("mailer", {{"to", "ana@example.com"}})}}});
  REQUIRE(run.status == storage::run_status::completed);
  CHECK(run.output["results"][0] == json{{"sent", true}, {"key", "t1/1"}, {"seq", 1}});
  auto steps = h.journal->steps("t1");
  REQUIRE(steps.size() == 3);
  CHECK(steps[1].result.kind == protocol::step_kind::tool);
  CHECK(steps[1].result.name == "mailer");
  CHECK(steps[1].result.output == run.output["results"][0]);
  CHECK(h.calls() == std::vector<std::string>{R"(t1/1 {"to":"ana@example.com"})"});
  CHECK(engine::parse_policy(run.policy).grants("mailer"));
}

TEST_CASE("on replay the journaled result is returned and the tool is not called again") {
  harness h;
  auto run = h.run("t2", {{"calls", {call("mailer", {{"to", "a@b"}}), call("mailer", {{"to", "c@d"}})}},
                          {"crash_after_calls", true}});
  REQUIRE(run.status == storage::run_status::completed);
  CHECK(run.output["attempt"] == 2);  // the first sandbox aborted after both calls
  CHECK(h.calls().size() == 2);
  CHECK(run.output["results"][1]["key"] == "t2/2");
}

TEST_CASE("a tool the policy does not grant is refused, journaled, and catchable") {
  harness h;
  auto run = h.run("t3", {{"calls", {call("payroll", {{"amount", 1000000}}), call("mailer", {{"to", "x"}, {"cc", "y"}})}}});
  REQUIRE(run.status == storage::run_status::completed);
  CHECK(run.output["results"][0]["error"] == "refused");
  CHECK_THAT(run.output["results"][0]["message"].get<std::string>(),
             Catch::Contains("'payroll' is not granted") && Catch::Contains("granted: mailer"));
  CHECK(run.output["results"][1]["error"] == "refused");
  CHECK_THAT(run.output["results"][1]["message"].get<std::string>(), Catch::Contains("'cc'"));
  auto steps = h.journal->steps("t3");
  CHECK_FALSE(steps[1].result.ok);
  CHECK(steps[1].result.error.type == "refused");
  CHECK(h.calls().empty());
}

TEST_CASE("a failing tool gives the agent a clear error and the run goes on") {
  harness h;
  auto run = h.run("t4", {{"calls",
                           {call("mailer", {{"to", "x"}, {"mode", "hang"}}), call("mailer", {{"to", "x"}, {"mode", "garbage"}}),
                            call("mailer", {{"to", "x"}, {"mode", "huge"}}), call("mailer", {{"to", "x"}, {"mode", "crash"}}),
                            call("mailer", {{"to", "x"}})}}});
  REQUIRE(run.status == storage::run_status::completed);
  const auto& r = run.output["results"];
  CHECK(r[0]["error"] == "timeout");
  CHECK(r[1]["error"] == "bad_output");
  CHECK(r[2]["error"] == "too_large");
  CHECK(r[3]["error"] == "failed");
  CHECK(r[4]["sent"] == true);
  auto steps = h.journal->steps("t4");
  for (int i = 1; i <= 4; ++i) CHECK(steps[i].result.error.type == r[i - 1]["error"]);
}

TEST_CASE("an at-most-once call started but never recorded stops the run in doubt until settled") {
  harness h;
  h.crash_inside_first_call("t5", {{"calls", {call("mailer", {{"to", "boss@example.com"}})}}}, "at_most_once");

  auto stopped = h.eng.execute("t5");
  REQUIRE(stopped.status == storage::run_status::in_doubt);
  REQUIRE(stopped.error);
  CHECK(stopped.error->type == "in_doubt");
  CHECK_THAT(stopped.error->message, Catch::Contains("mailer") && Catch::Contains("may or may not have happened") &&
                                         Catch::Contains("cairn settle t5 1 --result") && Catch::Contains("--retry"));
  CHECK(h.calls().empty());  // never silently repeated
  // Executing again changes nothing until it is settled.
  CHECK(h.eng.execute("t5").status == storage::run_status::in_doubt);
  CHECK(h.calls().empty());

  CHECK_THROWS_WITH(h.eng.settle("t5", 3, {}), Catch::Contains("step 3 of run t5 is not in doubt"));
  engine::settlement s;
  s.outcome = engine::settlement::how::result;
  s.result = {{"sent", true}, {"by", "operator"}};
  CHECK(h.eng.settle("t5", 1, s).status == storage::run_status::pending);
  auto done = h.eng.execute("t5");
  REQUIRE(done.status == storage::run_status::completed);
  CHECK(done.output["results"][0] == s.result);
  CHECK(h.calls().empty());
  CHECK_THROWS_WITH(h.eng.settle("t5", 1, s), Catch::Contains("no tool call in doubt"));
}

TEST_CASE("settling with --retry calls the tool again, once") {
  harness h;
  h.crash_inside_first_call("t6", {{"calls", {call("mailer", {{"to", "x"}})}}}, "at_most_once");
  REQUIRE(h.eng.execute("t6").status == storage::run_status::in_doubt);
  h.eng.settle("t6", 1, {});
  auto done = h.eng.execute("t6");
  REQUIRE(done.status == storage::run_status::completed);
  CHECK(h.calls().size() == 1);
  CHECK(h.journal->steps("t6")[1].result.attempt == 2);  // the second start of that call
}

TEST_CASE("an idempotent call started but never recorded is simply made again with the same key") {
  harness h;
  h.crash_inside_first_call("t7", {{"calls", {call("mailer", {{"to", "x"}})}}}, "idempotent");
  auto done = h.eng.execute("t7");
  REQUIRE(done.status == storage::run_status::completed);
  CHECK(done.output["results"][0]["key"] == "t7/1");
}
