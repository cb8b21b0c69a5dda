// The journal's side of `cairn fork` (engine::fork, which checks the
// request and gives the fork its agent and its folder; the simulator forks
// through it too).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "engine/ledger.hpp"
#include "engine/workspace_checkpoints.hpp"

namespace cairn::engine {

struct fork_written {
  std::optional<std::string> refused;  // why nothing was written
  bool restored = false;               // `fill` was given the files of a checkpoint
};

// Makes `fork` of run `from`'s journal up to and including step `seq`
// (ledger::fork_run): refused, with nothing written, for an id that exists,
// a step past the last of `from`, or a tool call in doubt at or before it.
// When `from` kept a checkpoint at or before `seq`, the fork is held by
// `owner` (so that no host executes it half made) while it gets the pieces
// and baseline of `from` (fork_checkpoints) and `fill` writes its workspace
// from the files given, then is released unless `hold`; else `fill` gets
// nullopt, and the fork is held by `owner` only with `hold`. When `fill`
// throws, the fork is left failed, saying why, and this throws.
fork_written write_fork(ledger& writes, storage::journal& journal, storage::new_run fork, const std::string& from,
                        std::uint64_t seq, bool hold, const std::string& owner,
                        const std::function<void(const std::optional<workspace_state>&)>& fill);

}  // namespace cairn::engine
