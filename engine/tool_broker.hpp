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
#include <variant>

#include "engine/effects.hpp"
#include "engine/policy.hpp"
#include "engine/tools/llm_chat.hpp"
#include "engine/tools/tool.hpp"
#include "protocol/messages.hpp"

namespace cairn::engine {

class tool_broker {
 public:
  // `run_id` and `p` must outlive the broker. `llm_tokens_spent`: what the
  // run's journaled llm.chat calls counted against its token budget. `emit`
  // receives live events (e.g. LLM tokens), on the thread that performs the
  // call; it is not journaled.
  tool_broker(const std::string& run_id, const policy& p, const std::optional<llm_endpoint>& llm,
              std::uint64_t llm_tokens_spent, std::function<void(const json&)> emit);

  // Checks the call against the policy: its refusal, an outcome ready to
  // journal, or the tool_started effect to make durable before perform()
  // (after a crash, an at-most-once call with that record and no result is
  // in doubt, never silently repeated).
  std::variant<protocol::step_result, effects::tool_started> prepare(const protocol::tool_msg& m) const;
  // Calls the tool that prepare() let through, for as long as it runs (off
  // the event loop), and returns the outcome, ready to journal: kind tool,
  // name the tool's, attempt one more than `previous_attempts` (the times
  // the host started this call before).
  protocol::step_result perform(const protocol::tool_msg& m, int previous_attempts);

 private:
  const std::string& run_id_;
  const policy& policy_;
  std::function<void(const json&)> emit_;
  std::map<std::string, std::unique_ptr<tool>> tools_;
};

}  // namespace cairn::engine
