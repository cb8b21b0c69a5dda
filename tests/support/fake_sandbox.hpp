// A sandbox backend for the engine's tests that starts no process: its agent
// is a workflow of the real C++ SDK (cairn::run) in a thread of the test,
// speaking the real protocol over a socketpair, so the driver, the ledger
// and the scheduler run as they do with bwrap, without fork, exec, mounts or
// the machine's load. What bwrap adds (namespaces, limits, images) is
// tested in tests/runtime; what the fake promises of a process (exit codes,
// a kill that ends the agent's channel, idempotent kills, wait_for) is held
// to the process backend's by fake_sandbox_test.cpp.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include <cairn/cairn.hpp>

#include "runtime/sandbox.hpp"

namespace cairn::testing {

// What a fake agent gets besides the SDK's context: its workspace (the
// folder a real agent sees as /workspace; the test's threads share one
// working directory, so the agent names its files through it), and a sleep
// that a kill interrupts (a killed agent's step never finishes, as a killed
// process's would not).
class fake_agent_env {
 public:
  const std::filesystem::path& workspace() const { return workspace_; }
  // Sleeps `ms`, or until the sandbox is killed; true if it was killed.
  bool sleep(std::chrono::milliseconds ms) const;
  bool killed() const;
  // Dies as a process killed by `signal` would, at once: the host sees the
  // channel end without done or fail, and the exit status. Never returns.
  [[noreturn]] void crash(int signal) const;
  // Appends `line` to the workspace's file `name` (as the test agents keep exec.log).
  void append(const std::string& name, const std::string& line) const;

 private:
  friend class fake_process;
  std::filesystem::path workspace_;
  struct shared;
  std::shared_ptr<shared> state_;
};

// An agent: a workflow with its environment. What it returns is the run's
// output; cairn::run turns what it throws into the run's failure, as in a
// real agent.
using fake_agent = std::function<json(context& ctx, const json& input, const fake_agent_env& env)>;

class fake_backend : public runtime::sandbox_backend {
 public:
  // Registers `agent` as folder/name, and makes that file (an executable
  // that is no script: the engine checks the program before the sandbox
  // runs it); exec of that path runs the agent. Returns the path.
  std::filesystem::path add_agent(const std::filesystem::path& folder, const std::string& name, fake_agent agent);

  std::string name() const override { return "fake"; }
  std::unique_ptr<runtime::sandbox> create(const runtime::sandbox_spec& spec) override;
  std::vector<runtime::doctor_check> check() const override { return {}; }
  void release_workspace(const std::filesystem::path&, const std::filesystem::path&) override {}
  runtime::workspace_upkeep upkeep(const std::filesystem::path&) const override { return {}; }

  // What happened, for the tests' assertions.
  std::atomic<int> sandboxes{0};  // created
  std::atomic<int> agents{0};     // started
  std::atomic<int> kills{0};      // of an agent still in its conversation (not one that closed its channel)

 private:
  friend class fake_sandbox;
  std::mutex mutex_;
  std::map<std::string, fake_agent> agents_;
};

}  // namespace cairn::testing
