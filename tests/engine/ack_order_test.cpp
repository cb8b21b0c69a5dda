// Acknowledgement order, proved. One host process (durability_host.hpp)
// drives several runs at once, so its journal batches hold the steps of many
// runs: plain steps, ctx.now, tool calls, a timer, signals taken, a child run
// started and joined. The host is killed (SIGKILL, runtime/crash_point.hpp) at
// every occurrence of every point between receiving a step and its next
// action: before the commit, after it, after the answer, inside a tool call
// and a child start, and in the ledger before a group commit and after one
// that carried the writes of several runs, before any of them was answered. An observer in each agent that outlives the host
// (tests/agents/durability_agent.cpp) keeps every byte the host wrote to the
// agent. After each death every acknowledgement and result an agent was sent
// must be in the journal, unchanged: an answer that goes out before its
// commit is caught at the first death in between.
#include <catch2/catch.hpp>

#include <cstdio>

#include "tests/engine/durability_host.hpp"
#include "tests/temp_dir.hpp"

using namespace cairn;
using namespace cairn::testing;

namespace {

const std::vector<std::pair<std::string, json>> runs = {
    {"ack-a", {{"steps", 3}, {"tool", true}, {"signal", "go"}, {"child", true}}},
    {"ack-b", {{"steps", 3}, {"tool", true}}},
    {"ack-c", {{"steps", 2}, {"sleep_ms", 20}, {"signal", "go"}}},
};

// Starts the runs in a fresh home and kills the host at the n-th time it
// reaches `point`. False when the host finished first (fewer occurrences).
bool dies_at(const std::string& point, int n, int& acknowledgements) {
  temp_dir home;
  std::vector<std::string> ids;
  {
    auto journal = storage::open_journal(home / "cairn.db");
    engine::engine eng(*journal, host_engine_options(home.path()));
    for (const auto& [id, input] : runs) {
      ids.push_back(id);
      eng.submit(durability_run(home.path(), id, input));
      if (input.contains("signal")) journal->enqueue_signal(id, input["signal"].get<std::string>(), {{"n", 1}});
    }
  }
  const std::string spec = point + ":" + std::to_string(n);
  pid_t host = start_host(
      home.path(), ids, [&] { ::setenv("CAIRN_CRASH_POINT", spec.c_str(), 1); }, [](engine::engine&) {});
  const int status = wait_status(host);
  INFO("CAIRN_CRASH_POINT=" << spec << "; host log: " << std::ifstream(home / "host.log").rdbuf());
  if (WIFEXITED(status)) {
    REQUIRE(WEXITSTATUS(status) == 0);
    return false;
  }
  REQUIRE((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL));
  observed_channels channels(home.path());
  auto told_agents = channels.collect();
  acknowledgements += static_cast<int>(told_agents.size());
  REQUIRE(missing_from_journal(home / "cairn.db", told_agents) == "");
  return true;
}

}  // namespace

TEST_CASE("the host dies at every point between a step and its next action: every acknowledgement is journaled") {
  const auto started = std::chrono::steady_clock::now();
  int deaths = 0, acknowledgements = 0;
  for (const std::string point :
       {"before_commit", "after_commit", "after_ack", "tool_started", "tool_returned", "child_created",
        "before_group_commit", "after_group_commit.many"}) {
    INFO("crash point " << point);
    int n = 1;
    while (dies_at(point, n, acknowledgements)) ++n;
    REQUIRE(n > 1);  // the point was reached at least once
    deaths += n - 1;
  }
  std::printf("ack_order_test: %d host deaths at crash points, %d acknowledgements checked, %.1f s\n", deaths,
              acknowledgements,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
}
