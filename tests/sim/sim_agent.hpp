// The simulator's agents for the real attempt driver (sim.hpp, --driver
// real): a scripted agent that speaks the real protocol (protocol/PROTOCOL.md)
// over a socketpair, one move at a time when the simulator says so, and a
// sandbox backend whose exec starts one. Like a real SDK it says hello,
// pulls the run's journaled steps with history and replays them, then makes
// the script's steps, tools, sleeps and signal waits, each answered by the
// host, and ends with done. Nothing here blocks or starts a thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "protocol/frame.hpp"
#include "protocol/messages.hpp"
#include "runtime/sandbox.hpp"

namespace cairn::sim {

using json = nlohmann::json;

// What a scripted agent does at one step.
struct op {
  // child: a child run starts; join: a later step waits for its end.
  enum kind_t { step, at_most_once, idempotent, sleep, signal, child, join } kind = step;
  std::int64_t ms = 0;  // sleep's length
  std::uint64_t of = 0;  // join: the seq of the child step it joins
};

std::string signal_name(std::uint64_t seq);
// The journaled name of a step the script of `run` makes at `seq`.
std::string step_name(const op& o, std::uint64_t seq, const std::string& run);
// The id of the child run that `parent`'s step `seq` starts (attempt_waits.cpp's rule).
std::string child_id(const std::string& parent, std::uint64_t seq);
// The agent program a child runs: this one, found in the parent's folder.
std::string child_agent();
// What the agent's plain step at `seq` of `run` returns.
json step_output(const std::string& run, std::uint64_t seq);

// What an agent tells the simulator, which holds it to what users rely on.
class agent_watcher {
 public:
  virtual ~agent_watcher() = default;
  // The agent of `worker` is about to make the step at `seq` (not a replay).
  virtual void executes(const std::string& run, const std::string& worker, std::uint64_t seq) = 0;
  // The host answered that step: from now on it is the user's.
  virtual void answered(const std::string& run, const std::string& worker, std::uint64_t seq, const json& output) = 0;
  virtual void trace(const std::string& line) = 0;
};

// The host told the agent something no correct host says: a finding.
struct agent_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class sim_agent {
 public:
  // Owns `fd`, its end of the socketpair. `script` and `watcher` must outlive it.
  sim_agent(std::string run, std::string worker, const std::vector<op>& script, int fd, agent_watcher& watcher);
  ~sim_agent();
  sim_agent(const sim_agent&) = delete;
  sim_agent& operator=(const sim_agent&) = delete;

  // One move: sends what comes next, or reads and handles one message from
  // the host. Whether anything happened. Throws agent_error.
  bool act();
  std::optional<runtime::exit_status> status() const { return status_; }
  // As SIGKILL would: the channel ends, the agent does nothing more.
  void kill();
  const std::string& run() const { return run_; }

 private:
  enum class phase { hello, start, history, ready, begun, answer, ended };
  void send(const protocol::agent_message& m);
  std::optional<protocol::host_message> receive();
  void exit(runtime::exit_status s);
  void replayed();
  bool next();
  void handle(const protocol::host_message& m);

  std::string run_, worker_;
  const std::vector<op>& script_;
  int fd_;
  agent_watcher& watcher_;
  protocol::frame_decoder decoder_;
  phase phase_ = phase::hello;
  std::uint64_t history_steps_ = 0, seq_ = 0;
  std::vector<protocol::step_result> history_;
  std::optional<runtime::exit_status> status_;
};

// The sandboxes of one simulated worker: each exec starts a sim_agent of
// the run's script. Agents are the simulator's to move (agents()).
class sim_backend final : public runtime::sandbox_backend {
 public:
  // `scripts` (run id to script) and `watcher` must outlive it.
  sim_backend(std::string worker, const std::map<std::string, std::vector<op>>& scripts, agent_watcher& watcher);

  std::string name() const override { return "sim"; }
  std::unique_ptr<runtime::sandbox> create(const runtime::sandbox_spec& spec) override;
  std::vector<runtime::doctor_check> check() const override { return {}; }
  void release_workspace(const std::filesystem::path&, const std::filesystem::path&) override {}
  runtime::workspace_upkeep upkeep(const std::filesystem::path&) const override { return {}; }

  // The agents started here that have not ended, oldest first.
  std::vector<std::shared_ptr<sim_agent>> agents();

 private:
  friend class sim_sandbox;
  std::string worker_;
  const std::map<std::string, std::vector<op>>& scripts_;
  agent_watcher& watcher_;
  std::vector<std::weak_ptr<sim_agent>> started_;
};

}  // namespace cairn::sim
