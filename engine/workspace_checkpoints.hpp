// Workspace checkpoints: the files a run's agent wrote in /workspace, kept
// with its steps. When a step commits, what changed in the workspace since
// the run's last checkpoint is stored by content in the journal (pieces of
// at most 1 MiB, named by their SHA-256, zstd-compressed, shared by every
// run) and a "workspace_checkpoint" event at the step's seq lists it: the
// files that are new or changed, and the paths that went. The journal and
// the files agree after any crash, since both are one transaction.
//
// What changed is told by inotify (runtime/workspace_changes.hpp), not by
// walking the tree at every step: an attempt walks the workspace once, when
// it begins, comparing it with the last checkpoint.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "storage/journal.hpp"

namespace cairn::engine {

using json = nlohmann::json;

// The kind of the event a checkpoint is recorded as.
inline constexpr std::string_view checkpoint_event = "workspace_checkpoint";

// One entry of a workspace as a checkpoint recorded it.
struct checkpoint_entry {
  char type = 'f';            // 'f' file, 'd' folder, 'l' symbolic link
  std::uint32_t mode = 0;     // permission bits (07777)
  std::uint64_t size = 0;     // of a file
  std::int64_t mtime_ns = 0;  // of a file: with size, how an unchanged file is told at an attempt's walk
  std::vector<std::string> pieces;  // of a file: digests of its pieces, in order
  std::string target;               // of a link: what it names (never followed)
  bool operator==(const checkpoint_entry&) const = default;
};

// A workspace: relative path ("a/b.txt") -> entry. Folders before what they hold.
using workspace_state = std::map<std::string, checkpoint_entry>;

// The workspace of `run_id` as its checkpoints left it after step `seq`
// (every checkpoint at or before seq, folded; all of them when nullopt).
// Empty when the run has none. Throws storage_error(corrupt) for a
// checkpoint event it cannot read.
workspace_state checkpoint_state(storage::journal& journal, std::string_view run_id,
                                 std::optional<std::uint64_t> seq = std::nullopt);

// Applies one checkpoint event's data to `state` (what checkpoint_state folds).
// Throws std::exception for data it cannot read.
void apply_checkpoint(workspace_state& state, const json& data);

// Whether `run_id` has a checkpoint at or before `seq`.
bool has_checkpoint(storage::journal& journal, std::string_view run_id, std::uint64_t seq);

// Writes the files of `state` into `folder` (made when missing; it must hold
// nothing), their pieces read from the journal, never following a link.
// Throws engine_error(not_found) when a piece is missing from the journal.
void materialize(storage::journal& journal, const workspace_state& state, const std::filesystem::path& folder);

// For a fork: run `to` references every piece the checkpoints of run `from`
// up to and including `seq` name, so removing `from` keeps them, and its
// workspace `folder` (empty or missing) is filled with the files of `from`
// at `seq`. The fork's own copies of those checkpoint events (copied with
// the rest of the journal's prefix) then fold to the same files.
void fork_workspace(storage::journal& journal, std::string_view from, std::uint64_t seq, std::string_view to,
                    const std::filesystem::path& folder);

}  // namespace cairn::engine
