#include "engine/retention.hpp"

#include <algorithm>
#include <thread>

#include <fmt/format.h>

#include "engine/engine.hpp"
#include "engine/owner.hpp"
#include "engine/run_paths.hpp"
#include "runtime/sandbox.hpp"
#include "runtime/tree_removal.hpp"
#include "runtime/workspace_quota.hpp"

namespace cairn::engine {
namespace fs = std::filesystem;

namespace {

constexpr std::int64_t page_size = 1000;  // runs read per list_runs

}  // namespace

std::vector<selected_run> select_runs(storage::journal& journal, const retention_rule& rule, std::int64_t now_ms) {
  std::vector<selected_run> runs;
  for (auto status : rule.statuses) {
    if (!storage::is_finished(status)) continue;
    storage::run_query q;
    q.status = status;
    q.limit = page_size;
    for (;;) {
      const auto page = journal.list_runs(q);
      for (const auto& r : page)
        runs.push_back({r.id, r.status, r.created_at_ms, r.finished_at_ms.value_or(r.updated_at_ms)});
      if (static_cast<std::int64_t>(page.size()) < page_size) break;
      q.before = page.back().id;
    }
  }
  // Newest first, as list_runs gives each status's runs: the first keep_last stay.
  std::stable_sort(runs.begin(), runs.end(),
                   [](const selected_run& a, const selected_run& b) { return a.created_at_ms > b.created_at_ms; });
  const std::size_t kept = std::min(runs.size(), rule.keep_last.value_or(0));
  runs.erase(runs.begin(), runs.begin() + static_cast<std::ptrdiff_t>(kept));
  if (rule.older_than) {
    const auto ended_before = now_ms - rule.older_than->count();
    std::erase_if(runs, [&](const selected_run& r) { return r.ended_at_ms > ended_before; });
  }
  std::reverse(runs.begin(), runs.end());
  return runs;
}

void check_removable(storage::journal& journal, const std::string& id) {
  const auto run = journal.find_run(id);
  if (!run) throw engine_error(errc::not_found, fmt::format("no run {} in the journal", id));
  if (!run->owner.empty())
    throw engine_error(errc::busy, fmt::format("run {} is {} and held by {}; cancel it first with `cairn cancel {}`", id,
                                               storage::to_string(run->status), describe_owner(run->owner), id));
  if (!storage::is_finished(run->status))
    throw engine_error(errc::bad_request, fmt::format("run {} has not ended ({}); cancel it first with `cairn cancel {}`",
                                                      id, storage::to_string(run->status), id));
}

removed_files remove_run_files(const run_file_places& places, const storage::run_record& run) {
  removed_files out;
  const auto remove = [&](const fs::path& path) {
    try {
      out.bytes += runtime::remove_no_follow(path);
    } catch (const runtime::sandbox_error& e) {
      out.kept.push_back(fmt::format("run {}: kept {}: {}", run.id, path.string(), e.what()));
    }
  };
  remove(run_log(places.home, run.id));
  if (run.workspace.empty()) return out;
  if (!run.workspace_host.empty() && run.workspace_host != current_owner().hostname) {
    out.kept.push_back(fmt::format("run {}: its workspace {} is on host {}; remove it there", run.id, run.workspace,
                                   run.workspace_host));
    return out;
  }
  const fs::path workspace = fs::path(run.workspace).lexically_normal();
  if (!workspace_is_cairns(places.home, places.workspace_root, run.id, workspace)) {
    out.kept.push_back(fmt::format("run {}: kept its workspace {}: a folder given with --workspace is yours to "
                                   "remove",
                                   run.id, workspace.string()));
    return out;
  }
  const fs::path image = workspace == default_workspace(places.home, run.id).lexically_normal()
                             ? workspace_image(places.home, run.id)
                             : root_workspace_image(workspace.parent_path(), run.id);
  for (const auto& path : runtime::run_file_paths(workspace, image)) remove(path);
  return out;
}

std::chrono::microseconds pause_after(const retention_pacing& pacing, std::chrono::microseconds took,
                                      bool others_wrote) {
  const std::chrono::microseconds floor = pacing.pause;
  if (!others_wrote || pacing.share <= 0 || pacing.share >= 1) return floor;
  const auto fair = std::chrono::microseconds(
      static_cast<std::int64_t>(static_cast<double>(took.count()) * (1 - pacing.share) / pacing.share));
  return std::max(floor, fair);
}

namespace {

using steady = std::chrono::steady_clock;

// Runs `work` (a transaction, a slice), then waits as pause_after says.
template <class F>
auto paced(storage::journal& journal, const retention_pacing& pacing, F&& work) {
  const auto t0 = steady::now();
  auto result = work();
  const auto took = std::chrono::duration_cast<std::chrono::microseconds>(steady::now() - t0);
  std::this_thread::sleep_for(pause_after(pacing, took, journal.others_wrote()));
  return result;
}

}  // namespace

removal_report remove_runs(storage::journal& journal, const run_file_places& places, const std::vector<std::string>& ids,
                           const retention_pacing& pacing, const std::function<bool()>& stop) {
  removal_report report;
  report.before = journal.space();
  const std::size_t per_transaction = std::max<std::size_t>(1, pacing.runs_per_transaction);
  // Deleted, their deletion not synced yet: their files wait for it (a
  // power cut may still forget it, and the run would stay without them).
  std::vector<storage::run_record> unsynced;
  auto last_sync = steady::now();
  for (std::size_t first = 0; first < ids.size(); first += per_transaction) {
    if (unsynced.empty() && stop && stop()) break;
    const std::size_t n = std::min(per_transaction, ids.size() - first);
    const bool last = first + n == ids.size();
    const bool sync = last || steady::now() - last_sync >= pacing.sync_every;
    std::vector<std::uint64_t> bytes(n);
    std::vector<storage::run_record> rows(n);
    std::vector<std::function<void(storage::journal&)>> writes;
    for (std::size_t i = 0; i < n; ++i) {
      bytes[i] = journal.bytes_of_run(ids[first + i]);
      writes.push_back([&rows, &ids, i, first](storage::journal& j) { rows[i] = j.delete_run(ids[first + i]); });
    }
    // A synced commit syncs the unsynced ones before it too (journal.hpp write_together).
    const auto errors = paced(journal, pacing, [&] { return journal.write_together(writes, !sync); });
    for (std::size_t i = 0; i < n; ++i) {
      if (errors[i]) {
        try {
          std::rethrow_exception(errors[i]);
        } catch (const storage::storage_error& e) {
          // A run gone meanwhile, or revived (`cairn resume`): the others go on.
          if (e.code() != storage::errc::not_found && e.code() != storage::errc::unfinished) throw;
          report.refused.emplace_back(ids[first + i], e.what());
        }
        continue;
      }
      report.removed.push_back(ids[first + i]);
      report.journal_bytes += bytes[i];
      unsynced.push_back(std::move(rows[i]));
    }
    // A transaction that deleted nothing wrote nothing and synced nothing:
    // the next one syncs (it is as late). Unless it was the last: its files
    // go now, and a power cut in the moment before the journal's next
    // synced commit may leave such a run without its files.
    const bool deleted = std::any_of(errors.begin(), errors.end(), [](const auto& e) { return !e; });
    if (!sync || (!deleted && !last)) continue;
    last_sync = steady::now();
    for (const auto& row : unsynced) {
      auto files = remove_run_files(places, row);
      report.file_bytes += files.bytes;
      for (auto& line : files.kept) report.notes.push_back(std::move(line));
    }
    unsynced.clear();
  }
  // At least once: PostgreSQL counts nothing free, and vacuums there.
  for (std::uint64_t was = UINT64_MAX; !(stop && stop());) {
    const auto left = paced(journal, pacing, [&] { return journal.reclaim_space(pacing.reclaim_slice_bytes); });
    if (left.free_bytes == 0 || left.free_bytes >= was) break;
    was = left.free_bytes;
  }
  report.after = journal.space();
  return report;
}

}  // namespace cairn::engine
