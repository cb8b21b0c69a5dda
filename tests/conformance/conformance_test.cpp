// The SDK conformance suite (SCENARIOS.md): every scenario, written once here,
// run on the conformance agent of each SDK through the engine and a real
// sandbox; then the SDKs facing a hostile host, played by this test.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <future>
#include <sstream>
#include <thread>

#include <catch2/catch.hpp>

#include "engine/attempt.hpp"
#include "tests/conformance/sdk_agents.hpp"
#include "tests/host/engine_host.hpp"

using namespace cairn;
using namespace std::chrono_literals;
using json = nlohmann::json;
using storage::run_status;
namespace fs = std::filesystem;

namespace {

using testing::conformance_agents;
using testing::sdk_agent;

struct emits : engine::run_observer {
  std::vector<json> seen;
  void on_emit(const json& event) override { seen.push_back(event); }
};

struct host : testing::engine_host {
  explicit host(std::chrono::milliseconds suspend_after = 200ms) : engine_host(suspend_after) {}

  storage::run_record start(const sdk_agent& agent, const std::string& id, const json& input,
                            const json& policy = json::object()) {
    submit(id, agent.program.string(), input, policy);
    return finish(id);
  }

  // Executes the run until it ends, resuming it when a suspension is over
  // and executing its children (as `cairn serve` would); at most 120 s.
  storage::run_record finish(const std::string& id, engine::run_observer* observer = nullptr) {
    const auto until = std::chrono::steady_clock::now() + 120s;
    for (;;) {
      auto run = eng->execute(id, observer);
      if (run.status != run_status::waiting && run.status != run_status::pending) return run;
      for (const auto& child : journal->children(id))
        if (child.status == run_status::pending || child.status == run_status::waiting) finish(child.id);
      REQUIRE(std::chrono::steady_clock::now() < until);
      std::this_thread::sleep_for(20ms);
    }
  }

  // How many times the agent's step bodies logged `line` (an ended run's
  // files are in its workspace folder; a live one's may be in its image).
  int logged(const std::string& id, const std::string& line) {
    const auto image = options.home / "images" / (id + ".img");
    std::stringstream log;
    if (fs::exists(image)) {
      const std::string read = "debugfs -R 'cat /effects.log' " + image.string() + " 2>/dev/null";
      std::unique_ptr<FILE, int (*)(FILE*)> out(::popen(read.c_str(), "r"), ::pclose);
      char buffer[4096];
      for (std::size_t n; out && (n = std::fread(buffer, 1, sizeof buffer, out.get())) > 0;) log.write(buffer, n);
    } else {
      log << std::ifstream(dir / "ws" / id / "effects.log").rdbuf();
    }
    int n = 0;
    for (std::string l; std::getline(log, l);) n += l == line;
    return n;
  }

  json journaled(const std::string& id, const std::string& name) {
    for (const auto& s : journal->steps(id))
      if (s.result.name == name) return s.result.output;
    FAIL("no step named " << name << " in the journal of " << id);
    return nullptr;
  }
};

std::string error_of(const storage::run_record& run) {
  return run.error ? run.error->type + ": " + run.error->message : std::string();
}

std::string blob(int i, std::size_t n) {
  std::string s(n, 'a');
  for (std::size_t j = 0; j < n; ++j) s[j] = static_cast<char>(97 + (j * 7 + static_cast<std::size_t>(i)) % 26);
  return s;
}

}  // namespace

TEST_CASE("conformance: steps journaled before a crash are replayed, not run again") {
  const auto agent = GENERATE(from_range(conformance_agents()));
  INFO(agent.language);
  host h;
  auto run = h.start(agent, "r", {{"scenario", "steps"}, {"n", 5}, {"crash_at", 2}});
  INFO(error_of(run));
  REQUIRE(run.status == run_status::completed);
  CHECK(run.output == json{{"sum", 30}, {"attempt", 2}});
  CHECK(h.journal->step_count("r") == 5);
  for (const auto* once : {"s0", "s1", "s3", "s4"}) CHECK(h.logged("r", once) == 1);
  // Its body crashed before its result was sent: what it wrote was rolled
  // back with the workspace, and the log holds the execution journaled.
  CHECK(h.logged("r", "s2") == 1);
}

