// A framework agent made durable: examples/js/openai_agents (the real
// @openai/agents package, two function tools and a handoff) runs under
// `cairn run` against cairn-mock-llm; its host is SIGKILLed mid-run and the
// run resumed. No model request may reach the model twice, no tool body may
// run twice, and the answer must be the one of an uninterrupted run.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <set>
#include <thread>

#include <catch2/catch.hpp>

#include "engine/owner.hpp"
#include "storage/journal.hpp"
#include "tests/cairn_cli.hpp"
#include "tests/temp_dir.hpp"
#include "tests/tools/mock_server.hpp"

using namespace cairn;
using namespace std::chrono_literals;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

const fs::path example = OPENAI_AGENTS_EXAMPLE;

// Fails, naming the command that installs it, when the example cannot run here.
void require_example_installed() {
  const auto probe = testing::run_program("/usr/bin/env", {"node", "--version"}, fs::temp_directory_path());
  INFO("install Node.js >= 20 (Debian: apt-get install nodejs npm)");
  REQUIRE(probe.code == 0);
  INFO("install the example's packages: npm ci --prefix " << example.string());
  REQUIRE(fs::exists(example / "node_modules/@openai/agents/package.json"));
  REQUIRE(fs::exists(example / "node_modules/cairn/package.json"));
}

// A run of the example under `policy` (its own by default), against `mock`, in its own CAIRN_HOME.
struct example_run {
  example_run(const testing::temp_dir& dir, const engine::test::mock_server& mock, std::string id,
              fs::path policy = example / "agent.policy.json")
      : id(std::move(id)), home(dir / "home"), scratch(dir.path()), policy(std::move(policy)) {
    options.env = {{"CAIRN_HOME", home.string()}, {"CAIRN_LLM_BASE_URL", mock.url("/v1")}};
    options.unset = {"CAIRN_LLM_API_KEY", "CAIRN_LLM_MODEL"};
  }
  testing::cli_result start() const {
    return testing::run_program(CAIRN_BIN,
                                {"run", (example / "agent.mjs").string(), "--id", id, "--policy", policy.string()},
                                scratch, options);
  }
  std::optional<storage::run_record> record() const {
    return storage::open_journal(home / "cairn.db", {.read_only = true})->find_run(id);
  }
  std::vector<std::string> step_names() const {
    std::vector<std::string> names;
    for (const auto& s : storage::open_journal(home / "cairn.db", {.read_only = true})->steps(id))
      names.push_back(s.result.name);
    return names;
  }
  // The lines the tool bodies left in the run's workspace (none before the first).
  std::vector<std::string> tool_lines() const {
    std::vector<std::string> lines;
    auto listed = testing::run_program(CAIRN_BIN, {"workspace", id, "tool_calls.log", "--json"}, scratch, options);
    if (json::parse(listed.out).at("entries").at(0).at("type") == "?") return lines;  // no such file yet
    auto shown = testing::run_program(CAIRN_BIN, {"workspace", id, "tool_calls.log"}, scratch, options);
    std::istringstream in(shown.out);
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) lines.push_back(line);
    return lines;
  }

  std::string id;
  fs::path home, scratch, policy;
  testing::cli_options options;
};

// The pids of the processes below `root` whose name is `comm`.
std::vector<pid_t> descendants_named(pid_t root, const std::string& comm) {
  std::map<pid_t, pid_t> parent;
  std::map<pid_t, std::string> name;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    pid_t pid = std::atoi(entry.path().filename().c_str());
    if (pid <= 0) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    auto close = text.rfind(')');
    if (close == std::string::npos) continue;
    parent[pid] = std::atoi(text.c_str() + close + 4);  // ") S PPID"
    name[pid] = text.substr(text.find('(') + 1, close - text.find('(') - 1);
  }
  std::vector<pid_t> found;
  for (const auto& [pid, n] : name) {
    if (n != comm) continue;
    for (pid_t p = parent[pid]; p > 1; p = parent.count(p) ? parent[p] : 0)
      if (p == root) {
        found.push_back(pid);
        break;
      }
  }
  return found;
}

// The lines of `log` written whole so far (the mock may be in the middle of one).
std::size_t complete_lines(const fs::path& log) {
  auto text = testing::slurp(log);
  return std::count(text.begin(), text.end(), '\n');
}

std::size_t count_of(const std::vector<std::string>& names, const std::string& prefix) {
  return std::count_if(names.begin(), names.end(), [&](const auto& n) { return n.starts_with(prefix); });
}

bool eventually(const std::function<bool()>& ready, std::chrono::milliseconds poll, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!ready()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(poll);
  }
  return true;
}

}  // namespace

