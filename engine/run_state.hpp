// A run's state beside its history (Temporal's mutable state): what its
// writer would otherwise find again by scanning the run's events and steps.
// The ledger changes it in the same transaction as the effects that change
// it (storage keeps it as JSON, journal::run_state); resume, suspension,
// budget checks and `cairn show` read it in one row, however long the
// history. Attempts, the cancel request and journal bytes live in the run's
// row and in storage's own counter (run_record, journal::bytes_of_run);
// children are found by their parent (journal::children), not by history.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/effects.hpp"
#include "storage/journal.hpp"

namespace cairn::engine {

using json = nlohmann::json;

// A tool call the host started and whose outcome is not journaled yet.
struct unsettled_call {
  std::string tool;
  std::string idempotency;  // "idempotent" or "at_most_once"
  json args;
  std::int64_t started_at_ms = 0;
};

// The agent version a run executes (effects::agent_chosen), as the worker
// finds its copy: in its own CAIRN_HOME/agents, by `version` and `program`.
struct run_agent {
  std::string agent;    // the path it was identified at: what is there now is compared with `version`
  std::string version;  // runtime::agent_version::id
  std::string program;  // the program's name in its folder (and in the copy)
  bool operator==(const run_agent&) const = default;
};

struct run_state {
  // The step the per-step fields below are about: the one after the last
  // journaled step when any of them was last set. For any other step they
  // are zero and empty (nothing happened at it).
  std::uint64_t seq = 0;
  int step_failures = 0;  // retry_due effects at seq
  int tool_attempts = 0;  // tool_started effects at seq
  std::optional<unsettled_call> tool;
  std::optional<effects::timer_set> timer;
  std::optional<effects::wait_started> wait;

  std::uint64_t llm_tokens = 0;  // of every journaled llm.chat result
  // When the run was suspended within the last hour, oldest first (at most
  // one more than the most limits.suspensions_per_hour allows).
  std::vector<std::int64_t> suspended_at_ms;
  // None for a run that has not begun an attempt (or began it with a cairn
  // that did not identify agents).
  std::optional<run_agent> agent;

  // What the per-step fields say of step `at`.
  int failures_at(std::uint64_t at) const { return at == seq ? step_failures : 0; }
  int tool_attempts_at(std::uint64_t at) const { return at == seq ? tool_attempts : 0; }
  std::optional<effects::timer_set> timer_at(std::uint64_t at) const;
  std::optional<effects::wait_started> wait_at(std::uint64_t at) const;
  std::optional<unsettled_call> tool_at(std::uint64_t at) const;
  std::uint64_t suspensions_since(std::int64_t since_ms) const;
};

json to_json(const run_state& s);
// The state as the ledger stored it; {} (a new run's) is the empty state.
// A value that is not one (written by something else) is
// storage_error(corrupt).
run_state run_state_of(const json& stored);

// Whether `e` changes a run's state: only these make the ledger read and
// write it.
bool changes_state(const effect& e);
// Changes `s` by what `e` did at `now_ms`.
void change(run_state& s, const effect& e, std::int64_t now_ms);

// An llm.chat result's tokens (tools/llm_chat.hpp's tokens_counted).
using tokens_of = std::uint64_t (*)(const json& result);

// The run's state as kept; nullopt for a run written before the journal
// kept one (the ledger leaves such a run's unkept to its end, and readers
// derive what they need with the calls below, by scanning as before).
std::optional<run_state> kept_run_state(storage::journal& journal, const std::string& run_id);
// The per-step fields at the run's next step: kept, or derived from the
// events at that step.
run_state step_state(storage::journal& journal, const std::string& run_id);
// Derived from the run's history.
void derive_step_fields(run_state& s, storage::journal& journal, const std::string& run_id);
std::vector<std::int64_t> derive_suspensions(storage::journal& journal, const std::string& run_id,
                                             std::int64_t now_ms);
std::uint64_t derive_tokens(storage::journal& journal, const std::string& run_id, tokens_of tokens);
std::optional<run_agent> derive_agent(storage::journal& journal, const std::string& run_id);
// The run's agent version: kept, or derived from its events.
std::optional<run_agent> agent_of_run(storage::journal& journal, const std::string& run_id);
// All of it: the oracle the ledger's tests hold the kept state to.
run_state derive_run_state(storage::journal& journal, const std::string& run_id, tokens_of tokens,
                           std::int64_t now_ms);

}  // namespace cairn::engine
