// The crossing: executes an agent's tool calls for one run. Checks the run's
// policy, writes the durable `tool_started` record, calls the tool on the
// host, and returns the outcome for the caller to journal before it answers
// the agent. A refused call is an outcome like any other (journaled, and the
// agent can catch it); nothing is called then.
//
// Journal records (events, at the call's seq):
//   tool_started  {"tool", "idempotency", "args"}  durable before the call; "args"
//                 only for an at-most-once call, which `cairn settle` shows (an
//                 idempotent one is simply made again, with the args replay sends)
//   tool_settled  {"how": "result" | "error" | "retry"}    written by `cairn settle`
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "engine/journal_budget.hpp"
#include "engine/policy.hpp"
#include "engine/tools/llm_chat.hpp"
#include "engine/tools/tool.hpp"
#include "protocol/messages.hpp"
#include "storage/journal.hpp"

namespace cairn::engine {

class tool_broker {
 public:
  // `journal`, `run` and `budget` must outlive the broker. `emit` receives
  // live events (e.g. LLM tokens); it is not journaled.
  tool_broker(storage::journal& journal, const storage::run_record& run, const policy& p, journal_budget& budget,
              const std::optional<llm_endpoint>& llm, std::function<void(const json&)> emit);

  // The outcome of the call, ready to journal: kind tool, name the tool's.
  // Throws budget_exceeded, before calling anything, when the started
  // record would take the run past its journal_mb.
  protocol::step_result call(const protocol::tool_msg& m);

 private:
  // What the run's journaled llm.chat calls counted against its token budget.
  std::uint64_t llm_tokens_spent() const;

  storage::journal& journal_;
  const storage::run_record& run_;
  const policy& policy_;
  journal_budget& budget_;
  std::function<void(const json&)> emit_;
  std::map<std::string, std::unique_ptr<tool>> tools_;
};

// An at-most-once call that was started but whose outcome never reached the
// journal: it may or may not have happened.
struct in_doubt_call {
  std::uint64_t seq = 0;
  std::string tool;
  json args;
  std::int64_t started_at_ms = 0;
  std::string message;  // what happened and how to settle it, for the user
};

// The call in doubt at the run's next seq, if any (a settled one is not).
std::optional<in_doubt_call> find_in_doubt(storage::journal& journal, const std::string& run_id);

}  // namespace cairn::engine
