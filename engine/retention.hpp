// Retention: which ended runs go (`cairn gc`, the `retention` settings of
// `cairn serve`), and removing a run (`cairn rm`): its journal rows
// (storage's delete_run), the files this host kept for it (its log, and
// the workspace and quota image cairn made for it) and the space they
// held, given back.
//
// A pass deletes a few runs per transaction (a group commit of delete_run
// each) and pauses between transactions, so a daemon's steps keep flowing:
// a writer never waits for more than one small transaction of it, and while
// others write, the pass holds the journal for at most a share of the time
// (pause_after). Space comes back in bounded slices, paced the same way
// (journal::reclaim_space).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "storage/journal.hpp"

namespace cairn::engine {

// Which runs a retention pass removes: those with one of `statuses` (ended
// ones only), ended at least `older_than` ago, except the newest
// `keep_last` of them (by creation).
struct retention_rule {
  std::vector<storage::run_status> statuses = {storage::run_status::completed, storage::run_status::failed,
                                               storage::run_status::cancelled};
  std::optional<std::chrono::milliseconds> older_than;
  std::optional<std::size_t> keep_last;
};

// How a pass paces itself.
struct retention_pacing {
  std::size_t runs_per_transaction = 8;
  // Between two transactions at least: longer than the 2 ms a writer
  // waiting for the lock sleeps at most (sqlite/connection.hpp busy_wait),
  // so that it finds the journal free.
  std::chrono::milliseconds pause{2};
  // Of the time, what a pass holds the journal for while others write to it.
  double share = 0.1;
  // A pass's transactions skip their sync (write_together's sync_later) but
  // for one at least this often and its last; a run's files go once its
  // deletion is synced.
  std::chrono::milliseconds sync_every{100};
  std::uint64_t reclaim_slice_bytes = 4 << 20;  // given back per reclaim_space call
};

// How long a pass waits after a transaction (or a slice of reclaim_space)
// that took `took`: `pacing.pause` when no other connection wrote to the
// journal meanwhile (journal::others_wrote), else long enough that the pass
// holds the journal at most `pacing.share` of the time, and `pacing.pause`
// at least.
std::chrono::microseconds pause_after(const retention_pacing& pacing, std::chrono::microseconds took,
                                      bool others_wrote);

// Where a run's files are, on this host.
struct run_file_places {
  std::filesystem::path home;            // CAIRN_HOME
  std::filesystem::path workspace_root;  // a worker's --workspace-root ("" none)
};

// A run a pass selected (what it reports of it, without its input and output).
struct selected_run {
  std::string id;
  storage::run_status status = storage::run_status::completed;
  std::int64_t created_at_ms = 0;
  std::int64_t ended_at_ms = 0;
};

// What removing runs did.
struct removal_report {
  std::vector<std::string> removed;                             // run ids, in the order removed
  std::vector<std::pair<std::string, std::string>> refused;     // run id, why (nothing of it removed)
  std::vector<std::string> notes;                               // files kept, and why
  std::uint64_t journal_bytes = 0;  // what the removed runs' steps and events held (bytes_of_run)
  std::uint64_t file_bytes = 0;     // what their files held on disk
  storage::journal_space before, after;
};

// The runs `rule` selects at `now_ms`, oldest first. Reads the runs a page
// at a time (never all of them in memory at once as records).
std::vector<selected_run> select_runs(storage::journal& journal, const retention_rule& rule, std::int64_t now_ms);

// Removes the runs `ids` (each one's journal rows, then, once their
// deletion is synced, its files), a few per transaction; a run the journal
// refuses (storage_error not_found or unfinished) is reported in `refused`
// and the others go on. Then gives the space back in slices. `stop`, when
// given, is asked after each synced transaction: true ends the pass early
// (a daemon shutting down).
removal_report remove_runs(storage::journal& journal, const run_file_places& places, const std::vector<std::string>& ids,
                           const retention_pacing& pacing = {}, const std::function<bool()>& stop = {});

// Throws engine_error when `cairn rm` must refuse the run: not_found for
// no such run, busy when a process holds it, bad_request when it has not
// ended (cancel it first). The journal checks again as it deletes, and
// also refuses a run with an unfinished child or parent (remove_runs).
void check_removable(storage::journal& journal, const std::string& id);

// What remove_run_files did.
struct removed_files {
  std::uint64_t bytes = 0;          // freed on disk
  std::vector<std::string> kept;    // a line for each thing kept, and why
};

// Deletes the files of the removed run `run` on this host: its log, and its
// workspace and quota image where cairn made them (workspace_is_cairns,
// run_paths.hpp); a folder the user gave with --workspace is the user's and
// stays, as do files on another machine. Follows no link.
removed_files remove_run_files(const run_file_places& places, const storage::run_record& run);

}  // namespace cairn::engine
