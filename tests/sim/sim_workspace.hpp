// The simulator's workspaces (sim.hpp): a run's files as a map in memory,
// path -> bytes, and what keeps their checkpoints for an attempt, as the
// engine's workspace_checkpointer does for a folder: the engine's
// checkpoint_chain makes each checkpoint of what the agent changed, and a
// roll-back after a crash puts back the last one's files, their bytes read
// from the journal's pieces. Where the engine watches a folder with
// inotify and walks it, this one compares the map, small, at every take.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "engine/attempt.hpp"
#include "engine/workspace_checkpoints.hpp"

namespace cairn::sim {

// A workspace: relative path -> the file's bytes.
using files = std::map<std::string, std::string>;

// The files as a checkpoint records them (engine::found_file of each).
engine::workspace_state state_of(const files& f);
// The files `state` names, their bytes read from `pieces` and checked
// against their digests (engine::read_checkpoint_file).
files files_of(const engine::piece_source& pieces, const engine::workspace_state& state);

class fake_keeper final : public engine::workspace_keeper {
 public:
  // `workspace` must outlive it. `state`: the run's last checkpoint; with
  // `roll_back`, the workspace is made to hold its files again.
  fake_keeper(files& workspace, const engine::piece_source& pieces, engine::workspace_state state, bool roll_back,
              std::uint64_t budget_bytes, std::uint64_t spent_bytes);

  std::optional<engine::workspace_checkpoint> take() override;
  // How many files the roll-back wrote or removed.
  std::size_t rolled_back() const { return rolled_back_; }
  // The files as the last take() found them: what the step it was taken
  // for holds, once committed.
  const files& taken() const { return taken_; }

 private:
  files& workspace_;
  engine::checkpoint_chain chain_;
  std::size_t rolled_back_ = 0;
  files taken_;
  files unchanged_;  // as the chain's state has them
};

}  // namespace cairn::sim
