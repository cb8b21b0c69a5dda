// engine::fork: `cairn fork RUN --at SEQ`, a new run from another's journal
// up to one of its steps and from its workspace checkpoint there.
#include <fmt/format.h>

#include "engine/engine.hpp"
#include "engine/owner.hpp"
#include "engine/run_id.hpp"
#include "engine/run_fork.hpp"
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
  auto run = new_run_of(std::move(r));
  run.policy = from->policy;
  give_workspace_now(run);
  const auto written =
      write_fork(*ledger_, journal_, run, from->id, request.seq, request.hold, current_owner().str(),
                 [&](const std::optional<workspace_state>& files) {
                   if (files) return materialize(journal_, *files, run.workspace);
                   // Empty, but there: a run with steps and no workspace folder is one
                   // whose files are elsewhere, which no host executes (engine::unreachable).
                   make_home_folders(home());
                   std::filesystem::create_directory(run.workspace);
                 });
  if (written.refused) throw engine_error(errc::bad_request, *written.refused);
  return {*journal_.find_run(run.id), written.restored};
}

fork_written write_fork(ledger& writes, storage::journal& journal, storage::new_run fork, const std::string& from,
                        std::uint64_t seq, bool hold, const std::string& owner,
                        const std::function<void(const std::optional<workspace_state>&)>& fill) {
  // Workspace checkpoints at or before seq never change: whether there is
  // one is known before anything is written.
  const bool restore = has_checkpoint(journal, from, seq);
  // Held while its workspace is filled, so that no host executes it half made.
  if (hold || restore) fork.owner = owner;
  const auto refusal = [&](storage::journal& j) -> std::optional<std::string> {
    if (j.find_run(fork.id)) return fmt::format("run {} exists already; give the fork another --id", fork.id);
    const std::uint64_t steps = j.step_count(from);
    if (seq < steps) return std::nullopt;
    if (auto doubt = find_in_doubt(j, from); doubt && doubt->seq <= seq)
      return fmt::format("step {} of run {} is a call of tool '{}' in doubt: settle it first: cairn settle {} {} "
                         "(--result JSON, --error MESSAGE or --retry), then fork",
                         doubt->seq, from, doubt->tool, from, doubt->seq);
    if (steps == 0) return fmt::format("run {} has no steps yet: there is nothing to fork", from);
    return fmt::format("run {} has no step {}: its journal ends at step {} (cairn show {})", from, seq, steps - 1,
                       from);
  };
  if (auto refused = writes.fork_run(fork, from, seq, refusal)) return {std::move(refused), false};

  if (!restore) {
    fill(std::nullopt);
    return {std::nullopt, false};
  }
  try {
    fill(fork_checkpoints(journal, from, seq, fork.id));
  } catch (const std::exception& e) {
    // Its journal is written; executed on a workspace that is not the
    // checkpoint's, it would go on from files the prefix never left.
    const std::string why =
        fmt::format("the workspace of run {} at step {} could not be restored: {}", from, seq, e.what());
    writes.apply(fork.id, {effects::run_ended{storage::run_status::failed, nullptr, protocol::error_info{why, "fork"}}});
    throw std::runtime_error(fmt::format("fork {} failed: {}; remove it with `cairn rm {}`", fork.id, why, fork.id));
  }
  if (!hold) writes.apply(fork.id, {effects::released{"its workspace was restored; left for a worker"}});
  return {std::nullopt, true};

}

}  // namespace cairn::engine
