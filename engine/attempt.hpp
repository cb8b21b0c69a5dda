// One attempt of a run: one sandbox, from handshake to done/fail, death,
// suspension or cancellation. The driver never writes the journal: what
// happens becomes typed effects (effects.hpp) that it hands to its
// attempt_journal, and it answers the agent only once that returned (the
// effect is durable). Private to the engine.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/effects.hpp"
#include "engine/io.hpp"
#include "engine/policy.hpp"
#include "engine/tools/llm_chat.hpp"
#include "engine/wakeups.hpp"
#include "runtime/sandbox.hpp"

namespace cairn::engine {

// What the engine tells whoever watches a run. Called on the executing thread.
class run_observer {
 public:
  virtual ~run_observer() = default;
  virtual void on_attempt(const storage::run_record&, int /*attempt*/) {}
  virtual void on_step(const storage::step_record&) {}
  virtual void on_retry(const effects::retry_due&) {}
  virtual void on_emit(const json&) {}
  virtual void on_attempt_failed(int /*attempt*/, const std::string& /*reason*/, bool /*will_retry*/) {}
  virtual void on_warning(const std::string&) {}
  // The attempt's sandbox is ready: it came from the warm pool (`pooled`),
  // perhaps with its agent running already (`agent_started`), or was made
  // for it; `took` from asking to ready, its agent started unless the
  // sandbox has warnings (they are reported first).
  virtual void on_sandbox(const std::string& /*run_id*/, bool /*pooled*/, bool /*agent_started*/,
                          std::chrono::microseconds /*took*/) {}
  // The run was suspended until `wait` is over.
  virtual void on_wait(const storage::run_record&, const storage::wait_spec&) {}
};

// What an attempt keeps of its workspace as its steps commit (the engine's
// workspace_checkpoints.hpp): taken on a pool thread, one step at a time.
class workspace_keeper {
 public:
  virtual ~workspace_keeper() = default;
  // What changed since the last checkpoint, for the step about to commit;
  // nullopt when nothing did. Throws budget_exceeded past limits.checkpoint_mb.
  virtual std::optional<workspace_checkpoint> take() = 0;
};

// An attempt's workspace as it begins, before its agent is told to start.
struct workspace_watch {
  std::unique_ptr<workspace_keeper> keeper;      // none: no checkpoints this attempt
  std::optional<workspace_checkpoint> baseline;  // to journal first: the files as the run's first attempt found them
  std::string warning;  // why none are kept, or what a roll-back put back
};

// The driver's side of the journal: what it reads of its run, and where its
// effects go. The engine implements it over the ledger.
class attempt_journal {
 public:
  virtual ~attempt_journal() = default;

  // Makes the effect durable (and nothing of it when it throws):
  // budget_exceeded (journal_budget.hpp) when they would take the run past
  // its journal limits, storage errors as the journal reports them.
  virtual task<void> apply(effect e) = 0;
  // Creates `child` (its workspace is filled in) unless the run's tree
  // refuses it; returns the refusal, for the agent, when it does. A child
  // created before (a replay) is found again.
  virtual task<std::optional<std::string>> start_child(storage::new_run child, const policy& p) = 0;

  // How many steps the run has journaled.
  virtual std::uint64_t step_count() = 0;
  // The journaled steps from `from` on, before `until`, in order: as many as
  // fit `max_bytes` of JSON, and at least one when there is one.
  virtual std::vector<protocol::step_result> history(std::uint64_t from, std::uint64_t until,
                                                     std::uint64_t max_bytes) = 0;
  // How many attempts of the step at `seq` failed (step_retry effects).
  virtual int step_failures(std::uint64_t seq) = 0;
  // How many times the host started the tool call at `seq`.
  virtual int tool_attempts(std::uint64_t seq) = 0;
  virtual std::optional<effects::timer_set> timer_at(std::uint64_t seq) = 0;
  virtual std::optional<effects::wait_started> wait_at(std::uint64_t seq) = 0;
  // The reason given when someone asked to cancel the run; none if nobody did.
  virtual std::optional<std::string> cancel_requested() = 0;
  // Throws storage_error(fenced) when another process has taken the run over.
  virtual task<void> confirm_held() = 0;
  virtual std::optional<storage::signal_record> pending_signal(const std::string& name) = 0;
  virtual std::optional<storage::run_record> find_run(const std::string& id) = 0;
  // Tokens the run's journaled llm.chat calls counted.
  virtual std::uint64_t llm_tokens_spent() = 0;
  // Watches the run's workspace for its checkpoints (after a crash, puts
  // back what the attempt before wrote past its last step first). The
  // default keeps none (a journal of a test's own).
  virtual task<workspace_watch> watch_workspace(const storage::run_record&, const policy&) { co_return workspace_watch{}; }
};

// The engine's settings an attempt needs (engine_options holds them).
struct attempt_options {
  std::chrono::milliseconds hello_timeout{10'000};
  std::chrono::milliseconds exit_grace{2'000};
  std::chrono::milliseconds suspend_after{2'000};
  const std::atomic<bool>* stopping = nullptr;
  std::chrono::milliseconds drain{10'000};
  std::optional<llm_endpoint> llm;
  // Host paths of the run's workspace image and log.
  std::filesystem::path workspace_image, log_file;
  // What a script agent's folder must never show (sandbox_spec::private_paths).
  std::vector<std::filesystem::path> private_paths;
  // The program to execute: the run's agent as kept (agent_versions.hpp);
  // empty: the run's agent path. A child agent named alone is looked for
  // beside it.
  std::filesystem::path agent;
};

struct attempt_result {
  enum class kind {
    completed,  // the agent sent done; `output` holds its result
    failed,     // the workflow failed, or broke the protocol: retrying won't help
    crashed,    // the sandbox died or hung without finishing: retry from the journal
    suspended,  // the agent waits longer than suspend_after: the sandbox is gone, see `wait`
    released,   // the host is shutting down: the sandbox is gone, the run goes back to the queue
    cancelled,  // `cairn cancel`: the agent stopped, or was killed after the grace period
    restart,    // the host ended a step (timeout, or out of attempts) and killed the sandbox: replay from the
                // journal; counted against the run's attempts like a crash
  };
  // failed with error type "limit_exceeded" when the sandbox ran into one of
  // the policy's limits (the same code would run into it again) or the run
  // outlived limits.run_wall_seconds, "timeout" when it outlived
  // timeouts.run_seconds.
  kind outcome = kind::crashed;
  json output;
  protocol::error_info error;
  storage::wait_spec wait;  // when suspended
};

task<attempt_result> run_attempt(attempt_journal& journal, attempt_wakeups& wakeups, runtime::sandbox_backend& backend,
                           const storage::run_record& run, const policy& p, int attempt,
                           const attempt_options& options, run_observer& observer);

}  // namespace cairn::engine
