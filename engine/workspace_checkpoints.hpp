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
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/effects.hpp"
#include "storage/journal.hpp"

namespace cairn::engine {

using json = nlohmann::json;

// The kind of the event a checkpoint is recorded as, and of the one that
// records the workspace as the run's first checkpointing attempt found it
// (no step's: folded before every checkpoint).
inline constexpr std::string_view checkpoint_event = "workspace_checkpoint";
inline constexpr std::string_view baseline_event = "workspace_baseline";

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
// The same, folded from `events` (the run's, oldest first; `run_id` names it in errors).
workspace_state checkpoint_state(std::span<const storage::event_record> events, std::string_view run_id,
                                 std::optional<std::uint64_t> seq = std::nullopt);

// Applies one checkpoint event's data to `state` (what checkpoint_state folds).
// Throws std::exception for data it cannot read.
void apply_checkpoint(workspace_state& state, const json& data);

// What every checkpoint of `run_id` stored, compressed ("bytes" summed):
// what limits.checkpoint_mb bounds.
std::uint64_t checkpoint_bytes(storage::journal& journal, std::string_view run_id);

// Whether `run_id` has a checkpoint at or before `seq`.
bool has_checkpoint(storage::journal& journal, std::string_view run_id, std::uint64_t seq);

// What an attempt needs of the run's checkpoints, out of its events (read
// once, by the thread that owns the journal connection): the files as the
// last checkpoint left them, whether there is any checkpoint (a baseline
// counts), whether the attempt before the current one ended without
// handing the run back (its sandbox or its host died, or the host ended
// it: what it wrote after its last step is half done, and rolls back), and
// what the checkpoints stored.
struct checkpoint_history {
  workspace_state state;
  bool any = false;
  bool previous_crashed = false;
  std::uint64_t bytes = 0;
};
// `events`: at least those of checkpoint_history_kinds.
checkpoint_history checkpoint_history_of(std::string_view run_id, const std::vector<storage::event_record>& events);
inline constexpr std::string_view checkpoint_history_kinds[] = {
    checkpoint_event, baseline_event, "attempt_started", "attempt_crashed", "run_waiting", "run_released",
    "run_completed",  "run_failed",   "run_cancelled",   "run_in_doubt",    "run_reset"};

// Where pieces are read from by digest: nullopt for one it does not hold.
using piece_source = std::function<std::optional<storage::blob>(const std::string& digest)>;
// The journal's pieces (find_blob).
piece_source pieces_of(storage::journal& journal);

// A piece's bytes, decoded from its stored encoding ("z" and a zstd frame,
// or "r" and the bytes) and checked against its size and digest. Throws
// engine_error(not_found) for one that does not match, naming its digest.
std::string unpack_piece(const storage::blob& b);

// Writes the files of `state` into `folder` (made when missing; it must hold
// nothing), their pieces read from the journal (or `find`), never following
// a link. Throws engine_error(not_found) when a piece is missing.
void materialize(storage::journal& journal, const workspace_state& state, const std::filesystem::path& folder);
void materialize(const piece_source& find, const workspace_state& state, const std::filesystem::path& folder);

// The bytes of the file `e` (the first `max_bytes`), handed to `take` a
// piece at a time, read from the journal and checked against their digests.
void read_checkpoint_file(storage::journal& journal, const checkpoint_entry& e, std::uint64_t max_bytes,
                          const std::function<void(const char*, std::size_t)>& take);
void read_checkpoint_file(const piece_source& find, const checkpoint_entry& e, std::uint64_t max_bytes,
                          const std::function<void(const char*, std::size_t)>& take);

// What changed from `a` to `b`: '+' an entry only `b` has, '-' one only `a`
// has, 'M' one both have but not alike (its bytes, type, mode or target;
// not its time alone). By path.
struct workspace_change {
  char how = 'M';
  std::string path;
  std::optional<checkpoint_entry> before, after;
};
std::vector<workspace_change> diff_states(const workspace_state& a, const workspace_state& b);

// The checkpoint state of `run_id` after step `seq`, for a person asking:
// throws engine_error(not_found) when the run has no step `seq`, or kept no
// checkpoint at or before it (it names limits.checkpoint_mb).
workspace_state checkpoint_at(storage::journal& journal, std::string_view run_id, std::uint64_t seq);

// For a fork: run `to` references every piece the checkpoints of run `from`
// up to and including `seq` name, so removing `from` keeps them, and gets
// the baseline of `from`. The fork's own copies of those checkpoint events
// (copied with the rest of the journal's prefix) then fold to the same
// files: the files of `from` at `seq`, returned.
workspace_state fork_checkpoints(storage::journal& journal, std::string_view from, std::uint64_t seq,
                                 std::string_view to);

// An entry of the workspace as found now, for the next checkpoint: a
// file's pieces (at most 1 MiB each) with their bytes, in order.
struct found_entry {
  checkpoint_entry entry;
  std::vector<std::pair<std::string, std::string>> pieces;  // digest, bytes
};
// A file of `bytes`, as found now.
found_entry found_file(std::string_view bytes, std::uint32_t mode, std::int64_t mtime_ns);

// A run's checkpoints as one attempt takes them, whatever finds what
// changed (workspace_checkpointer's watch of a folder; the simulator's
// fake): the files the last one left, the pieces the run's checkpoints
// hold, what they stored against limits.checkpoint_mb.
class checkpoint_chain {
 public:
  checkpoint_chain(workspace_state state, std::uint64_t budget_bytes, std::uint64_t spent_bytes);

  // The checkpoint that takes the state to what `found` says of the paths
  // it names (nullopt: nothing is there now), storing the pieces the run
  // holds not yet; nullopt when nothing changed. The state moves on (a
  // commit that fails ends the attempt). Throws budget_exceeded when the
  // new pieces would take the run past `budget_bytes` (0: no limit).
  std::optional<workspace_checkpoint> next(const std::map<std::string, std::optional<found_entry>>& found);

  const workspace_state& state() const { return state_; }

 private:
  workspace_state state_;
  std::set<std::string> known_;  // digests the run's checkpoints name
  std::uint64_t budget_ = 0, spent_ = 0;
};

// An attempt's checkpoints. Made as the attempt begins, before the agent
// is told to start: watches the workspace `folder` (mounted where the
// sandbox has it), then walks it once against `state`, the run's last
// checkpoint. What differs is either the next checkpoint's to store, or,
// with `roll_back` (the attempt before crashed), put back as `state` has
// it. Throws runtime::sandbox_error when the workspace cannot be watched.
class workspace_checkpointer {
 public:
  // `pieces`: where a roll-back reads the pieces it writes (called on the
  // constructing thread only).
  workspace_checkpointer(const piece_source& pieces, const std::filesystem::path& folder, workspace_state state,
                         bool roll_back, std::uint64_t budget_bytes, std::uint64_t spent_bytes);
  ~workspace_checkpointer();
  workspace_checkpointer(const workspace_checkpointer&) = delete;
  workspace_checkpointer& operator=(const workspace_checkpointer&) = delete;

  // What changed since the last checkpoint, read and stored as pieces, for
  // the step about to commit; nullopt when nothing did. The state moves on
  // (a commit that fails ends the attempt). Throws budget_exceeded when the
  // new pieces would take the run past limits.checkpoint_mb.
  std::optional<workspace_checkpoint> take();

  // What the walk as the attempt began found and put back (roll_back).
  std::size_t rolled_back() const { return rolled_back_; }

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
  std::size_t rolled_back_ = 0;
};

}  // namespace cairn::engine
