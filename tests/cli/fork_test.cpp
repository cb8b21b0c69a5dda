// `cairn fork` as a user runs it: a 60-step agent with model and tool calls
// fails at step 41; forked at 40 with the fix (an input without the bug), no
// model request and no tool call before 41 is made again, and the fork
// completes; its fork too; `cairn show` links them both ways; refusals
// change nothing. The workspace case ([checkpoints]) needs the workspace
// checkpoints that engine::fork restores.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "tests/cairn_cli.hpp"
#include "tests/temp_dir.hpp"
#include "tests/tools/mock_server.hpp"

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

struct fixture {
  cairn::testing::temp_dir dir;
  cairn::engine::test::mock_server llm;

  fixture() {
    fs::create_directories(dir / "tool");
    std::ofstream(dir / "policy.json") << json{{"tools",
                                                {{"llm.chat", json::object()},
                                                 {"count",
                                                  {{"command", {COUNT_TOOL}},
                                                   {"input", {{"run", "string"}}},
                                                   {"idempotency", "idempotent"},
                                                   {"env", {"CAIRN_CHAOS_TOOL_DIR"}}}}}}};
  }

  cairn::testing::cli_result cli(std::vector<std::string> args) const {
    const cairn::testing::cli_options o{
        .env = {{"CAIRN_HOME", (dir / "home").string()},
                {"CAIRN_CHAOS_TOOL_DIR", (dir / "tool").string()},
                {"CAIRN_LLM_BASE_URL", llm.url("/v1")},
                {"CAIRN_LLM_API_KEY", "sk-test"},
                {"CAIRN_LLM_MODEL", "mock-1"}}};
    return cairn::testing::run_program(CAIRN_BIN, std::move(args), dir.path(), o);
  }

  // The original run, failed at step 41, and its fork at 40 left pending.
  void fail_and_fork() {
    auto orig = cli({"run", FORK_AGENT, "--id", "orig", "--policy", (dir / "policy.json").string(),
                     "--input", R"({"fail_at":41})"});
    INFO(orig.out << orig.err);
    REQUIRE(orig.code == 1);
    REQUIRE(model_requests().size() == 14);  // steps 0, 3, ..., 39
    auto fork = cli({"fork", "orig", "--at", "40", "--id", "fixed", "--input", "{}", "--detach"});
    INFO(fork.out << fork.err);
    REQUIRE(fork.code == 0);
    REQUIRE(fork.out == "fixed\n");
  }

  // The user content of each model request, in order.
  std::vector<std::string> model_requests() const {
    std::vector<std::string> out;
    for (const auto& r : llm.requests()) out.push_back(r["body"]["messages"].back()["content"].get<std::string>());
    return out;
  }

  // Tool calls made, by idempotency key (RUN_SEQ) -> how many times.
  std::map<std::string, int> tool_calls() const {
    std::map<std::string, int> out;
    for (const auto& f : fs::directory_iterator(dir / "tool"))
      if (f.path().extension() != ".lock") out[f.path().filename().string()] = std::stoi(cairn::testing::slurp(f.path()));
    return out;
  }

  // Every file of a folder, by relative path -> its bytes.
  static std::map<std::string, std::string> files_of(const fs::path& folder) {
    std::map<std::string, std::string> out;
    for (const auto& f : fs::recursive_directory_iterator(folder))
      out[fs::relative(f.path(), folder).string()] = f.is_regular_file() ? cairn::testing::slurp(f.path()) : "<folder>";
    return out;
  }
};

}  // namespace

