#include "engine/engine.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <random>

#include <boost/asio/this_coro.hpp>
#include <fmt/format.h>

#include "engine/agent_versions.hpp"
#include "engine/attempt.hpp"
#include "engine/io.hpp"
#include "engine/effects.hpp"
#include "runtime/crash_point.hpp"
#include "engine/liveness.hpp"
#include "engine/owner.hpp"
#include "engine/run_id.hpp"
#include "engine/run_journal.hpp"
#include "engine/run_paths.hpp"
#include "engine/attempt_events.hpp"
#include "engine/wakeups.hpp"
#include "protocol/bounded_json.hpp"
#include "runtime/workspace_quota.hpp"

namespace cairn::engine {
namespace {

class null_observer : public run_observer {};

engine_error being_executed(const std::string& run_id, const std::string& owner) {
  return engine_error(errc::busy, fmt::format("run {} is being executed by {}; follow it with `cairn logs {} --follow`, "
                                              "or stop that process and `cairn resume {}`",
                                              run_id, describe_owner(owner), run_id, run_id));
}

// Throws unless this process may take the run: nobody alive holds it.
void check_claimable(storage::journal& journal, const storage::run_record& run) {
  const std::string me = current_owner().str();
  if (!run.owner.empty() && run.owner != me) {
    switch (check_owner(journal, run.owner)) {
      case owner_state::alive:
        throw being_executed(run.id, run.owner);
      case owner_state::unknown:
        throw engine_error(errc::busy, fmt::format("run {} is owned by {}, which this machine cannot check; "
                                                   "resume it there",
                                                   run.id, run.owner));
      case owner_state::dead:
        break;
    }
  }
}

engine_error taken_just_now(const std::string& run_id) {
  return engine_error(errc::busy, fmt::format("run {} was taken by another process just now", run_id));
}

// Takes the run for this process, or explains who has it.
task<void> claim_async(ledger& writes, storage::journal& journal, const storage::run_record& run) {
  check_claimable(journal, run);
  const bool claimed = co_await writes.claim_run_async(run.id, run.owner, current_owner().str());
  if (!claimed) throw taken_just_now(run.id);
}

std::int64_t whole_ms(std::chrono::nanoseconds d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

// The run's journal limits; the defaults when its stored policy no longer
// parses (its next attempt fails on that).
journal_limits journal_limits_of(const storage::run_record& run) {
  try {
    return parse_policy(run.policy).journal;
  } catch (const policy_error&) {
    return {};
  }
}

}  // namespace

backend_factory default_backends(runtime::warm_pool_options warm) {
  return [warm](const std::string& name) -> std::shared_ptr<runtime::sandbox_backend> {
    if (name == "bwrap") return runtime::make_bwrap_backend({.warm = warm});
    if (name == "none") return runtime::make_process_backend();
    throw engine_error(errc::bad_request, "unknown sandbox '" + name + "': use bwrap (default) or none");
  };
}

backend_factory shared_backends(backend_factory make) {
  struct made {
    std::mutex mutex;
    std::map<std::string, std::shared_ptr<runtime::sandbox_backend>> backends;
  };
  return [make = std::move(make), shared = std::make_shared<made>()](const std::string& name) {
    std::lock_guard lock(shared->mutex);
    auto& backend = shared->backends[name];
    if (!backend) backend = make(name);
    return backend;
  };
}

engine::engine(storage::journal& journal, engine_options options)
    : journal_(journal),
      options_(std::move(options)),
      ledger_(options_.ledger ? options_.ledger : std::make_shared<ledger>(journal.path(), journal.options())) {}

std::pair<storage::run_record, bool> engine::submit(const run_request& request) {
  return ledger_->create_run(new_run_of(request));
}

std::pair<storage::run_record, bool> engine::start(run_request request) {
  request.owner = current_owner().str();
  return ledger_->create_run(new_run_of(std::move(request)), /*sync_later=*/true);
}

storage::new_run engine::new_run_of(run_request request) {
  if (request.max_attempts < 1) throw engine_error(errc::bad_request, "--max-attempts must be at least 1");
  if (protocol::nesting_depth(request.input) > protocol::max_input_depth)
    throw engine_error(errc::bad_request, fmt::format("the input nests deeper than {} levels, more than a run can be "
                                                      "handed; send a flatter value",
                                                      protocol::max_input_depth));
  backend(request.sandbox);  // rejects an unknown sandbox before anything is written
  storage::new_run run;
  run.id = request.id.empty() ? new_run_id() : request.id;
  if (auto problem = run_id_problem(run.id)) throw engine_error(errc::bad_request, *problem);
  run.agent = std::filesystem::absolute(request.agent).lexically_normal().string();
  run.input = std::move(request.input);
  run.max_attempts = request.max_attempts;
  run.sandbox = request.sandbox;
  // On a shared (PostgreSQL) journal the worker that first executes the run
  // chooses its workspace: the submitting machine may not be the one that runs it.
  if (!request.workspace.empty() || !storage::is_postgres_url(journal_.path().string()))
    run.workspace = checked_workspace(journal_, home(), request.workspace, run.id).string();
  run.policy = to_json(request.policy);
  run.owner = request.owner;
  if (request.policy.run_bound().count() > 0)
    run.deadline_ms = storage::now_ms() + std::chrono::milliseconds(request.policy.run_bound()).count();
  return run;
}

storage::run_record engine::execute(const std::string& run_id, run_observer* observer, bool revive_failed) {
  return run_here(execute_async(run_id, observer, revive_failed));
}

task<storage::run_record> engine::execute_async(std::string run_id, run_observer* observer, bool revive_failed) {
  try {
    co_return co_await drive_run(run_id, observer, revive_failed);
  } catch (const storage::storage_error& e) {
    // Another process took the run over: the attempt's sandbox died as the
    // error unwound it; stop here and never write again (the new owner has it).
    if (e.code() != storage::errc::fenced) throw;
    throw engine_error(errc::busy, e.what());
  }
}

task<storage::run_record> engine::drive_run(const std::string& run_id, run_observer* observer, bool revive_failed) {
  null_observer quiet;
  run_observer& watch = observer ? *observer : quiet;
  std::string unreadable;
  try {
    co_return co_await execute_run(run_id, watch, revive_failed);
  } catch (const storage::storage_error& e) {
    if (e.code() != storage::errc::unreadable) throw;
    unreadable = e.what();
  }
  co_return co_await end_run(run_id, storage::run_status::failed, nullptr,
                             protocol::error_info{fmt::format("run {} cannot go on: {}", run_id, unreadable), "journal"},
                             watch);
}

task<storage::run_record> engine::execute_run(const std::string& run_id, run_observer& watch, bool revive_failed) {
  auto run = journal_.find_run(run_id);
  if (!run) throw engine_error(errc::not_found, fmt::format("no run '{}' in {}", run_id, journal_.path().string()));
  if (!needs_execution(journal_, *run, revive_failed)) co_return *run;

  if (run->status == storage::run_status::failed) {
    co_await ledger_->apply_async(run_id, effects::attempts_reset{});
    run = journal_.find_run(run_id);
  }
  if (auto refusal = unreachable(*run)) {
    // Journaled once per process (a scheduler looks again after a pause), for `cairn show`.
    if (refused_.insert(run_id).second) co_await ledger_->apply_async(run_id, effects::sandbox_warning{*refusal});
    throw engine_error(errc::busy, *refusal);
  }
  auto& sandboxes = backend(run->sandbox);
  policy rules;
  std::optional<std::string> invalid_policy;
  try {
    rules = parse_policy(run->policy);
  } catch (const policy_error& e) {
    invalid_policy = e.what();
  }
  // Checked at every attempt: a row may have been changed since the last.
  if (auto refused = invalid_policy ? std::nullopt : not_allowed(*run, rules)) {
    co_await claim_async(*ledger_, journal_, *run);
    co_return co_await end_run(run_id, storage::run_status::failed, nullptr, protocol::error_info{*refused, "refused"},
                               watch, /*release_files=*/false);
  }
  // On the way in, one commit takes the run, gives it its workspace and
  // begins its first attempt; a run that is to end instead is taken alone.
  std::optional<int> begun;
  if (run->unreadable.empty() && !invalid_policy && !must_end_before_attempt(*run)) {
    begun = co_await take_run(*run);
  } else {
    co_await claim_async(*ledger_, journal_, *run);
    if (!run->unreadable.empty()) throw storage::storage_error(storage::errc::unreadable, run->unreadable);
    if (run->workspace.empty()) co_await assign_workspace(*run);
  }
  make_home_folders(home());
  run = journal_.find_run(run_id);
  co_await offload([&] { ready_run_files(*run); }, pool::starts);
  if (invalid_policy)
    co_return co_await end_run(
        run_id, storage::run_status::failed, nullptr,
        protocol::error_info{"the run's stored policy is no longer valid here: " + *invalid_policy, "policy"}, watch);
  // Crashes counted in this process: a dead host does not use up the agent's attempts.
  int crashes = 0;
  // What the attempts execute (agent_versions.hpp), chosen at the first.
  std::filesystem::path program;
  for (;;) {
    run = journal_.find_run(run_id);
    int attempt = 0;
    if (begun) {
      attempt = *std::exchange(begun, std::nullopt);
    } else {
      if (auto ended = co_await end_before_attempt(*run, rules, watch)) co_return *ended;
      attempt = co_await ledger_->begin_attempt_async(run_id);
    }
    if (run->sandbox == "none")
      watch.on_warning("run " + run_id + " executes WITHOUT a sandbox (--sandbox none): the agent can read and "
                                         "write everything this user can");
    watch.on_attempt(*run, attempt);

    const auto upkeep_before = sandboxes.upkeep(run->workspace);
    attempt_result result;
    std::optional<std::string> busy;
    try {
      auto options = attempt_options_of(*run);
      std::string refusal;
      if (program.empty()) {
        const auto recorded = agent_of_run(journal_, run_id);
        // Hashing, and the first time copying, the agent's files: off the event loop.
        auto choice = co_await offload(
            [&] { return choose_agent(*run, recorded, agent_store(home()), options.private_paths); }, pool::starts);
        for (auto& e : choice.effects) co_await ledger_->apply_async(run_id, std::move(e));
        if (!choice.warning.empty()) watch.on_warning(choice.warning);
        program = choice.program;
        refusal = choice.refusal;
      }
      if (!refusal.empty()) {
        result = {attempt_result::kind::failed, nullptr, {refusal, "agent_changed"}, {}};
      } else {
        options.agent = program;
        options.private_paths = private_paths_for(program, std::move(options.private_paths));
        run_journal journal(*ledger_, journal_, home(), run_id, rules.journal);
        if (!listening_) listening_.emplace(journal_.path());
        attempt_events events(run_id, journal_.path());
        result = co_await run_attempt(journal, events, sandboxes, *run, rules, attempt, options, watch);
      }
    } catch (const runtime::sandbox_error& e) {
      if (e.code() == runtime::sandbox_errc::workspace_busy) busy = e.what();
      else result = {attempt_result::kind::failed, nullptr, {e.what(), "sandbox"}, {}};
    }
    if (busy) {
      // Another live process (a worker paused past its lease) still has the
      // run's files mounted: never a second mount of one image. The run goes
      // back, to be taken again once that process let go.
      co_await ledger_->apply_async(run_id, effects::released{"not executed here: " + *busy});
      throw engine_error(errc::busy, fmt::format("run {}: {}", run_id, *busy));
    }

    using kind = attempt_result::kind;
    switch (result.outcome) {
      case kind::suspended: {
        co_await ledger_->confirm_held_async(run_id);
        // The workspace stays in its image until the run ends. What the
        // suspension cost (this attempt's mount and unmount) is the run's, and
        // the agent, which chooses how long it waits, may only suspend so often.
        const auto upkeep = sandboxes.upkeep(run->workspace);
        const auto hour_ago = storage::now_ms() - 3'600'000;
        const std::uint64_t count = co_await ledger_->read_async<std::uint64_t>([&](storage::journal& j) {
          return suspensions_since(j, run_id, hour_ago);
        }) + 1;
        if (count > rules.suspensions_per_hour) {
          std::string message = fmt::format(
              "the run waited long enough to be suspended more than {} times within an hour "
              "(limits.suspensions_per_hour): each suspension unmounts its workspace and each resumption "
              "mounts it again; raise the limit, or wait longer at a time",
              rules.suspensions_per_hour);
          co_await ledger_->apply_async(run_id, effects::limit_exceeded{"suspensions", message});
          co_return co_await end_run(run_id, storage::run_status::failed, nullptr,
                                     protocol::error_info{message, "limit_exceeded"}, watch);
        }
        co_await ledger_->apply_async(
            run_id, effects::suspended{result.wait, count, upkeep.bytes_written - upkeep_before.bytes_written,
                                       whole_ms(upkeep.cpu - upkeep_before.cpu),
                                       whole_ms(upkeep.wall - upkeep_before.wall)});
        run = journal_.find_run(run_id);
        watch.on_wait(*run, result.wait);
        co_return *run;
      }
      case kind::released:
        co_await ledger_->apply_async(run_id, effects::released{"the host process is shutting down"});
        co_return *journal_.find_run(run_id);
      case kind::restart:  // counted like a crash: an agent must not restart its sandbox for free
      case kind::crashed: {
        ++crashes;
        bool retry = crashes < run->max_attempts;
        co_await ledger_->apply_async(run_id, effects::attempt_crashed{attempt, result.error.message, retry});
        watch.on_attempt_failed(attempt, result.error.message, retry);
        if (retry) {
          auto delay = options_.retry_backoff ? run_retry{*options_.retry_backoff}.delay_after(crashes)
                                              : rules.retry.delay_after(crashes);
          const bool paused = co_await pause(delay, run_id);
          if (!paused) {
            co_await ledger_->apply_async(run_id, effects::released{"the host process is shutting down"});
            co_return *journal_.find_run(run_id);
          }
          continue;
        }
        result.error.message = fmt::format("gave up after {} crashed attempt{}; last: {}", crashes,
                                           crashes == 1 ? "" : "s", result.error.message);
        co_return co_await end_run(run_id, storage::run_status::failed, nullptr, result.error, watch);
      }
      case kind::completed:
        co_return co_await end_run(run_id, storage::run_status::completed, result.output, {}, watch);
      case kind::cancelled:
        co_return co_await end_run(run_id, storage::run_status::cancelled, nullptr, result.error, watch);
      case kind::failed:
        co_return co_await end_run(run_id, storage::run_status::failed, nullptr, result.error, watch);
    }
  }
}

ledger::workspace_assignment engine::workspace_for(const storage::run_record& run) {
  const bool shared = !options_.workspace_root.empty();
  const auto workspace = checked_workspace(journal_, home(), shared ? options_.workspace_root / run.id : "", run.id);
  return {workspace.string(), shared ? "" : current_owner().hostname};
}

void engine::give_workspace_now(storage::new_run& run) {
  if (!run.workspace.empty()) return;
  storage::run_record named;
  named.id = run.id;
  auto [folder, host] = workspace_for(named);
  run.workspace = std::move(folder);
  run.workspace_host = std::move(host);
}

task<void> engine::assign_workspace(const storage::run_record& run) {
  auto [folder, host] = workspace_for(run);
  co_await ledger_->assign_workspace_async(run.id, std::move(folder), std::move(host));
}

task<int> engine::take_run(const storage::run_record& run) {
  check_claimable(journal_, run);
  std::optional<ledger::workspace_assignment> workspace;
  if (run.workspace.empty()) workspace = workspace_for(run);
  const auto attempt =
      co_await ledger_->take_run_async(run.id, run.owner, current_owner().str(), std::move(workspace));
  if (!attempt) throw taken_just_now(run.id);
  co_return *attempt;
}

bool engine::must_end_before_attempt(const storage::run_record& run) {
  return run.cancel_requested_at_ms || (run.deadline_ms && storage::now_ms() >= *run.deadline_ms) ||
         find_in_doubt(journal_, run.id);
}

task<std::optional<storage::run_record>> engine::end_before_attempt(const storage::run_record& run,
                                                                    const policy& rules, run_observer& watch) {
  if (run.cancel_requested_at_ms) {
    auto reason =
        co_await ledger_->read_async<std::string>([&](storage::journal& j) { return cancel_reason(j, run.id); });
    co_return co_await end_run(run.id, storage::run_status::cancelled, nullptr,
                               protocol::error_info{std::move(reason), "cancelled"}, watch);
  }
  if (run.deadline_ms && storage::now_ms() >= *run.deadline_ms) {
    auto [message, type] = rules.deadline_passed();
    co_return co_await end_run(run.id, storage::run_status::failed, nullptr, protocol::error_info{message, type},
                               watch);
  }
  if (auto doubt = find_in_doubt(journal_, run.id)) {
    effects::run_ended stopped{storage::run_status::in_doubt, nullptr,
                               protocol::error_info{doubt->message, "in_doubt"}};
    co_await ledger_->apply_async(run.id, std::move(stopped));
    co_return *journal_.find_run(run.id);
  }
  co_return std::nullopt;
}

task<storage::run_record> engine::end_run(const std::string& run_id, storage::run_status status, json output,
                                          protocol::error_info error, run_observer& watch, bool release_files) {
  runtime::crash_point("before_finish");
  // Files first: once the journal says the run ended, its files are in its
  // folder (whoever reads them then never finds them mid-release). A crash
  // in between only replays the run.
  auto run = *journal_.find_run(run_id);
  co_await ledger_->confirm_held_async(run_id);  // the workspace of a run taken over is the new owner's
  auto& sandboxes = backend(run.sandbox);
  if (release_files) co_await offload([&] { release_workspace(sandboxes, run, watch); }, pool::teardown);
  std::optional<protocol::error_info> why;
  if (status != storage::run_status::completed) why = std::move(error);
  co_await ledger_->apply_async(run_id, effects::run_ended{status, std::move(output), std::move(why)});
  run = *journal_.find_run(run_id);
  co_await cancel_children(run_id, fmt::format("its parent run {} ended ({})", run_id, storage::to_string(status)));
  co_return run;
}

void engine::release_workspace(runtime::sandbox_backend& sandboxes, const storage::run_record& run,
                               run_observer& watch) {
  try {
    sandboxes.release_workspace(run.workspace, image_of(run));
  } catch (const std::exception& e) {
    watch.on_warning(fmt::format("run {}: its workspace could not be released: {}", run.id, e.what()));
  }
}

task<bool> engine::pause(std::chrono::milliseconds delay, const std::string& run_id) {
  // Whoever sets options_.stopping wakes every waiter (wake_all).
  wake_event woken;
  wake_registration watching(run_id, woken);
  watched_fd event(co_await asio::this_coro::executor, woken.fd());
  const auto until = clock::now() + delay;
  while (!(options_.stopping && options_.stopping->load())) {
    const auto why = co_await wait_any(event, asio::posix::descriptor_base::wait_read, nullptr, until);
    if (why == woken_by::deadline) co_return true;
    woken.take();
  }
  co_return false;
}

// Children of an ended run: idle ones are cancelled now (with theirs), running
// ones are asked to stop by the process that runs them.
task<void> engine::cancel_children(std::string run_id, std::string reason) {
  for (const auto& child : journal_.children(run_id)) {
    if (is_finished(child.status)) continue;
    try {
      co_await cancel_async(child.id, reason);
    } catch (const engine_error&) {
      // it ended meanwhile
    }
  }
}

storage::signal_record engine::signal(const std::string& run_id, const std::string& name, const json& payload) {
  if (name.empty() || name.size() > protocol::max_name_size)
    throw engine_error(errc::bad_request, "a signal needs a name (at most 1024 bytes)");
  // Refused here, before it is stored: a run could never be handed a deeper one.
  if (protocol::nesting_depth(payload) > max_signal_depth)
    throw engine_error(errc::bad_request, fmt::format("the signal payload nests deeper than {} levels, more than a "
                                                      "run can be handed; send a flatter value",
                                                      max_signal_depth));
  auto run = journal_.find_run(run_id);
  if (!run) throw engine_error(errc::not_found, fmt::format("no run '{}' in {}", run_id, journal_.path().string()));
  const auto limits = journal_limits_of(*run);
  if (const auto bytes = protocol::dumped_size(payload); bytes > limits.signal_bytes)
    throw engine_error(errc::bad_request, fmt::format("the signal payload is {} bytes, more than run {} accepts ({} "
                                                      "KiB, limits.signal_kb in its policy)",
                                                      bytes, run_id, limits.signal_bytes >> 10));
  try {
    return ledger_->enqueue_signal(run_id, name, payload, limits.signals);
  } catch (const storage::storage_error& e) {
    if (e.code() == storage::errc::not_found)
      throw engine_error(errc::not_found, fmt::format("no run '{}' in {}", run_id, journal_.path().string()));
    if (e.code() == storage::errc::finished) throw engine_error(errc::bad_request, e.what());
    if (e.code() == storage::errc::limit_reached)
      throw engine_error(errc::bad_request, std::string(e.what()) + " (limits.signals in its policy)");
    throw;
  }
}

engine::cancel_outcome engine::cancel(const std::string& run_id, const std::string& reason) {
  return run_here(cancel_async(run_id, reason));
}

task<engine::cancel_outcome> engine::cancel_async(std::string run_id, std::string reason) {
  auto run = journal_.find_run(run_id);
  if (!run) throw engine_error(errc::not_found, fmt::format("no run '{}' in {}", run_id, journal_.path().string()));
  auto refuse = [&](const storage::run_record& r) {
    return engine_error(errc::bad_request, fmt::format("run {} already ended ({}); there is nothing to cancel", r.id,
                                                       storage::to_string(r.status)));
  };
  if (is_finished(run->status)) throw refuse(*run);
  // An idle run is cancelled in one write. Asking first would wake a scheduler,
  // which could take the run between the two writes.
  if (co_await ledger_->cancel_idle_run_async(run_id, reason)) {
    // A suspended run's files go back to its plain folder, as at any run's
    // end; one whose files this host does not hold is left to their worker
    // (release_ended_runs at its start).
    if (files_are_ours(*run)) {
      null_observer quiet;
      auto& sandboxes = backend(run->sandbox);
      co_await offload([&] { release_workspace(sandboxes, *run, quiet); }, pool::teardown);
    }
    co_await cancel_children(run_id, fmt::format("its parent run {} was cancelled", run_id));
    co_return cancel_outcome::cancelled;
  }
  if (!co_await ledger_->request_cancel_async(run_id, reason)) throw refuse(*journal_.find_run(run_id));
  // Held by nobody alive (in doubt, or its process died): cancel it here.
  run = journal_.find_run(run_id);
  if (is_finished(run->status)) co_return cancel_outcome::cancelled;
  if (run->owner.empty() || check_owner(journal_, run->owner) == owner_state::dead) {
    co_await claim_async(*ledger_, journal_, *run);
    null_observer quiet;
    co_await end_run(run_id, storage::run_status::cancelled, nullptr, protocol::error_info{reason, "cancelled"},
                     quiet);
    co_return cancel_outcome::cancelled;
  }
  co_return cancel_outcome::requested;
}

bool needs_execution(storage::journal& journal, const storage::run_record& run, bool revive_failed) {
  using storage::run_status;
  if (run.status == run_status::completed || run.status == run_status::cancelled) return false;
  if (run.status == run_status::failed || run.status == run_status::in_doubt) return revive_failed;
  // A wait that is not over is left to whoever polls for it: no sandbox for nothing.
  return run.status != run_status::waiting || wait_is_over(journal, run);
}

bool wait_is_over(storage::journal& journal, const storage::run_record& run) {
  const auto now = storage::now_ms();
  if (run.cancel_requested_at_ms || (run.deadline_ms && now >= *run.deadline_ms)) return true;
  if (!run.wait) return true;
  const auto& w = *run.wait;
  if (w.wake_at_ms && timer_due(now, *w.wake_at_ms)) return true;
#ifdef CAIRN_TEST_UNSAFE_SUSPENSION_SPLIT
  // Test seam (cairn_unsafe_suspension_split): a wait hears only the signals
  // sent after its suspension was written, as if the attempt's last look for
  // one and the suspension were not one decision: a signal sent between
  // them is never heard.
  if (w.kind == "signal") {
    auto s = journal.pending_signal(run.id, w.key);
    return s && s->sent_at_ms > run.updated_at_ms;
  }
#else
  // Level, not edge: a signal sent at any time before or after the
  // suspension wakes it, so a signal that came while the attempt was
  // deciding to suspend is not lost.
  if (w.kind == "signal") return journal.has_pending_signal(run.id, w.key);
#endif
  if (w.kind == "child") {
    auto child = journal.find_run(w.key);
    return !child || is_finished(child->status);
  }
  return false;
}

storage::run_record engine::settle(const std::string& run_id, std::uint64_t seq, const settlement& s) {
  auto run = journal_.find_run(run_id);
  if (!run) throw engine_error(errc::not_found, fmt::format("no run '{}' in {}", run_id, journal_.path().string()));
  if (run->status == storage::run_status::running && !run->owner.empty() &&
      check_owner(journal_, run->owner) == owner_state::alive)
    throw engine_error(errc::busy, fmt::format("run {} is being executed by {}; nothing is in doubt while it runs",
                                               run_id, describe_owner(run->owner)));
  auto doubt = find_in_doubt(journal_, run_id);
  if (!doubt)
    throw engine_error(errc::bad_request, fmt::format("run {} has no tool call in doubt; nothing to settle", run_id));
  if (doubt->seq != seq)
    throw engine_error(errc::bad_request, fmt::format("step {} of run {} is not in doubt; the call in doubt is step {} "
                                                      "(tool '{}')",
                                                      seq, run_id, doubt->seq, doubt->tool));
  if (s.outcome == settlement::how::result && protocol::nesting_depth(s.result) > protocol::max_output_depth)
    throw engine_error(errc::bad_request, fmt::format("the result nests deeper than {} levels, more than a step can "
                                                      "hold; record a flatter value",
                                                      protocol::max_output_depth));
  static constexpr const char* names[] = {"result", "error", "retry"};
  effects::tool_settled settled{seq, names[static_cast<int>(s.outcome)], std::nullopt};
  if (s.outcome != settlement::how::retry) {
    storage::step_record record;
    record.run_id = run_id;
    record.result.seq = seq;
    record.result.name = doubt->tool;
    record.result.kind = protocol::step_kind::tool;
    record.result.ok = s.outcome == settlement::how::result;
    if (record.result.ok) record.result.output = s.result;
    else record.result.error = {s.error, "settled"};
    record.started_at_ms = doubt->started_at_ms;
    record.finished_at_ms = storage::now_ms();
    settled.tokens = tokens_of_step(record.result);
    settled.step = std::move(record);
  }
  ledger_->apply(run_id, {std::move(settled), effects::attempts_reset{}});
  return *journal_.find_run(run_id);
}

storage::run_record engine::idle_run(const std::string& run_id) {
  auto run = journal_.find_run(run_id);
  if (!run) throw engine_error(errc::not_found, fmt::format("no run '{}' in {}", run_id, journal_.path().string()));
  if (!run->owner.empty() && run->owner != current_owner().str() &&
      check_owner(journal_, run->owner) != owner_state::dead)
    throw being_executed(run_id, run->owner);
  return *run;
}

std::string engine::replace_agent(const std::string& run_id, const std::filesystem::path& program) {
  const auto run = idle_run(run_id);
  if (storage::is_finished(run.status) && run.status != storage::run_status::failed)
    throw engine_error(errc::bad_request, fmt::format("run {} has ended ({}): there is nothing to resume on another "
                                                      "agent",
                                                      run_id, storage::to_string(run.status)));
  make_home_folders(home());
  auto private_paths = attempt_options_of(run).private_paths;
  effects::agent_chosen chosen;
  try {
    chosen = replacement_agent(std::filesystem::absolute(program), agent_store(home()), private_paths);
  } catch (const runtime::sandbox_error& e) {
    throw engine_error(errc::bad_request, fmt::format("--agent: {}", e.what()));
  }
  const auto before = agent_of_run(journal_, run_id);
  const std::string now = chosen.version.id;
  const std::string agent = chosen.version.program.string();
  ledger_->apply(run_id, {std::move(chosen)});
  return fmt::format("run {} resumes on the agent {} ({}){}", run_id, agent, now,
                     before ? fmt::format("; it ran {} ({}) before", before->agent, before->version) : "");
}

storage::run_record engine::reopen(const std::string& run_id) {
  auto run = idle_run(run_id);
  if (run.status != storage::run_status::failed) return run;
  ledger_->apply(run_id, {effects::attempts_reset{}});
  return *journal_.find_run(run_id);
}

attempt_options engine::attempt_options_of(const storage::run_record& run) const {
  const std::string& run_id = run.id;
  attempt_options o;
  o.hello_timeout = options_.hello_timeout;
  o.exit_grace = options_.exit_grace;
  o.suspend_after = options_.suspend_after;
  o.stopping = options_.stopping;
  o.drain = options_.drain;
  o.llm = options_.llm;
  o.workspace_image = image_of(run);
  o.log_file = run_log(home(), run_id);
  o.private_paths = {home()};
  if (!storage::is_postgres_url(journal_.path().string())) o.private_paths.push_back(journal_.path());
  return o;
}

std::filesystem::path engine::workspace_root() const {
  if (options_.workspace_root.empty()) return {};
  std::error_code ec;
  auto root = std::filesystem::weakly_canonical(options_.workspace_root, ec).lexically_normal();
  if (ec) root = options_.workspace_root.lexically_normal();
  if (!root.has_filename()) root = root.parent_path();
  return root;
}

std::filesystem::path engine::image_of(const storage::run_record& run) const {
  if (options_.workspace_root.empty()) return find_run_image(home(), run.id, run.workspace);
  return image_of_run(home(), workspace_root(), run.id, run.workspace);
}

bool engine::files_are_ours(const storage::run_record& run) {
  if (run.workspace.empty() || unreachable(run)) return false;
  if (!storage::is_postgres_url(journal_.path().string())) return true;
  // A shared journal's row is trusted only for a folder this host made for it.
  const auto w = std::filesystem::path(run.workspace).lexically_normal();
  const auto image = image_of(run);
  return w == default_workspace(home(), run.id).lexically_normal() ||
         image.parent_path().parent_path() == w.parent_path();
}

std::size_t engine::release_ended_runs() {
  std::size_t released = 0;
  std::vector<std::filesystem::path> folders = {home() / "images"};
  if (!workspace_root().empty()) folders.push_back(root_workspace_image(workspace_root(), "ID").parent_path());
  null_observer quiet;
  for (const auto& folder : folders) {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(folder, ec)) {
      // ID.img, or the record ID.img.released of a copy a crash kept from
      // taking the folder's place (the image renamed away already).
      auto name = entry.path().filename().string();
      if (name.ends_with(".img.released")) name.resize(name.size() - std::strlen(".released"));
      if (!name.ends_with(".img")) continue;
      const auto id = name.substr(0, name.size() - std::strlen(".img"));
      if (run_id_problem(id)) continue;
      auto run = journal_.find_run(id);
      if (!run || !is_finished(run->status) || image_of(*run) != folder / name || !files_are_ours(*run)) continue;
      release_workspace(backend(run->sandbox), *run, quiet);
      released += !std::filesystem::exists(entry.path());
    }
  }
  return released;
}

std::optional<std::string> engine::release_ended_run(const std::string& run_id) {
  const auto run = journal_.find_run(run_id);
  // Cheap when there is nothing to do: no image, no copy a crash cut short.
  if (!run || !is_finished(run->status) || !files_are_ours(*run)) return std::nullopt;
  try {
    backend(run->sandbox).release_workspace(run->workspace, image_of(*run));
    return std::nullopt;
  } catch (const std::exception& e) {
    return fmt::format("run {}: its files stay in its quota image {}: {}", run->id, image_of(*run).string(), e.what());
  }
}

std::optional<std::string> engine::unreachable(const storage::run_record& run) {
  // The workers' roots are read only for a workspace that is not this
  // worker's own (the usual case costs no query on a run's way in).
  const auto w = std::filesystem::path(run.workspace).lexically_normal();
  const bool own = w == default_workspace(home(), run.id).lexically_normal() ||
                   (!workspace_root().empty() && w == (workspace_root() / run.id).lexically_normal());
  std::vector<std::string> other_roots;
  if (!run.workspace.empty() && !own)
    for (const auto& worker : journal_.workers()) other_roots.push_back(worker.workspace_root);
  auto why = unreachable_workspace(home(), workspace_root(), run.id, run.workspace, other_roots);
  std::error_code ec;
  if (!why && !run.workspace.empty() && !std::filesystem::exists(run.workspace, ec) &&
      journal_.step_count(run.id) > 0 && !runtime::cut_short_release(run.workspace, image_of(run)))
    why = fmt::format("its workspace {} does not exist on this machine, though {} of its steps were committed: "
                      "their files are elsewhere (storage that is not mounted here?); mount it, or resume the run "
                      "where it is",
                      run.workspace, journal_.step_count(run.id));
  if (!why) return std::nullopt;
  return fmt::format("run {} cannot be executed by {}: {}", run.id, describe_owner(current_owner().str()), *why);
}

std::optional<std::string> engine::not_allowed(const storage::run_record& run, const policy& rules) const {
  if (!storage::is_postgres_url(journal_.path().string())) return std::nullopt;
  const auto& allow = options_.allow;
  auto refusal = [&](const std::string& what, const std::string& flag) {
    return fmt::format("this worker ({}) does not run {}, which any writer of the shared journal could ask for; "
                       "start the worker with `--allow {}` if everyone who may write the journal may do that on "
                       "this host (docs/scale-out.md, who is trusted)",
                       describe_owner(current_owner().str()), what, flag);
  };
  if (run.sandbox == "none" && !allow.sandbox_none)
    return refusal(fmt::format("agents without a sandbox (--sandbox {})", run.sandbox), "sandbox-none");
  if (!rules.commands.empty() && !allow.command_tools)
    return refusal(fmt::format("command tools on the host (the run's policy grants '{}')", rules.commands.begin()->first),
                   "command-tools");
  if (run.workspace.empty()) return std::nullopt;
  const auto w = std::filesystem::path(run.workspace).lexically_normal();
  const auto root = workspace_root();
  const bool own = w == default_workspace(home(), run.id).lexically_normal() ||
                   (!root.empty() && w == (root / run.id).lexically_normal());
  if (own) return std::nullopt;
  if (!allow.any_workspace)
    return refusal(fmt::format("runs in a workspace given at submit ({}), outside its workspace root and "
                               "CAIRN_HOME",
                               w.string()),
                   "any-workspace");
  try {
    // The rules a submitting client applies, applied again here: the row may not have come through one.
    checked_workspace(journal_, home(), w, run.id);
  } catch (const engine_error& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

void engine::ready_run_files(const storage::run_record& run) {
  const auto root = workspace_root();
  if (root.empty() || run.workspace.empty() ||
      std::filesystem::path(run.workspace).lexically_normal() != (root / run.id).lexically_normal())
    return;
  make_root_folders(root);
  // Before images lived under the shared root, a worker kept them in its home.
  const auto image = root_workspace_image(root, run.id), old = workspace_image(home(), run.id);
  if (auto why = runtime::adopt_image(old, image))
    throw engine_error(errc::busy, fmt::format("run {}: {}", run.id, *why));
}

const std::filesystem::path& engine::home() const {
  if (options_.home.empty()) throw engine_error(errc::bad_request, "the engine has no CAIRN_HOME (engine_options::home)");
  return options_.home;
}

runtime::sandbox_backend& engine::backend(const std::string& name) {
  auto& slot = backends_[name];
  if (!slot) slot = options_.backends(name);
  return *slot;
}

std::vector<storage::run_record> engine::orphaned_runs() {
  std::vector<storage::run_record> found;
  const worker_leases leases(journal_);
  for (auto& run : journal_.list_runs()) {
    bool orphan = ((run.status == storage::run_status::running || run.status == storage::run_status::pending) &&
                   (run.owner.empty() || leases.check(run.owner) == owner_state::dead)) ||
                  (run.status == storage::run_status::waiting && wait_is_over(journal_, run));
    if (orphan) found.push_back(std::move(run));
  }
  std::reverse(found.begin(), found.end());
  return found;
}

std::string new_run_id() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("run-{:012x}", rng() & 0xffffffffffffULL);
}

}  // namespace cairn::engine
