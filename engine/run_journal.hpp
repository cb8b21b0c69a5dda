// The engine's side of attempt_journal (attempt.hpp) for one attempt of one
// run: reads from the engine's journal connection, charges what the agent
// makes the host store against the run's journal limits, and hands the
// effects to the ledger.
#pragma once

#include <filesystem>
#include <string>

#include "engine/attempt.hpp"
#include "engine/journal_budget.hpp"
#include "engine/ledger.hpp"
#include "engine/workspace_checkpoints.hpp"

namespace cairn::engine {

// What watch_workspace opens an attempt's workspace with:
// workspace_checkpointer's arguments, and the run.
struct workspace_opening {
  const storage::run_record& run;
  const piece_source& pieces;  // where a roll-back reads the pieces it writes
  workspace_state state;       // as the run's last checkpoint left it
  bool roll_back = false;      // the attempt before crashed: put `state` back
  std::uint64_t budget_bytes = 0, spent_bytes = 0;
};
struct opened_workspace {
  std::unique_ptr<workspace_keeper> keeper;
  std::size_t rolled_back = 0;  // entries the roll-back wrote or removed
};
// Throws runtime::sandbox_error when the workspace cannot be watched.
using workspace_opener = std::function<opened_workspace(workspace_opening)>;

class run_journal : public attempt_journal {
 public:
  // Everything given must outlive it.
  run_journal(ledger& writes, storage::journal& reads, const std::filesystem::path& home, const std::string& run_id,
              const journal_limits& limits);

  task<void> apply(effect e) override;
  task<std::optional<std::string>> start_child(storage::new_run child, const policy& p) override;
  std::uint64_t step_count() override;
  std::vector<protocol::step_result> history(std::uint64_t from, std::uint64_t until, std::uint64_t max_bytes) override;
  int step_failures(std::uint64_t seq) override;
  int tool_attempts(std::uint64_t seq) override;
  std::optional<effects::timer_set> timer_at(std::uint64_t seq) override;
  std::optional<effects::wait_started> wait_at(std::uint64_t seq) override;
  std::optional<std::string> cancel_requested() override;
  task<void> confirm_held() override;
  std::optional<storage::signal_record> pending_signal(const std::string& name) override;
  std::optional<storage::run_record> find_run(const std::string& id) override;
  std::uint64_t llm_tokens_spent() override;
  task<workspace_watch> watch_workspace(const storage::run_record& run, const policy& p) override;
  // A test's seam: what watch_workspace opens the workspace with, instead
  // of a workspace_checkpointer on the run's folder (the simulator's fake).
  void open_workspaces_with(workspace_opener opener) { opener_ = std::move(opener); }

 private:
  ledger& writes_;
  storage::journal& reads_;
  const std::filesystem::path& home_;
  const std::string& run_id_;
  journal_budget budget_;
  workspace_opener opener_;
};

// The model tokens a step's result counts: an llm.chat result's usage
// (run_state.hpp keeps their sum).
std::uint64_t tokens_of_step(const protocol::step_result& step);

}  // namespace cairn::engine
