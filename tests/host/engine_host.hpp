// An engine over a fresh journal and CAIRN_HOME, for host tests that drive
// runs in this process: submit with a policy, count the events a run left.
#pragma once

#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <string>

#include "engine/engine.hpp"
#include "tests/temp_dir.hpp"

namespace cairn::testing {

struct engine_host {
  temp_dir dir;
  std::unique_ptr<storage::journal> journal = storage::open_journal(dir / "cairn.db");
  engine::engine_options options;
  std::unique_ptr<engine::engine> eng;

  // Runs that wait longer than `suspend_after` are suspended.
  explicit engine_host(std::chrono::milliseconds suspend_after) {
    options.home = dir / "home";
    options.retry_backoff = std::chrono::milliseconds(10);
    options.suspend_after = suspend_after;
    eng = std::make_unique<engine::engine>(*journal, options);
  }

  void submit(const std::string& id, const std::string& agent, const nlohmann::json& input,
              const nlohmann::json& policy = nlohmann::json::object(), int max_attempts = 3) {
    engine::run_request r;
    r.id = id;
    r.agent = agent;
    r.input = input;
    r.workspace = dir / "ws" / id;
    r.policy = engine::parse_policy(policy);
    r.max_attempts = max_attempts;
    REQUIRE(eng->submit(r).second);
  }

  int count(const std::string& id, const std::string& kind) {
    int n = 0;
    for (const auto& e : journal->events(id)) n += e.kind == kind;
    return n;
  }
};

}  // namespace cairn::testing
