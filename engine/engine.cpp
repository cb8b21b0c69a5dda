#include "engine/engine.hpp"

#include <algorithm>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "engine/attempt.hpp"
#include "engine/crash_point.hpp"
#include "engine/owner.hpp"
#include "engine/tool_broker.hpp"

namespace cairn::engine {
namespace {

class null_observer : public run_observer {};

std::chrono::milliseconds backoff_after(const engine_options& o, int crashes) {
  auto ms = o.retry_backoff.count() << std::min(crashes - 1, 20);
  return std::chrono::milliseconds(std::min<std::int64_t>(ms, o.max_backoff.count()));
}

// Takes the run for this process, or explains who has it.
void claim(storage::journal& journal, const storage::run_record& run) {
  const std::string me = current_owner().str();
  if (!run.owner.empty() && run.owner != me) {
    switch (check_owner(run.owner)) {
      case owner_state::alive:
        throw engine_error(errc::busy, fmt::format("run {} is being executed by {}; wait for it, or stop that "
                                                   "process and `cairn resume {}`",
                                                   run.id, describe_owner(run.owner), run.id));
      case owner_state::unknown:
        throw engine_error(errc::busy, fmt::format("run {} is owned by {}, which this machine cannot check; "
                                                   "resume it there",
                                                   run.id, run.owner));
      case owner_state::dead:
        break;
    }
  }
  if (!journal.claim_run(run.id, run.owner, me))
    throw engine_error(errc::busy, fmt::format("run {} was taken by another process just now", run.id));
}

}  // namespace

backend_factory default_backends() {
  return [](const std::string& name) -> std::unique_ptr<runtime::sandbox_backend> {
    if (name == "bwrap") return runtime::make_bwrap_backend();
    if (name == "none") return runtime::make_process_backend();
    throw engine_error(errc::bad_request, "unknown sandbox '" + name + "': use bwrap (default) or none");
  };
}

engine::engine(storage::journal& journal, engine_options options)
    : journal_(journal), options_(std::move(options)) {}

std::pair<storage::run_record, bool> engine::submit(const run_request& request) {
  if (request.max_attempts < 1) throw engine_error(errc::bad_request, "--max-attempts must be at least 1");
  backend(request.sandbox);  // rejects an unknown sandbox before anything is written
  storage::new_run run;
  run.id = request.id.empty() ? new_run_id() : request.id;
  run.agent = std::filesystem::absolute(request.agent).lexically_normal().string();
  run.input = request.input;
  run.max_attempts = request.max_attempts;
  run.sandbox = request.sandbox;
  run.workspace = std::filesystem::absolute(request.workspace).lexically_normal().string();
  run.policy = to_json(request.policy);
  return journal_.create_run(run);
}

storage::run_record engine::execute(const std::string& run_id, run_observer* observer) {
  null_observer quiet;
  run_observer& watch = observer ? *observer : quiet;

  auto run = journal_.find_run(run_id);
  if (!run) throw engine_error(errc::not_found, fmt::format("no run '{}' in {}", run_id, journal_.path().string()));
  if (run->status == storage::run_status::completed) return *run;

  if (run->status == storage::run_status::failed) {
    journal_.reset_attempts(run_id);
    run = journal_.find_run(run_id);
  }
  claim(journal_, *run);

  auto& sandboxes = backend(run->sandbox);
  std::filesystem::create_directories(options_.log_dir);
  policy rules;
  try {
    rules = parse_policy(run->policy);
  } catch (const policy_error& e) {
    journal_.finish_run(run_id, storage::run_status::failed, nullptr,
                        protocol::error_info{std::string("the run's stored policy is no longer valid here: ") + e.what(),
                                             "policy"});
    return *journal_.find_run(run_id);
  }
  // Crashes counted in this process: a dead host does not use up the agent's attempts.
  int crashes = 0;
  for (;;) {
    if (auto doubt = find_in_doubt(journal_, run_id)) {
      journal_.finish_run(run_id, storage::run_status::in_doubt, nullptr, protocol::error_info{doubt->message, "in_doubt"});
      return *journal_.find_run(run_id);
    }
    run = journal_.find_run(run_id);
    const int attempt = journal_.begin_attempt(run_id);
    if (run->sandbox == "none")
      watch.on_warning("run " + run_id + " executes WITHOUT a sandbox (--sandbox none): the agent can read and "
                                         "write everything this user can");
    watch.on_attempt(*run, attempt);

    attempt_result result;
    try {
      result = run_attempt(journal_, sandboxes, *run, rules, attempt, options_, watch);
    } catch (const runtime::sandbox_error& e) {
      result = {attempt_result::kind::failed, nullptr, {e.what(), "sandbox"}};
    }

    if (result.outcome == attempt_result::kind::crashed) {
      ++crashes;
      bool retry = crashes < run->max_attempts;
      journal_.append_event(run_id, "attempt_crashed",
                            {{"attempt", attempt}, {"error", result.error.message}, {"will_retry", retry}});
      watch.on_attempt_failed(attempt, result.error.message, retry);
      if (retry) {
        std::this_thread::sleep_for(backoff_after(options_, crashes));
        continue;
      }
      result.error.message = fmt::format("gave up after {} crashed attempt{}; last: {}", crashes,
                                         crashes == 1 ? "" : "s", result.error.message);
    }
    crash_point("before_finish");
    if (result.outcome == attempt_result::kind::completed)
      journal_.finish_run(run_id, storage::run_status::completed, result.output, std::nullopt);
    else
      journal_.finish_run(run_id, storage::run_status::failed, nullptr, result.error);
    try {
      sandboxes.release_workspace(run->workspace);
    } catch (const std::exception& e) {
      watch.on_warning(fmt::format("run {} ended, but its workspace could not be released: {}", run_id, e.what()));
    }
    return *journal_.find_run(run_id);
  }
}

storage::run_record engine::settle(const std::string& run_id, std::uint64_t seq, const settlement& s) {
  auto run = journal_.find_run(run_id);
  if (!run) throw engine_error(errc::not_found, fmt::format("no run '{}' in {}", run_id, journal_.path().string()));
  if (run->status == storage::run_status::running && !run->owner.empty() &&
      check_owner(run->owner) == owner_state::alive)
    throw engine_error(errc::busy, fmt::format("run {} is being executed by {}; nothing is in doubt while it runs",
                                               run_id, describe_owner(run->owner)));
  auto doubt = find_in_doubt(journal_, run_id);
  if (!doubt)
    throw engine_error(errc::bad_request, fmt::format("run {} has no tool call in doubt; nothing to settle", run_id));
  if (doubt->seq != seq)
    throw engine_error(errc::bad_request, fmt::format("step {} of run {} is not in doubt; the call in doubt is step {} "
                                                      "(tool '{}')",
                                                      seq, run_id, doubt->seq, doubt->tool));
  static constexpr const char* names[] = {"result", "error", "retry"};
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
    journal_.append_step(record);
  }
  journal_.append_event(run_id, "tool_settled", {{"how", names[static_cast<int>(s.outcome)]}}, seq);
  journal_.reset_attempts(run_id);
  return *journal_.find_run(run_id);
}

runtime::sandbox_backend& engine::backend(const std::string& name) {
  auto& slot = backends_[name];
  if (!slot) slot = options_.backends(name);
  return *slot;
}

std::vector<storage::run_record> engine::orphaned_runs() {
  std::vector<storage::run_record> found;
  for (auto& run : journal_.list_runs()) {
    bool orphan = (run.status == storage::run_status::running && check_owner(run.owner) == owner_state::dead) ||
                  (run.status == storage::run_status::pending && run.owner.empty());
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
