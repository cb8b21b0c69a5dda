#include "engine/event_schema.hpp"

#include <algorithm>
#include <array>
#include <stdexcept>

#include <fmt/format.h>

namespace cairn::engine {
namespace {

using fields = std::span<const std::string_view>;

constexpr std::string_view attempt_fields[] = {"attempt"};
constexpr std::string_view error_fields[] = {"error"};
constexpr std::string_view reset_fields[] = {"status", "attempts"};
constexpr std::string_view waiting_fields[] = {"kind", "key", "seq", "wake_at_ms?"};
constexpr std::string_view reason_fields[] = {"reason"};
constexpr std::string_view signal_fields[] = {"name", "signal_id"};
constexpr std::string_view retry_fields[] = {"name", "attempt", "error", "delay_ms"};
constexpr std::string_view tool_started_fields[] = {"tool", "idempotency", "args"};
constexpr std::string_view tool_settled_fields[] = {"how"};
constexpr std::string_view timer_fields[] = {"until_ms", "in_past"};
constexpr std::string_view wait_fields[] = {"signal", "deadline_ms?"};
constexpr std::string_view message_fields[] = {"message"};
constexpr std::string_view cancel_sent_fields[] = {"reason", "grace_seconds"};
constexpr std::string_view limit_fields[] = {"limit", "message"};
constexpr std::string_view crashed_fields[] = {"attempt", "error", "will_retry"};
constexpr std::string_view suspended_fields[] = {"count", "bytes_written", "cpu_ms", "ms"};
constexpr std::string_view agent_fields[] = {"agent",  "version", "program_sha256", "script", "files",
                                             "bytes",  "partial?", "kept?",         "unkept?"};
constexpr std::string_view agent_changed_fields[] = {"agent", "was", "now", "runs"};
constexpr std::string_view checkpoint_fields[] = {"files", "removed", "bytes"};
constexpr std::string_view fork_fields[] = {"run", "seq"};
constexpr std::string_view import_fields[] = {"from_run", "exported_at_ms", "cairn_version", "backend"};

using enum event_writer;

// kind, fields, writer, at_step, notable.
constexpr event_declaration declarations[] = {
    // The run's transitions.
    {"attempt_started", attempt_fields, owner, false, false},
    {"run_completed", {}, owner, false, false},
    {"run_failed", error_fields, owner, false, true},
    {"run_cancelled", error_fields, owner, false, true},  // also by a request, for a run nobody holds
    {"run_in_doubt", error_fields, owner, false, true},
    {"run_reset", reset_fields, request, false, false},
    {"run_waiting", waiting_fields, owner, true, true},
    {"run_released", reason_fields, owner, false, true},
    {"cancel_requested", reason_fields, request, false, true},
    {"signal_queued", signal_fields, request, false, true},
    {"signal_delivered", signal_fields, owner, true, false},
    // An attempt's effects.
    {"step_retry", retry_fields, owner, true, true},
    {"tool_started", tool_started_fields, owner, true, false},
    {"tool_settled", tool_settled_fields, owner, true, true},
    {"timer_set", timer_fields, owner, true, true},
    {"wait_started", wait_fields, owner, true, false},
    {"sandbox_warning", message_fields, owner, false, true},
    {"cancel_sent", cancel_sent_fields, owner, false, true},
    {"limit_exceeded", limit_fields, owner, false, true},
    {"attempt_crashed", crashed_fields, owner, false, true},
    {"suspended", suspended_fields, owner, false, false},
    // The agent's version (agent_versions.hpp).
    {"agent_version", agent_fields, owner, false, false},
    {"agent_replaced", agent_fields, request, false, true},  // cairn resume --agent
    {"agent_changed", agent_changed_fields, owner, false, true},
    // What a step changed in the workspace (workspace_checkpoints.hpp).
    {"workspace_checkpoint", checkpoint_fields, owner, true, false},
    {"workspace_baseline", checkpoint_fields, owner, false, false},
    // `cairn fork` (ledger::fork_run): on the fork, the run and step it came
    // from (its first event); on that run, the fork and the step. Never at a
    // step, so a fork of a fork copies neither.
    {"forked_from", fork_fields, request, false, false},
    {"forked", fork_fields, request, false, false},
    // `cairn import` (ledger::import_run): the run it was exported as, when,
    // by which cairn from which backend; the imported run's first event.
    {"imported", import_fields, request, false, true},
};

json error_json(const protocol::error_info& e) { return {{"error", {{"message", e.message}, {"type", e.type}}}}; }

}  // namespace

std::span<const event_declaration> event_declarations() { return declarations; }

const event_declaration* declared_event(std::string_view kind) {
  for (const auto& d : declarations)
    if (d.kind == kind) return &d;
  return nullptr;
}

event_row event(std::string_view kind, json data, std::optional<std::uint64_t> seq) {
  const auto* d = declared_event(kind);
  if (!d) throw std::logic_error(fmt::format("event '{}' is not declared in engine/event_schema.cpp", kind));
  if (d->at_step != seq.has_value())
    throw std::logic_error(fmt::format("event '{}' is {}recorded at a step", kind, d->at_step ? "" : "not "));
  if (!data.is_object() || data.size() != d->fields.size())
    throw std::logic_error(fmt::format("event '{}' has other fields than declared: {}", kind, data.dump()));
  for (auto field : d->fields) {
    const bool nullable = field.ends_with('?');
    if (nullable) field.remove_suffix(1);
    const auto it = data.find(field);
    if (it == data.end() || (it->is_null() && !nullable))
      throw std::logic_error(fmt::format("event '{}' lacks its field '{}': {}", kind, field, data.dump()));
  }
  return {std::string(kind), std::move(data), seq};
}

event_row attempt_started(int attempt) { return event("attempt_started", {{"attempt", attempt}}); }

event_row run_finished(storage::run_status status, const std::optional<protocol::error_info>& error) {
  switch (status) {
    case storage::run_status::completed: return event("run_completed", json::object());
    case storage::run_status::failed: return event("run_failed", error_json(*error));
    case storage::run_status::cancelled: return event("run_cancelled", error_json(*error));
    default: return event("run_in_doubt", error_json(*error));
  }
}

event_row run_reset(storage::run_status status_before, int attempts_before) {
  return event("run_reset", {{"status", storage::to_string(status_before)}, {"attempts", attempts_before}});
}

event_row run_waiting(const storage::wait_spec& w) {
  return event("run_waiting",
               {{"kind", w.kind}, {"key", w.key}, {"seq", w.seq}, {"wake_at_ms", w.wake_at_ms ? json(*w.wake_at_ms) : json()}},
               w.seq);
}

event_row run_released(std::string_view reason) { return event("run_released", {{"reason", reason}}); }

event_row cancel_requested(std::string_view reason) { return event("cancel_requested", {{"reason", reason}}); }

event_row signal_queued(const storage::signal_record& s) {
  return event("signal_queued", {{"name", s.name}, {"signal_id", s.id}});
}

event_row signal_delivered(const storage::signal_record& s, std::uint64_t seq) {
  return event("signal_delivered", {{"name", s.name}, {"signal_id", s.id}}, seq);
}

}  // namespace cairn::engine
