#include "engine/tool_broker.hpp"

#include <fmt/format.h>

#include "runtime/crash_point.hpp"
#include "engine/tools/command_tool.hpp"
#include "protocol/text.hpp"

namespace cairn::engine {
namespace {

// A tool call's duration, as the machine measured it.
using steady = std::chrono::steady_clock;

// A tool call's outcome before it is known.
protocol::step_result outcome_of(const protocol::tool_msg& m) {
  protocol::step_result r;
  r.seq = m.seq;
  r.name = m.name;
  r.kind = protocol::step_kind::tool;
  return r;
}

}  // namespace

tool_broker::tool_broker(const std::string& run_id, const policy& p, const std::optional<llm_endpoint>& llm,
                         std::uint64_t llm_tokens_spent, std::function<void(const json&)> emit)
    : run_id_(run_id), policy_(p), emit_(std::move(emit)) {
  if (p.http_fetch) tools_["http.fetch"] = make_http_fetch(*p.http_fetch);
  if (p.llm_chat) tools_["llm.chat"] = make_llm_chat(*p.llm_chat, llm, llm_tokens_spent);
  for (const auto& [name, spec] : p.commands)
    tools_[name] =
        make_command_tool({name, spec.command, spec.input, spec.timeout, spec.kind, spec.max_output_bytes, spec.env});
  if (const auto& extra = granted_test_tools())
    for (auto& [name, t] : extra()) tools_[name] = std::move(t);
}

std::variant<protocol::step_result, effects::tool_started> tool_broker::prepare(const protocol::tool_msg& m) const {
  auto refused = [&](const tool_error& error) {
    protocol::step_result r = outcome_of(m);
    r.ok = false;
    r.error = {error.what(), error.type()};
    return r;
  };
  auto it = tools_.find(m.name);
  if (it == tools_.end()) {
    auto granted = policy_.tool_names();
    std::string list;
    for (const auto& n : granted) list += (list.empty() ? "" : ", ") + n;
    return refused(tool_error("refused", fmt::format("tool '{}' is not granted by this run's policy ({}); grant it "
                                                     "under \"tools\" in the policy file",
                                                     protocol::clip(m.name, 64),
                                                     list.empty() ? "it grants none" : "granted: " + list)));
  }
  try {
    const idempotency kind = it->second->kind(m.args);
    // The request is journaled as asked, for every tool: `cairn show` tells
    // what the model was asked, and an at-most-once call left in doubt what
    // to settle. Its long strings are stored once per run (payloads.hpp).
    return effects::tool_started{m.seq, m.name, std::string(to_string(kind)), m.args};
  } catch (const tool_error& e) {
    return refused(e);
  }
}

protocol::step_result tool_broker::perform(const protocol::tool_msg& m, int previous_attempts) {
  const auto started = steady::now();
  runtime::crash_point("tool_started");
  runtime::crash_point("tool_started." + m.name);
  tool_call call;
  call.run_id = run_id_;
  call.seq = m.seq;
  call.idempotency_key = fmt::format("{}/{}", run_id_, m.seq);
  call.args = m.args;
  call.emit = emit_;
  protocol::step_result r = outcome_of(m);
  r.attempt = previous_attempts + 1;
  try {
    r.output = tools_.at(m.name)->call(call);
    r.ok = true;
  } catch (const tool_error& e) {
    r.ok = false;
    r.error = {e.what(), e.type()};
  } catch (const std::exception& e) {
    r.ok = false;
    r.error = {fmt::format("tool {} failed: {}", m.name, e.what()), "failed"};
  }
  runtime::crash_point("tool_returned");
  runtime::crash_point("tool_returned." + m.name);
  r.duration_us = std::chrono::duration_cast<std::chrono::microseconds>(steady::now() - started).count();
  return r;
}

}  // namespace cairn::engine