TEST_CASE("an @openai/agents agent whose host is SIGKILLed mid-run resumes without repeating a model call or a tool body") {
  require_example_installed();
  const auto script = (example / "mock_script.json").string();

  // The reference: the same agent, never interrupted.
  testing::temp_dir calm_dir;
  engine::test::mock_server calm_mock({"--script", script});
  example_run calm(calm_dir, calm_mock, "calm");
  auto calm_result = calm.start();
  INFO(calm_result.out << calm_result.err);
  REQUIRE(calm_result.code == 0);
  const auto reference = calm.record();
  REQUIRE(reference);
  REQUIRE(reference->status == storage::run_status::completed);
  CHECK(reference->output["agent"] == "Writer");
  CHECK(calm_mock.requests().size() == 4);  // planner x 3 (two tool calls, a handoff), writer x 1
  CHECK(calm.tool_lines().size() == 2);

  // Killed after the first tool body (before tool B), or after the second (before the handoff).
  const std::size_t tools_before_kill = GENERATE(1, 2);
  testing::temp_dir dir;
  engine::test::mock_server mock({"--script", script});
  example_run crash(dir, mock, "crash");
  auto first = std::async(std::launch::async, [&] { return crash.start(); });

  // Kill the host only when nothing is in flight, so that what must not be
  // repeated is exactly what was journaled: once `tools_before_kill` tool
  // bodies are journaled, freeze the agent (SIGSTOP), wait until every model
  // request the mock received and every tool body that ran is journaled, then SIGKILL.
  std::optional<pid_t> host_pid;
  std::size_t llm_at_kill = 0, tools_at_kill = 0;
  bool killed = false;
  const bool reached = eventually([&] {
    if (first.wait_for(0s) == std::future_status::ready) return true;
    std::vector<std::string> names;
    try {
      auto run = crash.record();
      if (!run) return false;
      if (auto owner = engine::owner_id::parse(run->owner)) host_pid = owner->pid;
      names = crash.step_names();
    } catch (const storage::storage_error&) {
      return false;  // `cairn run` is still creating the journal
    }
    if (!host_pid || count_of(names, "tool:") < tools_before_kill) return false;
    auto agents = descendants_named(*host_pid, "node");
    if (agents.size() != 1) return false;
    ::kill(agents[0], SIGSTOP);
    const bool quiet = eventually([&] {
      names = crash.step_names();
      return complete_lines(mock.log_path()) == count_of(names, "llm.chat") &&
             crash.tool_lines().size() == count_of(names, "tool:");
    }, 20ms, 10s);
    if (!quiet) {
      ::kill(agents[0], SIGCONT);  // caught inside a tool body: try at the next step
      return false;
    }
    llm_at_kill = count_of(names, "llm.chat");
    tools_at_kill = count_of(names, "tool:");
    ::kill(*host_pid, SIGKILL);
    killed = true;
    return true;
  }, 2ms, 120s);
  REQUIRE(reached);
  auto interrupted = first.get();
  INFO(interrupted.out << interrupted.err);
  REQUIRE(killed);
  REQUIRE(interrupted.code == 128 + SIGKILL);
  INFO("killed after " << llm_at_kill << " model calls and " << tools_at_kill << " tool bodies were journaled");
  CHECK(llm_at_kill < 4);  // the kill came before the writer's answer
  CHECK(tools_at_kill >= tools_before_kill);

  auto resumed = testing::run_program(CAIRN_BIN, {"resume", "crash"}, dir.path(), crash.options);
  INFO(resumed.out << resumed.err);
  REQUIRE(resumed.code == 0);
  auto run = crash.record();
  REQUIRE(run);
  REQUIRE(run->status == storage::run_status::completed);
  CHECK(run->output == reference->output);
  CHECK(crash.step_names() == calm.step_names());

  // Every model request reached the mock once: 4 requests, 4 distinct bodies.
  std::set<std::string> bodies;
  for (const auto& request : mock.requests()) bodies.insert(request["body_hash"].get<std::string>());
  CHECK(mock.requests().size() == 4);
  CHECK(bodies.size() == mock.requests().size());
  // Every tool body ran once.
  auto lines = crash.tool_lines();
  CHECK(lines.size() == 2);
  CHECK(std::set<std::string>(lines.begin(), lines.end()).size() == lines.size());
}

TEST_CASE("a model call the grant refuses reaches the framework as a 403 it raises: the run fails at once, naming the grant") {
  require_example_installed();
  testing::temp_dir dir;
  json policy = json::parse(testing::slurp(example / "agent.policy.json"));
  policy["tools"]["llm.chat"]["models"] = {"another-model"};
  std::ofstream(dir / "policy.json") << policy.dump();
  engine::test::mock_server mock({"--script", (example / "mock_script.json").string()});
  example_run refused(dir, mock, "refused", dir / "policy.json");

  const auto started = std::chrono::steady_clock::now();
  auto result = refused.start();
  INFO(result.out << result.err);
  CHECK(std::chrono::steady_clock::now() - started < 60s);
  auto run = refused.record();
  REQUIRE(run);
  REQUIRE(run->status == storage::run_status::failed);
  CHECK(run->attempts == 1);
  CHECK_THAT(run->error->message, Catch::Contains("403") && Catch::Contains("\"gpt-4o-mini\" is not granted"));
  CHECK(refused.step_names() == std::vector<std::string>{"llm.chat"});
  CHECK(mock.requests().empty());
  CHECK(refused.tool_lines().empty());
}
