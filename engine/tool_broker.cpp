#include "engine/tool_broker.hpp"

#include <fmt/format.h>

#include "engine/crash_point.hpp"
#include "engine/tools/command_tool.hpp"

namespace cairn::engine {
namespace {

using clock = std::chrono::steady_clock;

std::string clip(const std::string& s, std::size_t max) { return s.size() <= max ? s : s.substr(0, max) + "..."; }

}  // namespace

tool_broker::tool_broker(const std::string& run_id, const policy& p, const std::optional<llm_endpoint>& llm,
                         std::uint64_t llm_tokens_spent, recorder record, std::function<void(const json&)> emit)
    : run_id_(run_id), policy_(p), record_(std::move(record)), emit_(std::move(emit)) {
  if (p.http_fetch) tools_["http.fetch"] = make_http_fetch(*p.http_fetch);
  if (p.llm_chat) tools_["llm.chat"] = make_llm_chat(*p.llm_chat, llm, llm_tokens_spent);
  for (const auto& [name, spec] : p.commands)
    tools_[name] =
        make_command_tool({name, spec.command, spec.input, spec.timeout, spec.kind, spec.max_output_bytes, spec.env});
}

protocol::step_result tool_broker::call(const protocol::tool_msg& m, int previous_attempts) {
  protocol::step_result r;
  r.seq = m.seq;
  r.name = m.name;
  r.kind = protocol::step_kind::tool;
  const auto started = clock::now();
  auto finish = [&](std::optional<tool_error> error, json output) {
    r.ok = !error;
    if (error) r.error = {error->what(), error->type()};
    else r.output = std::move(output);
    r.duration_us = std::chrono::duration_cast<std::chrono::microseconds>(clock::now() - started).count();
    return r;
  };

  auto it = tools_.find(m.name);
  if (it == tools_.end()) {
    auto granted = policy_.tool_names();
    std::string list;
    for (const auto& n : granted) list += (list.empty() ? "" : ", ") + n;
    return finish(tool_error("refused", fmt::format("tool '{}' is not granted by this run's policy ({}); grant it "
                                                    "under \"tools\" in the policy file",
                                                    clip(m.name, 64), list.empty() ? "it grants none" : "granted: " + list)),
                  nullptr);
  }
  tool& t = *it->second;
  idempotency kind;
  try {
    kind = t.kind(m.args);
  } catch (const tool_error& e) {
    return finish(e, nullptr);
  }

  tool_call call;
  call.run_id = run_id_;
  call.seq = m.seq;
  call.idempotency_key = fmt::format("{}/{}", run_id_, m.seq);
  call.args = m.args;
  call.emit = emit_;
  r.attempt = previous_attempts + 1;
  // Durable before the call: after a crash, an at-most-once call with this
  // record and no result is in doubt, never silently repeated.
  effects::tool_started marker{m.seq, m.name, std::string(to_string(kind)), std::nullopt};
  if (kind == idempotency::at_most_once) marker.args = m.args;
  record_(marker);
  crash_point("tool_started");
  crash_point("tool_started." + m.name);
  std::optional<tool_error> error;
  json output;
  try {
    output = t.call(call);
  } catch (const tool_error& e) {
    error = e;
  } catch (const std::exception& e) {
    error = tool_error("failed", fmt::format("tool {} failed: {}", m.name, e.what()));
  }
  crash_point("tool_returned");
  crash_point("tool_returned." + m.name);
  return finish(error, std::move(output));
}

}  // namespace cairn::engine
