// engine::fork: `cairn fork RUN --at SEQ`, a new run from another's journal
// up to one of its steps and from its workspace checkpoint there.
#include <fmt/format.h>

#include "engine/engine.hpp"
#include "engine/owner.hpp"
#include "engine/run_id.hpp"
#include "engine/run_paths.hpp"
#include "engine/workspace_checkpoints.hpp"

namespace cairn::engine {

forked_run engine::fork(const fork_request& request) {
  const auto from = journal_.find_run(request.from);
  if (!from)
    throw engine_error(errc::not_found, fmt::format("no run '{}' in {} to fork", request.from, journal_.path().string()));
  if (!from->unreadable.empty())
    throw engine_error(errc::bad_request, fmt::format("run {} cannot be forked: {}", from->id, from->unreadable));
  run_request r;
  r.id = request.id.empty() ? new_run_id() : request.id;
  if (journal_.find_run(r.id))  // said before its workspace is found to be taken
    throw engine_error(errc::bad_request, fmt::format("run {} exists already; give the fork another --id", r.id));
  r.agent = request.agent.empty() ? std::filesystem::path(from->agent) : request.agent;
  if (std::error_code ec; !std::filesystem::is_regular_file(r.agent, ec))
    throw engine_error(errc::bad_request,
                       request.agent.empty()
                           ? fmt::format("the agent of run {}, {}, is gone: give the fork one with --agent", from->id,
                                         from->agent)
                           : fmt::format("--agent: no program at {}", request.agent.string()));
  r.input = request.input ? *request.input : from->input;
  r.sandbox = from->sandbox;
  r.max_attempts = from->max_attempts;
  r.policy = parse_policy(from->policy);
  // Workspace checkpoints at or before seq never change: whether there is
  // one is known before anything is written.
  const bool restore = has_checkpoint(journal_, from->id, request.seq);
  // Held while its workspace is filled, so that no host executes it half made.
  if (request.hold || restore) r.owner = current_owner().str();
  auto run = new_run_of(std::move(r));
  run.policy = from->policy;
  give_workspace_now(run);

  const std::string& origin = from->id;
  const std::uint64_t seq = request.seq;
  const auto refusal = [&](storage::journal& j) -> std::optional<std::string> {
    if (j.find_run(run.id)) return fmt::format("run {} exists already; give the fork another --id", run.id);
    const std::uint64_t steps = j.step_count(origin);
    if (seq < steps) return std::nullopt;
    if (auto doubt = find_in_doubt(j, origin); doubt && doubt->seq <= seq)
      return fmt::format("step {} of run {} is a call of tool '{}' in doubt: settle it first: cairn settle {} {} "
                         "(--result JSON, --error MESSAGE or --retry), then fork",
                         doubt->seq, origin, doubt->tool, origin, doubt->seq);
    if (steps == 0) return fmt::format("run {} has no steps yet: there is nothing to fork", origin);
    return fmt::format("run {} has no step {}: its journal ends at step {} (cairn show {})", origin, seq, steps - 1,
                       origin);
  };
  if (auto refused = ledger_->fork_run(run, origin, seq, refusal)) throw engine_error(errc::bad_request, *refused);

  if (restore) {
    try {
      fork_workspace(journal_, origin, seq, run.id, run.workspace);
    } catch (const std::exception& e) {
      // Its journal is written; executed on a workspace that is not the
      // checkpoint's, it would go on from files the prefix never left.
      const std::string why = fmt::format("the workspace of run {} at step {} could not be restored: {}", origin, seq,
                                          e.what());
      ledger_->apply(run.id, {effects::run_ended{storage::run_status::failed, nullptr, protocol::error_info{why, "fork"}}});
      throw std::runtime_error(fmt::format("fork {} failed: {}; remove it with `cairn rm {}`", run.id, why, run.id));
    }
    if (!request.hold) ledger_->apply(run.id, {effects::released{"its workspace was restored; left for a worker"}});
  } else {
    // Empty, but there: a run with steps and no workspace folder is one
    // whose files are elsewhere, which no host executes (engine::unreachable).
    make_home_folders(home());
    std::filesystem::create_directory(run.workspace);
  }
  return {*journal_.find_run(run.id), restore};
}

}  // namespace cairn::engine
