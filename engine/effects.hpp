// What happened to a run, as the code that drives it reports it: the attempt
// driver, the waits and the tool broker return these typed effects and never
// write the journal; the ledger (ledger.hpp) applies them, and is the one
// place that knows how each is stored.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>

#include "protocol/messages.hpp"
#include "runtime/agent_version.hpp"
#include "storage/journal.hpp"

namespace cairn::engine {

// What a step's commit stores of the workspace (workspace_checkpoints.hpp):
// the event's data ({"files": {PATH: ENTRY}, "removed": [PATH], "bytes":
// the compressed size of the pieces it stored new}), those pieces, and
// every digest the event names.
struct workspace_checkpoint {
  nlohmann::json data;
  std::vector<storage::blob> blobs;
  std::vector<std::string> used;
};

}  // namespace cairn::engine

namespace cairn::engine::effects {

using json = nlohmann::json;

// A signal a step delivers.
struct delivered_signal {
  std::int64_t id = 0;
  std::string name;
};

// A step's outcome, final: replay returns exactly this. With `signal`, the
// step is the delivery of that signal (delivered once).
struct step_committed {
  storage::step_record record;
  std::optional<delivered_signal> signal;
  std::uint64_t tokens = 0;  // a model's tokens the step's result counts (an llm.chat result's usage)
  // What the step changed in the workspace, stored with it (workspace_checkpoints.hpp).
  std::optional<workspace_checkpoint> checkpoint;
};

// An attempt of a failed step, to be made again after `delay_ms`.
struct retry_due {
  std::uint64_t seq = 0;
  std::string name;
  int attempt = 0;  // the attempt that failed, 1-based
  protocol::error_info error;
  std::int64_t delay_ms = 0;
};

// The host is about to call a tool: durable before the call, so that an
// at-most-once call found with no result is in doubt, never repeated.
// `args` as the agent sent them (cairn show, and settle, show them).
struct tool_started {
  std::uint64_t seq = 0;
  std::string tool;
  std::string idempotency;  // "idempotent" or "at_most_once"
  json args;
};

// `cairn settle` recorded what an in-doubt call did: `step` when it gave a
// result or an error, none when the call is to be made again.
struct tool_settled {
  std::uint64_t seq = 0;
  std::string how;  // "result", "error" or "retry"
  std::optional<storage::step_record> step;
  std::uint64_t tokens = 0;  // as step_committed's, of `step`
};

// A sleep's wake time, fixed on first sight so that a replay keeps it.
struct timer_set {
  std::uint64_t seq = 0;
  std::int64_t until_ms = 0;
  bool in_past = false;
};

// A wait for a signal began; its deadline (none: no timeout) is kept for replays.
struct wait_started {
  std::uint64_t seq = 0;
  std::string signal;
  std::optional<std::int64_t> deadline_ms;
};

// A child run, created once (a replay finds the same id).
struct child_started {
  storage::new_run child;
};

struct sandbox_warning {
  std::string message;
};

struct cancel_sent {
  std::string reason;
  std::int64_t grace_seconds = 0;
};

// The run ran into one of its policy's limits (`limit` names it).
struct limit_exceeded {
  std::string limit;
  std::string message;
};

struct attempt_crashed {
  int attempt = 0;
  std::string error;
  bool will_retry = false;
};

// The run waits for `wait` without a sandbox; `count` suspensions within the
// last hour, this one included, and what this one cost.
struct suspended {
  storage::wait_spec wait;
  std::uint64_t count = 0;
  std::uint64_t bytes_written = 0;
  std::int64_t cpu_ms = 0;
  std::int64_t ms = 0;
};

// The host hands the run back (it is shutting down): pending, no owner.
struct released {
  std::string reason;
};

// completed with `output`; failed, cancelled or in_doubt with `error`.
struct run_ended {
  storage::run_status status = storage::run_status::completed;
  json output;
  std::optional<protocol::error_info> error;
};

// A failed or settled run gets a fresh set of attempts.
struct attempts_reset {};

// The version of the agent the run executes from now on (agent_versions.hpp):
// identified at its first attempt, or given by `cairn resume --agent`
// (`replaced`, by a request). `kept`: the copy its attempts execute, "" when
// none could be kept (`unkept` says why; they execute `version.program`).
struct agent_chosen {
  runtime::agent_version version;
  std::string kept;
  std::string unkept;
  bool replaced = false;
};

// The workspace as the run's first checkpointing attempt found it, before
// its agent started: what a crash before the first step rolls back to
// (workspace_checkpoints.hpp).
struct workspace_baseline {
  workspace_checkpoint checkpoint;
};

// At an attempt, what is at the run's agent path is not the version the run
// began with (`was`, `now`: version ids); the attempt executes `runs`.
struct agent_changed {
  std::string agent;
  std::string was, now;
  std::string runs;
};

}  // namespace cairn::engine::effects

namespace cairn::engine {

// Effects that would take the run past one of its journal limits; nothing of
// them was written. `limit` is the policy key (journal_mb or step_output_mb).
struct budget_exceeded {
  std::string limit;
  std::string message;
};

using effect = std::variant<effects::step_committed, effects::retry_due, effects::tool_started, effects::tool_settled,
                            effects::timer_set, effects::wait_started, effects::child_started,
                            effects::sandbox_warning, effects::cancel_sent, effects::limit_exceeded,
                            effects::attempt_crashed, effects::suspended, effects::released, effects::run_ended,
                            effects::attempts_reset, effects::agent_chosen, effects::agent_changed,
                            effects::workspace_baseline>;

}  // namespace cairn::engine
