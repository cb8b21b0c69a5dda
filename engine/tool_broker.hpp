// The crossing: executes an agent's tool calls for one run. Checks the run's
// policy, has the durable `tool_started` effect recorded, calls the tool on
// the host, and returns the outcome for the caller to journal before it
// answers the agent. A refused call is an outcome like any other (journaled,
// and the agent can catch it); nothing is called then. The broker writes
// nothing itself.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "engine/effects.hpp"
#include "engine/policy.hpp"
#include "engine/tools/llm_chat.hpp"
#include "engine/tools/tool.hpp"
#include "protocol/messages.hpp"

namespace cairn::engine {

class tool_broker {
 public:
  // Makes a tool_started effect durable before the call; throws
  // budget_exceeded when the run's journal limits refuse it.
  using recorder = std::function<void(const effects::tool_started&)>;

  // `run_id` and `p` must outlive the broker. `llm_tokens_spent`: what the
  // run's journaled llm.chat calls counted against its token budget. `emit`
  // receives live events (e.g. LLM tokens); it is not journaled.
  tool_broker(const std::string& run_id, const policy& p, const std::optional<llm_endpoint>& llm,
              std::uint64_t llm_tokens_spent, recorder record, std::function<void(const json&)> emit);

  // The outcome of the call, ready to journal: kind tool, name the tool's,
  // `attempt` one more than `previous_attempts` (the times the host started
  // this call before). Throws budget_exceeded, before calling anything, when
  // the started record would take the run past its journal_mb.
  protocol::step_result call(const protocol::tool_msg& m, int previous_attempts);

 private:
  const std::string& run_id_;
  const policy& policy_;
  recorder record_;
  std::function<void(const json&)> emit_;
  std::map<std::string, std::unique_ptr<tool>> tools_;
};

}  // namespace cairn::engine
