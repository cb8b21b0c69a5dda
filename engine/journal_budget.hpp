// What a run may still write to the journal: the policy's journal_mb over
// all its steps, tool calls and events, and step_output_mb over each step.
// One per attempt: it asks the journal once what the run occupies, then
// counts what the attempt writes. The few bytes the journal adds by itself
// (attempt_started, run_waiting, signal_delivered: one per attempt or step)
// are counted from the next attempt on.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "engine/effects.hpp"
#include "engine/policy.hpp"
#include "storage/journal.hpp"
#include "storage/payloads.hpp"

namespace cairn::engine {

class journal_budget {
 public:
  // `limits` must outlive the budget.
  journal_budget(storage::journal& journal, const std::string& run_id, const journal_limits& limits);

  // Counts a step about to be journaled as journal::bytes_of_run counts
  // it: its name, error message and type, or its output as stored (with
  // references for its long parts) and the payloads the run has not stored
  // yet (storage/payloads.hpp). Throws budget_exceeded, counting nothing,
  // when its output is over step_output_mb (as JSON text, whole) or it
  // would take the run past journal_mb.
  void charge_step(const protocol::step_result& step);
  // Counts an event about to be journaled as the journal stores it: its
  // kind, its data with references for its long parts, and the payloads the
  // run has not stored yet. Throws budget_exceeded when it would take the
  // run past journal_mb.
  void charge_event(std::string_view kind, const json& data);

 private:
  // Charges `bytes` and the pieces not charged yet.
  void charge_with(std::uint64_t bytes, const std::vector<storage::payload>& pieces, const std::string& what);
  void charge(std::uint64_t bytes, const std::string& what);

  const journal_limits& limits_;
  std::uint64_t used_;
  // The payloads charged by this attempt; those of earlier attempts are in
  // used_ already, and are charged again (once) if the attempt repeats them.
  std::unordered_set<std::string> charged_payloads_;
};

}  // namespace cairn::engine
