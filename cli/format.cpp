#include "cli/format.hpp"

#include <ctime>

#include <fmt/chrono.h>
#include <fmt/format.h>

namespace cairn::cli {
namespace {

std::string step_status(const protocol::step_result& r) { return r.ok ? "ok" : "error"; }

std::string clip(const std::string& s, std::size_t width) {
  return s.size() > width ? s.substr(0, width - 3) + "..." : s;
}

std::string step_preview(const protocol::step_result& r, std::size_t width) {
  return r.ok ? preview(r.output, width) : preview(json(r.error.type + ": " + r.error.message), width);
}

}  // namespace

std::string preview(const json& value, std::size_t width) {
  std::string s = value.dump(-1, ' ', false, json::error_handler_t::replace);
  for (auto& c : s)
    if (c == '\n' || c == '\t') c = ' ';
  if (s.size() > width) s = s.substr(0, width - 3) + "...";
  return s;
}

std::string format_time(std::int64_t ms) {
  std::time_t t = static_cast<std::time_t>(ms / 1000);
  return fmt::format("{:%Y-%m-%d %H:%M:%S}", fmt::localtime(t));
}

std::string format_duration_us(std::int64_t us) {
  if (us < 1000) return fmt::format("{} us", us);
  if (us < 1'000'000) return fmt::format("{:.1f} ms", us / 1000.0);
  return fmt::format("{:.2f} s", us / 1e6);
}

std::string step_line(const storage::step_record& step) {
  const auto& r = step.result;
  return fmt::format("  {:>3}  {:<28} {:<5} attempt {}  {:>9}  {}", r.seq, clip(r.name, 28),
                     step_status(r), r.attempt, format_duration_us(r.duration_us), step_preview(r, 60));
}

std::string steps_table(const std::vector<storage::step_record>& steps) {
  std::string out = fmt::format("{:>3}  {:<26} {:<6} {:<6} {:>7} {:>9}  {}\n", "SEQ", "NAME", "KIND", "STATUS",
                                "ATTEMPT", "DURATION", "OUTPUT");
  for (const auto& s : steps) {
    const auto& r = s.result;
    out += fmt::format("{:>3}  {:<26} {:<6} {:<6} {:>7} {:>9}  {}\n", r.seq, clip(r.name, 26), protocol::to_string(r.kind),
                       step_status(r), r.attempt, format_duration_us(r.duration_us), step_preview(r, 56));
  }
  return out;
}

std::string runs_table(storage::journal& journal, const std::vector<storage::run_record>& runs) {
  std::string out = fmt::format("{:<20} {:<10} {:<20} {:>5} {:>8}  {}\n", "ID", "STATUS", "AGENT", "STEPS",
                                "ATTEMPTS", "UPDATED");
  for (const auto& r : runs) {
    std::string agent = std::filesystem::path(r.agent).filename().string();
    std::string wait;
    if (r.status == storage::run_status::waiting && r.wait)
      wait = r.wait->kind == "signal" ? "  signal '" + r.wait->key + "'"
             : r.wait->kind == "timer" ? "  timer " + (r.wait->wake_at_ms ? format_time(*r.wait->wake_at_ms) : "")
                                       : "  child " + r.wait->key;
    out += fmt::format("{:<20} {:<10} {:<20} {:>5} {:>8}  {}{}\n", r.id, storage::to_string(r.status), agent,
                       journal.step_count(r.id), r.attempts, format_time(r.updated_at_ms), wait);
  }
  return out;
}

std::string describe_wait(const storage::run_record& r) {
  if (!r.wait) return "waits";
  const auto& w = *r.wait;
  std::string until = w.wake_at_ms ? format_time(*w.wake_at_ms) : "";
  if (w.kind == "timer") return fmt::format("sleeps until {} (step {})", until, w.seq);
  if (w.kind == "signal")
    return fmt::format("waits for signal '{}' (step {}{}); send it: cairn signal {} {} --data JSON", w.key, w.seq,
                       until.empty() ? "" : ", until " + until, r.id, w.key);
  if (w.kind == "child") return fmt::format("waits for child run {} (step {})", w.key, w.seq);
  return "waits for " + w.kind;
}

std::string run_summary(const storage::run_record& r) {
  std::string out = fmt::format("run {} ({})\n", r.id, storage::to_string(r.status));
  if (r.status == storage::run_status::waiting) out += fmt::format("  waiting    {}\n", describe_wait(r));
  if (!r.parent_id.empty()) out += fmt::format("  parent     {}\n", r.parent_id);
  out += fmt::format("  agent      {}\n", r.agent);
  out += fmt::format("  input      {}\n", preview(r.input, 100));
  out += fmt::format("  sandbox    {}\n", r.sandbox);
  out += fmt::format("  workspace  {}\n", r.workspace);
  out += fmt::format("  attempts   {} sandbox starts (up to {} crashes per resume)\n", r.attempts, r.max_attempts);
  out += fmt::format("  created    {}\n", format_time(r.created_at_ms));
  if (r.finished_at_ms) out += fmt::format("  finished   {}\n", format_time(*r.finished_at_ms));
  if (!r.owner.empty()) out += fmt::format("  owner      {}\n", r.owner);
  if (r.status == storage::run_status::completed) out += fmt::format("  output     {}\n", preview(r.output, 100));
  if (r.error) out += fmt::format("  error      {}: {}\n", r.error->type, r.error->message);
  if (!r.unreadable.empty()) out += fmt::format("  unreadable {}\n", r.unreadable);
  if (r.deadline_ms) out += fmt::format("  deadline   {}\n", format_time(*r.deadline_ms));
  if (r.cancel_requested_at_ms && r.status != storage::run_status::cancelled)
    out += fmt::format("  cancel     requested {}\n", format_time(*r.cancel_requested_at_ms));
  return out;
}

std::string policy_summary(const json& policy) {
  if (!policy.is_object() || !policy.contains("limits")) return "  policy     (none stored: the run predates policies)\n";
  std::string limits;
  for (const auto& [key, value] : policy["limits"].items())
    limits += fmt::format("{}{}={}", limits.empty() ? "" : " ", key, value.dump());
  std::string out = fmt::format("  network    {}\n  limits     {}\n", policy.value("network", "none"), limits);
  if (policy.contains("timeouts") && policy["timeouts"].is_object()) {
    const json& t = policy["timeouts"];
    out += fmt::format("  timeouts   run {} s, step {} s, cancel grace {} s (0: none)\n", t.value("run_seconds", 0),
                       t.value("step_seconds", 0), t.value("cancel_grace_seconds", 0));
  }
  const json& tools = policy.value("tools", json::object());
  if (tools.empty()) out += "  tools      none granted\n";
  for (const auto& [name, grant] : tools.items()) {
    std::string detail;
    if (grant.contains("hosts")) detail = "hosts " + preview(grant["hosts"], 50) + " methods " + preview(grant["methods"], 30);
    else if (grant.contains("command")) detail = grant.value("idempotency", "") + ", " + preview(grant["command"], 50);
    else if (grant.contains("max_tokens")) detail = fmt::format("max_tokens {}, models {}", grant["max_tokens"].dump(),
                                                                grant["models"].empty() ? "any" : preview(grant["models"], 40));
    out += fmt::format("  tool       {:<14} {}\n", name, detail);
  }
  return out;
}

json to_json(const storage::run_record& r) {
  json j = {{"id", r.id},
            {"agent", r.agent},
            {"input", r.input},
            {"status", storage::to_string(r.status)},
            {"attempts", r.attempts},
            {"max_attempts", r.max_attempts},
            {"owner", r.owner},
            {"sandbox", r.sandbox},
            {"workspace", r.workspace},
            {"created_at_ms", r.created_at_ms},
            {"updated_at_ms", r.updated_at_ms},
            {"finished_at_ms", r.finished_at_ms ? json(*r.finished_at_ms) : json(nullptr)},
            {"output", r.output},
            {"policy", r.policy},
            {"parent_id", r.parent_id.empty() ? json(nullptr) : json(r.parent_id)},
            {"deadline_ms", r.deadline_ms ? json(*r.deadline_ms) : json(nullptr)},
            {"cancel_requested_at_ms", r.cancel_requested_at_ms ? json(*r.cancel_requested_at_ms) : json(nullptr)}};
  j["wait"] = r.wait && r.status == storage::run_status::waiting
                  ? json{{"kind", r.wait->kind},
                         {"key", r.wait->key},
                         {"seq", r.wait->seq},
                         {"wake_at_ms", r.wait->wake_at_ms ? json(*r.wait->wake_at_ms) : json(nullptr)}}
                  : json(nullptr);
  j["error"] = r.error ? json{{"message", r.error->message}, {"type", r.error->type}} : json(nullptr);
  if (!r.unreadable.empty()) j["unreadable"] = r.unreadable;
  return j;
}

json to_json(const storage::step_record& s) {
  json j = protocol::to_json(s.result);
  j["started_at_ms"] = s.started_at_ms;
  j["finished_at_ms"] = s.finished_at_ms;
  return j;
}

json to_json(const storage::event_record& e) {
  return {{"id", e.id}, {"seq", e.seq ? json(*e.seq) : json(nullptr)}, {"kind", e.kind},
          {"data", e.data}, {"at_ms", e.at_ms}};
}

json to_json(const storage::signal_record& s) {
  return {{"id", s.id},
          {"run_id", s.run_id},
          {"name", s.name},
          {"payload", s.payload},
          {"sent_at_ms", s.sent_at_ms},
          {"delivered_seq", s.delivered_seq ? json(*s.delivered_seq) : json(nullptr)},
          {"delivered_at_ms", s.delivered_at_ms ? json(*s.delivered_at_ms) : json(nullptr)}};
}

}  // namespace cairn::cli
