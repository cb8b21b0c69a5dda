// Runs that wait while their agent is rebuilt (engine/agent_versions.hpp):
// each keeps the version it began with unless resumed on the new one, and
// ctx.patched takes the branch each should.
#include <catch2/catch.hpp>

#include <fstream>

#include "engine/run_state.hpp"
#include "tests/host/engine_host.hpp"

using namespace cairn;
using json = nlohmann::json;
using storage::run_status;
namespace fs = std::filesystem;

namespace {

// Version 1 waits for a signal between two steps; version 2 adds two
// patches: "early" before the wait (runs begun on version 1 have passed it)
// and "late" after it (none has).
constexpr const char* version_1 = R"(#!/usr/bin/env python3
import cairn

def workflow(ctx, input):
    ctx.step("before", lambda: 1)
    ctx.wait_signal("go")
    return {"branch": ctx.step("old", lambda: "old")}

cairn.main(workflow)
)";

constexpr const char* version_2 = R"(#!/usr/bin/env python3
import cairn

def workflow(ctx, input):
    early = ctx.patched("early")
    ctx.step("before", lambda: 1)
    ctx.wait_signal("go")
    late = ctx.patched("late")
    branch = ctx.step("new", lambda: "new") if late else ctx.step("old", lambda: "old")
    return {"early": early, "late": late, "branch": branch}

cairn.main(workflow)
)";

void build(const fs::path& agent, const char* source) {
  fs::create_directories(agent.parent_path());
  fs::remove(agent);
  std::ofstream(agent) << source;
  fs::permissions(agent, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec | fs::perms::others_read |
                             fs::perms::others_exec);
}

struct host : testing::engine_host {
  host() : engine_host(std::chrono::milliseconds(100)) {}

  const fs::path agent = dir / "app" / "agent.py";

  // Run `id` of version 1, suspended at its wait for the signal.
  void waiting(const std::string& id) {
    if (!fs::exists(agent)) build(agent, version_1);
    submit(id, agent.string(), json::object());
    auto run = eng->execute(id);
    INFO(id << ": " << (run.error ? run.error->message : ""));
    REQUIRE(run.status == run_status::waiting);
  }

  std::vector<std::string> events(const std::string& id, const std::string& kind) {
    std::vector<std::string> found;
    for (const auto& e : journal->events(id))
      if (e.kind == kind) found.push_back(e.data.dump());
    return found;
  }
};

struct warnings : engine::run_observer {
  std::vector<std::string> seen;
  void on_warning(const std::string& message) override { seen.push_back(message); }
};

}  // namespace

TEST_CASE("20 runs wait while their agent is rebuilt with patches: half resume on the old version, half on the new") {
  host h;
  const auto& agent = h.agent;
  constexpr int runs = 20;
  auto id = [](int i) { return "v" + std::to_string(i); };
  for (int i = 0; i < runs; ++i) h.waiting(id(i));
  const auto began = engine::agent_of_run(*h.journal, id(0));
  REQUIRE(began);
  CHECK(began->agent == fs::canonical(agent).string());

  build(agent, version_2);
  for (int i = 0; i < runs; ++i) h.eng->signal(id(i), "go", nullptr);
  for (int i = 0; i < runs; ++i) {
    INFO(id(i));
    const bool on_new = i % 2 == 1;
    warnings seen;
    if (on_new) CHECK_THAT(h.eng->replace_agent(id(i), agent), Catch::Contains(began->version));
    auto run = h.eng->execute(id(i), &seen);
    INFO((run.error ? run.error->message : ""));
    REQUIRE(run.status == run_status::completed);
    if (on_new) {
      CHECK(run.output == json{{"early", false}, {"late", true}, {"branch", "new"}});
      CHECK(seen.seen.empty());
      CHECK(h.events(id(i), "agent_replaced").size() == 1);
      CHECK(h.events(id(i), "agent_changed").empty());
    } else {
      CHECK(run.output == json{{"branch", "old"}});
      REQUIRE(seen.seen.size() == 1);
      CHECK_THAT(seen.seen[0], Catch::StartsWith("the agent changed since this run started: " +
                                                 fs::canonical(agent).string() + " was " + began->version) &&
                                   Catch::Contains("resumes on the copy kept when it started") &&
                                   Catch::Contains("cairn resume " + id(i) + " --agent"));
      CHECK(h.events(id(i), "agent_changed").size() == 1);
    }
  }
  // One copy of each version, however many runs use it.
  int copies = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(h.options.home / "agents")) ++copies;
  CHECK(copies == 2);
}

TEST_CASE("a changed agent whose kept copy is gone is refused with what to do, and --agent resumes it") {
  host h;
  h.waiting("gone");
  fs::remove_all(h.options.home / "agents");
  build(h.agent, version_2);
  h.eng->signal("gone", "go", nullptr);
  auto refused = h.eng->execute("gone");
  REQUIRE(refused.status == run_status::failed);
  REQUIRE(refused.error);
  CHECK(refused.error->type == "agent_changed");
  CHECK_THAT(refused.error->message, Catch::StartsWith("the agent changed since this run started") &&
                                          Catch::Contains("cairn resume gone --agent"));
  CHECK(h.journal->step_count("gone") == 1);  // nothing ran on the new agent: the signal waits, undelivered

  h.eng->replace_agent("gone", h.agent);
  h.eng->reopen("gone");
  auto run = h.eng->execute("gone");
  INFO((run.error ? run.error->message : ""));
  REQUIRE(run.status == run_status::completed);
  CHECK(run.output == json{{"early", false}, {"late", true}, {"branch", "new"}});
}

TEST_CASE("an unchanged agent whose copy is gone is kept again and resumes without a word") {
  host h;
  h.waiting("same");
  fs::remove_all(h.options.home / "agents");
  h.eng->signal("same", "go", nullptr);
  warnings seen;
  auto run = h.eng->execute("same", &seen);
  REQUIRE(run.status == run_status::completed);
  CHECK(seen.seen.empty());
  CHECK(fs::exists(h.options.home / "agents"));
}

TEST_CASE("resume --agent refuses a run that has ended and a program that cannot be read, changing nothing") {
  host h;
  h.waiting("r");
  CHECK_THROWS_WITH(h.eng->replace_agent("r", h.dir / "missing.py"), Catch::Contains("--agent"));
  CHECK_THROWS_AS(h.eng->replace_agent("ghost", h.agent), engine::engine_error);
  h.eng->signal("r", "go", nullptr);
  REQUIRE(h.eng->execute("r").status == run_status::completed);
  CHECK_THROWS_WITH(h.eng->replace_agent("r", h.agent), Catch::Contains("has ended"));
  CHECK(h.events("r", "agent_replaced").empty());
}