TEST_CASE("a run fixed and forked at step 40 makes no model or tool call of steps 0-40 again") {
  fixture f;
  f.fail_and_fork();
  auto resumed = f.cli({"resume", "fixed", "--json"});
  INFO(resumed.out << resumed.err);
  REQUIRE(resumed.code == 0);
  CHECK(json::parse(resumed.out.substr(resumed.out.find('{')))["output"]["steps"] == 60);

  // Each model request once: 0-39 by orig, 42-57 by the fork.
  const auto requests = f.model_requests();
  CHECK(requests.size() == 20);
  CHECK(std::set<std::string>(requests.begin(), requests.end()).size() == requests.size());
  for (int i = 0; i <= 40; i += 3) CHECK(std::count(requests.begin(), requests.end(), "step " + std::to_string(i)) == 1);
  // Each tool call once, and none of the fork's at a step it copied.
  const auto calls = f.tool_calls();
  for (const auto& [key, n] : calls) {
    INFO(key);
    CHECK(n == 1);
    if (key.starts_with("fixed_")) CHECK(std::stoi(key.substr(6)) > 40);
  }
  CHECK(calls.size() == 14 + 6);

  auto show = f.cli({"show", "fixed"});
  CHECK_THAT(show.out, Catch::Contains("forked from orig at step 40"));
  show = f.cli({"show", "orig", "--json"});
  CHECK(json::parse(show.out)["forks"] == json::array({{{"run", "fixed"}, {"seq", 40}}}));

  // A fork of the fork, followed in the foreground: nothing before 50 again.
  auto again = f.cli({"fork", "fixed", "--at", "50", "--id", "again", "--json"});
  INFO(again.out << again.err);
  REQUIRE(again.code == 0);
  CHECK(f.model_requests().size() == 20 + 3);  // 51, 54, 57
  CHECK(f.tool_calls().size() == 20 + 3);      // again_52, 55, 58
  show = f.cli({"show", "again", "--json"});
  CHECK(json::parse(show.out)["forked_from"] == json{{"run", "fixed"}, {"seq", 50}});
}

TEST_CASE("cairn fork refuses what it cannot fork, and changes nothing") {
  fixture f;
  f.fail_and_fork();
  const auto runs = f.cli({"ls", "--json"}).out;
  const auto orig = f.cli({"show", "orig", "--json"}).out;
  const std::vector<std::pair<std::vector<std::string>, std::string>> refusals = {
      {{"fork", "nope", "--at", "1"}, "no run 'nope'"},
      {{"fork", "orig", "--at", "42"}, "run orig has no step 42: its journal ends at step 41"},
      {{"fork", "orig", "--at", "3", "--id", "fixed"}, "run fixed exists already"},
      {{"fork", "orig", "--at", "3", "--id", "a/b"}, "is not a valid run id"},
  };
  for (const auto& [args, says] : refusals) {
    auto r = f.cli(args);
    INFO(r.out << r.err);
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::Contains(says));
    CHECK(f.cli({"ls", "--json"}).out == runs);
    CHECK(f.cli({"show", "orig", "--json"}).out == orig);
  }
}

TEST_CASE("a fork's workspace is the original's checkpoint at the step, byte for byte", "[checkpoints]") {
  fixture f;
  f.fail_and_fork();
  // orig wrote nothing after step 40 (41 failed before writing): its
  // workspace is its checkpoint at 40.
  const auto expected = fixture::files_of(f.dir / "home" / "workspaces" / "orig");
  REQUIRE(expected.count("steps.txt") == 1);
  CHECK(fixture::files_of(f.dir / "home" / "workspaces" / "fixed") == expected);

  // At an earlier step: the files as they were then, not as they are now.
  std::string then;
  for (int i = 2; i <= 20; i += 3) then += "step " + std::to_string(i) + "\n";
  auto shown = f.cli({"workspace", "orig", "--at", "20", "steps.txt"});
  INFO(shown.err);
  REQUIRE(shown.code == 0);
  CHECK(shown.out == then);
  auto early = f.cli({"fork", "orig", "--at", "20", "--id", "early", "--input", "{}", "--detach"});
  INFO(early.out << early.err);
  REQUIRE(early.code == 0);
  CHECK(fixture::files_of(f.dir / "home" / "workspaces" / "early") == std::map<std::string, std::string>{{"steps.txt", then}});

  // It goes on from there: every step's line once, those before 21 not written again.
  auto done = f.cli({"resume", "early"});
  INFO(done.out << done.err);
  REQUIRE(done.code == 0);
  std::string all;
  for (int i = 2; i < 60; i += 3) all += "step " + std::to_string(i) + "\n";
  CHECK(cairn::testing::slurp(f.dir / "home" / "workspaces" / "early" / "steps.txt") == all);
  // And what changed between two of its steps.
  auto diff = f.cli({"diff", "early", "20", "23", "--json"});
  INFO(diff.err);
  REQUIRE(diff.code == 0);
  const auto changes = json::parse(diff.out)["changes"];
  REQUIRE(changes.size() == 1);
  CHECK(changes[0]["change"] == "M");
  CHECK(changes[0]["path"] == "steps.txt");
  CHECK(changes[0]["after"]["size"] == then.size() + std::string("step 23\n").size());
}