TEST_CASE("conformance: code that no longer matches its journal fails the run, even if it catches the error") {
  const auto agent = GENERATE(from_range(conformance_agents()));
  INFO(agent.language);
  host h;
  auto run = h.start(agent, "nd", {{"scenario", "nondeterminism"}});
  REQUIRE(run.status == run_status::failed);
  REQUIRE(run.error);
  CHECK(run.error->type == "nondeterminism");
  CHECK_THAT(run.error->message, Catch::Contains("'b'") && Catch::Contains("'c'"));
  CHECK(h.logged("nd", "c") == 0);  // the mismatched step never ran
  CHECK(h.logged("nd", "a") == 1);
}

TEST_CASE("conformance: patched takes the new branch only where the journal has not passed its point") {
  const auto agent = GENERATE(from_range(conformance_agents()));
  INFO(agent.language);
  host h;
  auto run = h.start(agent, "pt", {{"scenario", "patched"}});
  INFO(error_of(run));
  REQUIRE(run.status == run_status::completed);
  CHECK(run.output == json{{"first", false}, {"second", true}, {"attempt", 3}});
  std::vector<std::string> journaled;
  for (const auto& s : h.journal->steps("pt"))
    journaled.push_back(std::string(protocol::to_string(s.result.kind)) + " " + s.result.name);
  // fix-1 left no marker (old code had passed it); fix-2's, journaled live, was replayed.
  CHECK(journaled == std::vector<std::string>{"step a", "step old", "patch fix-2"});
  CHECK(h.logged("pt", "old") == 1);
  CHECK(h.logged("pt", "new") == 0);
}

TEST_CASE("conformance: a failing step is retried by the host with the backoff the agent asked for") {
  const auto agent = GENERATE(from_range(conformance_agents()));
  INFO(agent.language);
  host h;
  auto run = h.start(agent, "flaky", {{"scenario", "retry"}});
  INFO(error_of(run));
  REQUIRE(run.status == run_status::completed);
  CHECK(run.output == json{{"value", "ok"}});
  CHECK(h.logged("flaky", "flaky") == 3);
  auto retries = h.journal->events("flaky");
  std::vector<std::int64_t> delays;
  for (const auto& e : retries)
    if (e.kind == "step_retry") delays.push_back(e.data.value("delay_ms", std::int64_t{-1}));
  CHECK(delays == std::vector<std::int64_t>{50, 100});  // jitter 0: exactly the asked backoff
}

TEST_CASE("conformance: a step out of attempts raises the SDK's step-failed error, which the workflow catches") {
  const auto agent = GENERATE(from_range(conformance_agents()));
  INFO(agent.language);
  host h;
  auto run = h.start(agent, "ex", {{"scenario", "exhausted"}});
  INFO(error_of(run));
  REQUIRE(run.status == run_status::completed);
  CHECK(run.output["step"] == "always");
  CHECK_THAT(run.output["message"].get<std::string>(), Catch::Contains("always broken"));
  CHECK(h.logged("ex", "always") == 2);
}

TEST_CASE("conformance: a terminal error is not retried and fails the run") {
  const auto agent = GENERATE(from_range(conformance_agents()));
  INFO(agent.language);
  host h;
  auto run = h.start(agent, "t", {{"scenario", "terminal"}});
  REQUIRE(run.status == run_status::failed);
  REQUIRE(run.error);
  CHECK_THAT(run.error->message, Catch::Contains("bad input"));
  CHECK(h.logged("t", "fatal") == 1);
  CHECK(h.count("t", "step_retry") == 0);
}

TEST_CASE("conformance: a signal's payload reaches the waiting workflow; a wait with a timeout gives up") {
  const auto agent = GENERATE(from_range(conformance_agents()));
  INFO(agent.language);
  host h;
  h.submit("s", agent.program.string(), {{"scenario", "signals"}});
  REQUIRE(h.eng->execute("s").status == run_status::waiting);  // suspended, no signal yet
  h.eng->signal("s", "approval", {{"ok", true}, {"by", "ana"}});
  auto run = h.finish("s");
  INFO(error_of(run));
  REQUIRE(run.status == run_status::completed);
  CHECK(run.output == json{{"approval", {{"ok", true}, {"by", "ana"}}}, {"absent", nullptr}});
}

