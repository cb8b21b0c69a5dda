#include "engine/tool_broker.hpp"

#include <fmt/format.h>

#include "engine/crash_point.hpp"
#include "engine/tools/command_tool.hpp"

namespace cairn::engine {
namespace {

using clock = std::chrono::steady_clock;

std::string clip(const std::string& s, std::size_t max) { return s.size() <= max ? s : s.substr(0, max) + "..."; }

}  // namespace

tool_broker::tool_broker(storage::journal& journal, const storage::run_record& run, const policy& p,
                         journal_budget& budget, const std::optional<llm_endpoint>& llm,
                         std::function<void(const json&)> emit)
    : journal_(journal), run_(run), policy_(p), budget_(budget), emit_(std::move(emit)) {
  if (p.http_fetch) tools_["http.fetch"] = make_http_fetch(*p.http_fetch);
  if (p.llm_chat) tools_["llm.chat"] = make_llm_chat(*p.llm_chat, llm, llm_tokens_spent());
  for (const auto& [name, spec] : p.commands)
    tools_[name] =
        make_command_tool({name, spec.command, spec.input, spec.timeout, spec.kind, spec.max_output_bytes, spec.env});
}

std::uint64_t tool_broker::llm_tokens_spent() const {
  if (!policy_.llm_chat || policy_.llm_chat->max_total_tokens == 0) return 0;
  std::uint64_t spent = 0;
  for (const auto& s : journal_.steps(run_.id))
    if (s.result.kind == protocol::step_kind::tool && s.result.name == "llm.chat" && s.result.ok)
      spent += tokens_counted(s.result.output);
  return spent;
}

protocol::step_result tool_broker::call(const protocol::tool_msg& m) {
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
  call.run_id = run_.id;
  call.seq = m.seq;
  call.idempotency_key = fmt::format("{}/{}", run_.id, m.seq);
  call.args = m.args;
  call.emit = emit_;
  int previous = 0;
  for (const auto& e : journal_.events_at(run_.id, m.seq))
    if (e.kind == "tool_started") ++previous;
  r.attempt = previous + 1;
  // Durable before the call: after a crash, an at-most-once call with this
  // record and no result is in doubt, never silently repeated.
  json marker = {{"tool", m.name}, {"idempotency", to_string(kind)}};
  if (kind == idempotency::at_most_once) marker["args"] = m.args;
  budget_.charge_event("tool_started", marker);
  journal_.append_event(run_.id, "tool_started", marker, m.seq);
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

std::optional<in_doubt_call> find_in_doubt(storage::journal& journal, const std::string& run_id) {
  const std::uint64_t seq = journal.step_count(run_id);
  std::optional<storage::event_record> started;
  for (auto& e : journal.events_at(run_id, seq)) {
    if (e.kind == "tool_started") started = std::move(e);
    else if (e.kind == "tool_settled") started.reset();
  }
  if (!started || started->data.value("idempotency", "") != "at_most_once") return std::nullopt;
  in_doubt_call c;
  c.seq = seq;
  c.tool = started->data.value("tool", "");
  c.args = started->data.value("args", json());
  c.started_at_ms = started->at_ms;
  c.message = fmt::format(
      "step {} called at-most-once tool '{}' with {}, but its result was never recorded: the host stopped in "
      "between, so the call may or may not have happened. Check whether it did, then record the outcome with "
      "`cairn settle {} {} --result JSON` (or --error MESSAGE), or call it again with `cairn settle {} {} --retry`",
      seq, c.tool, clip(c.args.dump(), 100), run_id, seq, run_id, seq);
  return c;
}

}  // namespace cairn::engine
