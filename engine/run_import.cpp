// engine::import_run: `cairn import FILE`, a run from an archive `cairn
// export` wrote (run_archive.hpp), into this journal in one transaction.
#include <fmt/format.h>

#include "engine/engine.hpp"
#include "engine/ledger.hpp"
#include "engine/run_archive.hpp"
#include "engine/run_id.hpp"
#include "engine/run_paths.hpp"
#include "engine/workspace_checkpoints.hpp"

namespace cairn::engine {

std::optional<std::string> ledger::import_run(
    const storage::new_run& run, const archived_run& from, std::span<const std::string> digests,
    const piece_source& pieces, const std::function<std::optional<std::string>(storage::journal&)>& refusal) {
  std::optional<std::string> refused;
  write([&](storage::journal& j) {
    if ((refused = refusal(j))) return;
    if (!j.create_run(run).second)
      throw storage::storage_error(storage::errc::conflict, fmt::format("run {} exists", run.id));
    const auto& m = from.manifest;
    const auto origin = event("imported", {{"from_run", from.run.id},
                                           {"exported_at_ms", m.value("exported_at_ms", std::int64_t{0})},
                                           {"cairn_version", m.value("cairn", "")},
                                           {"backend", m.value("backend", "")}});
    j.append_event(run.id, origin.kind, origin.data, origin.seq);
    // Signals get new ids here: the events that name one are rewritten to match.
    std::map<std::int64_t, std::int64_t> signal_ids;
    std::map<std::uint64_t, std::int64_t> delivered_at;
    for (const auto& s : from.signals) {
      const auto queued = j.enqueue_signal(run.id, s.name, s.payload);
      signal_ids[s.id] = queued.id;
      if (s.delivered_seq) delivered_at[*s.delivered_seq] = queued.id;
    }
    for (auto step : from.steps) {
      step.run_id = run.id;
      if (const auto it = delivered_at.find(step.result.seq); it != delivered_at.end()) j.deliver_signal(it->second, step);
      else j.append_step(step);
    }
    for (const auto& e : from.events) {
      json data = e.data;
      if (const auto it = data.find("signal_id"); it != data.end() && it->is_number_integer())
        if (const auto id = signal_ids.find(it->get<std::int64_t>()); id != signal_ids.end()) *it = id->second;
      j.append_event(run.id, e.kind, data, e.seq);
    }
    if (from.state) j.put_run_state(run.id, *from.state);
    // One piece at a time: the transaction holds them, memory does not.
    for (const auto& digest : digests) {
      const auto b = pieces(digest);
      if (!b) throw std::logic_error("import: a checked piece went missing: " + digest);
      j.put_blobs(run.id, std::span(&*b, 1), std::span(&digest, 1));
    }
    for (int i = 0; i < from.run.attempts; ++i) j.begin_attempt(run.id);
    using enum storage::run_status;
    const auto error = from.run.error.value_or(protocol::error_info{"(no message was recorded)", "error"});
    switch (from.run.status) {
      case completed: j.finish_run(run.id, completed, from.run.output, std::nullopt); break;
      case failed:
      case cancelled:
      case in_doubt: j.finish_run(run.id, from.run.status, nullptr, error); break;
      case waiting:
        if (from.run.wait) j.suspend_run(run.id, *from.run.wait);
        break;
      case pending:
      case running: break;  // pending, nobody's: whoever executes it next replays its steps
    }
    if (from.run.cancel_requested_at_ms && !storage::is_finished(from.run.status))
      j.request_cancel(run.id, from.run.cancel_reason);
  });
  if (!refused) announce(path_, run.id, storage::change::submitted);
  return refused;
}

imported_run engine::import_run(int fd, const std::string& id) {
  if (!id.empty())
    if (auto problem = run_id_problem(id)) throw engine_error(errc::bad_request, *problem);
  make_home_folders(home());
  piece_spool spool(home());
  const archived_run from = read_run_archive(fd, spool);

  run_request r;
  r.id = id.empty() ? from.run.id : id;
  const auto taken = [&](storage::journal& j) -> std::optional<std::string> {
    if (!j.find_run(r.id)) return std::nullopt;
    return fmt::format("run {} exists already in {}; import it under another id: cairn import FILE --id NEW", r.id,
                       storage::without_password(j.path().string()));
  };
  if (auto refused = taken(journal_)) throw engine_error(errc::bad_request, *refused);
  r.agent = from.run.agent;
  r.input = from.run.input;
  r.sandbox = from.run.sandbox;
  r.max_attempts = from.run.max_attempts;
  r.policy = parse_policy(from.run.policy);
  auto run = new_run_of(std::move(r));
  run.policy = from.run.policy;
  run.deadline_ms = from.run.deadline_ms;
  give_workspace_now(run);

  // The workspace first, from the checked pieces: the journal's one write
  // then makes the run whole, or, refused, leaves nothing (the folder goes).
  const std::filesystem::path folder = run.workspace;
  if (std::error_code ec; std::filesystem::exists(folder, ec))
    throw engine_error(errc::bad_request, fmt::format("{} exists already: the workspace of an imported run is a new "
                                                      "folder; remove it or import with another --id",
                                                      folder.string()));
  const auto state = checkpoint_state(from.events, from.run.id);
  const piece_source from_spool = [&spool](const std::string& digest) { return spool.find(digest); };
  try {
    materialize(from_spool, state, folder);
    if (auto refused = ledger_->import_run(run, from, spool.digests(), from_spool, taken))
      throw engine_error(errc::bad_request, *refused);
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove_all(folder, ignored);
    throw;
  }
  return {*journal_.find_run(run.id), from.run.id, from.run.status, !state.empty()};
}

}  // namespace cairn::engine