TEST_CASE("conformance: a durable sleep waits its time; now and random come back from the journal after a crash") {
  const auto agent = GENERATE(from_range(conformance_agents()));
  INFO(agent.language);
  host h;
  auto run = h.start(agent, "tm", {{"scenario", "timers"}, {"crash", true}});
  INFO(error_of(run));
  REQUIRE(run.status == run_status::completed);
  CHECK(run.output["attempt"] == 2);
  CHECK(run.output["slept_ms"].get<std::int64_t>() >= 300);
  const double r = run.output["random"].get<double>();
  CHECK((r >= 0 && r < 1));
  // Replayed, not drawn again: what the journal holds, under the names every SDK uses.
  CHECK(run.output["random"] == h.journaled("tm", "ctx.random"));
  CHECK(run.output["now0"] == h.journaled("tm", "ctx.now"));
}

TEST_CASE("conformance: a child run's output is joined; a failed child raises the SDK's child-failed error") {
  const auto agent = GENERATE(from_range(conformance_agents()));
  INFO(agent.language);
  host h;
  auto run = h.start(agent, "p", {{"scenario", "children"}, {"agent", agent.program.filename().string()}});
  INFO(error_of(run));
  REQUIRE(run.status == run_status::completed);
  CHECK(run.output["child"] == json{{"sum", 5}, {"attempt", 1}});
  CHECK(run.output["failed_type"] == "child_failed");
  auto child = h.journal->find_run(run.output["child_run"].get<std::string>());
  REQUIRE(child);
  CHECK(child->status == run_status::completed);
}

TEST_CASE("conformance: a cancel reaches a workflow between steps and the run ends cancelled") {
  const auto agent = GENERATE(from_range(conformance_agents()));
  INFO(agent.language);
  host h(60s);
  h.submit("c", agent.program.string(), {{"scenario", "cancel"}});
  auto done = std::async(std::launch::async, [db = h.dir / "cairn.db", o = h.options] {
    auto j = storage::open_journal(db);
    engine::engine e(*j, o);
    return e.execute("c");
  });
  const auto until = std::chrono::steady_clock::now() + 60s;
  while (h.journal->step_count("c") < 2 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(20ms);
  REQUIRE(h.journal->step_count("c") >= 2);
  h.eng->cancel("c", "enough ticks");
  REQUIRE(done.wait_for(60s) == std::future_status::ready);
  auto run = done.get();
  CHECK(run.status == run_status::cancelled);
  REQUIRE(run.error);
  CHECK(run.error->type == "cancelled");
  CHECK(h.logged("c", "started") == 1);
}

TEST_CASE("conformance: a step output near the frame limit is journaled and returned whole") {
  const auto agent = GENERATE(from_range(conformance_agents()));
  INFO(agent.language);
  host h;
  const std::size_t bytes = 15 * 1024 * 1024 - 64;  // with its frame's other fields, just under 16 MiB
  auto run = h.start(agent, "big", {{"scenario", "large_output"}, {"bytes", bytes}},
                     {{"limits", {{"step_output_mb", 15}}}});
  INFO(error_of(run));
  REQUIRE(run.status == run_status::completed);
  CHECK(run.output == json{{"length", bytes}, {"head", blob(0, 16)}});
}

TEST_CASE("conformance: a history larger than a frame is replayed in chunks after a crash") {
  const auto agent = GENERATE(from_range(conformance_agents()));
  INFO(agent.language);
  host h;
  auto run = h.start(agent, "hist", {{"scenario", "big_history"}, {"blobs", 5}, {"blob_bytes", 4'000'000}});
  INFO(error_of(run));
  REQUIRE(run.status == run_status::completed);
  CHECK(run.output == json{{"verified", 5}, {"attempt", 2}});
  // What the replay carried, as read back (the journal stores it compressed).
  std::uint64_t history = 0;
  for (const auto& s : h.journal->steps("hist")) history += s.result.output.dump().size();
  CHECK(history > 20'000'000);
}

TEST_CASE("conformance: an emitted event reaches the run's observer") {
  const auto agent = GENERATE(from_range(conformance_agents()));
  INFO(agent.language);
  host h;
  h.submit("e", agent.program.string(), {{"scenario", "emit"}});
  emits seen;
  auto run = h.finish("e", &seen);
  INFO(error_of(run));
  REQUIRE(run.status == run_status::completed);
  REQUIRE(seen.seen.size() == 1);
  CHECK(seen.seen[0] == json{{"progress", 1}});
}
