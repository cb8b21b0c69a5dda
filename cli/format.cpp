#include "cli/format.hpp"

#include "engine/run_state.hpp"

#include <ctime>
#include <regex>
#include <stdexcept>

#include <fmt/chrono.h>
#include <fmt/format.h>

#include "engine/event_schema.hpp"
#include "engine/owner.hpp"
#include "protocol/text.hpp"

namespace cairn::cli {
namespace {

std::string step_status(const protocol::step_result& r) { return r.ok ? "ok" : "error"; }

// C1 controls, line/paragraph separators and the bidi controls that reorder what follows them.
bool invisible_control(char32_t point) {
  return (point >= 0x80 && point <= 0x9f) || point == 0x061c || point == 0x200e || point == 0x200f ||
         point == 0x2028 || point == 0x2029 || (point >= 0x202a && point <= 0x202e) ||
         (point >= 0x2066 && point <= 0x2069);
}

std::string step_preview(const protocol::step_result& r, std::size_t width) {
  return r.ok ? preview(r.output, width) : preview(json(r.error.type + ": " + r.error.message), width);
}

}  // namespace

std::string terminal_text(std::string_view text, bool keep_newlines) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      if (c == '\n' && keep_newlines) out += '\n';
      else if (c == '\n') out += "\\n";
      else if (c == '\t') out += "\\t";
      else if (c == '\r') out += "\\r";
      else if (c < 0x20 || c == 0x7f) out += fmt::format("\\x{:02x}", c);
      else out += static_cast<char>(c);
      ++i;
      continue;
    }
    auto [point, length] = protocol::decode_utf8(text, i);
    if (length == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD
      ++i;
      continue;
    }
    if (invisible_control(point)) out += fmt::format("\\u{:04x}", static_cast<std::uint32_t>(point));
    else out.append(text.substr(i, length));
    i += length;
  }
  return out;
}

std::string preview(const json& value, std::size_t width) {
  return protocol::clip(terminal_text(value.dump(-1, ' ', false, json::error_handler_t::replace)), width);
}

std::int64_t time_since(const std::string& text, std::int64_t now_ms) {
  static const std::regex ago(R"((\d{1,9})([smhd]))");
  static const std::regex date(R"((\d{4})-(\d{2})-(\d{2})(?:T(\d{2}):(\d{2})(?::(\d{2}))?)?)");
  std::smatch m;
  if (std::regex_match(text, m, ago)) {
    const std::int64_t unit_s = m[2] == "s" ? 1 : m[2] == "m" ? 60 : m[2] == "h" ? 3600 : 86400;
    return now_ms - std::stoll(m[1]) * unit_s * 1000;
  }
  if (std::regex_match(text, m, date)) {
    const auto field = [&](int i) { return m[i].matched ? std::stoi(m[i]) : 0; };
    std::tm t{};
    t.tm_year = field(1) - 1900;
    t.tm_mon = field(2) - 1;
    t.tm_mday = field(3);
    t.tm_hour = field(4);
    t.tm_min = field(5);
    t.tm_sec = field(6);
    if (t.tm_mon >= 0 && t.tm_mon < 12 && t.tm_mday >= 1 && t.tm_mday <= 31 && t.tm_hour < 24 && t.tm_min < 60 &&
        t.tm_sec < 60)
      return static_cast<std::int64_t>(::timegm(&t)) * 1000;
  }
  throw std::invalid_argument(fmt::format("'{}' is no time: give a time ago (90s, 15m, 2h, 3d) or a UTC date "
                                          "(2026-12-07, 2026-12-07T14:30)",
                                          terminal_text(text)));
}

std::string format_bytes(std::uint64_t bytes) {
  if (bytes < 1024) return fmt::format("{} B", bytes);
  constexpr const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes) / 1024;
  std::size_t unit = 0;
  for (; value >= 1024 && unit + 1 < std::size(units); ++unit) value /= 1024;
  return fmt::format("{:.1f} {}", value, units[unit]);
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
  return fmt::format("  {:>3}  {:<6} {:<28} {:<5} attempt {}  {:>9}  {}", r.seq, protocol::to_string(r.kind),
                     protocol::clip(terminal_text(r.name), 28), step_status(r), r.attempt,
                     format_duration_us(r.duration_us), step_preview(r, 60));
}

std::string steps_header() {
  return fmt::format("{:>3}  {:<26} {:<6} {:<6} {:>7} {:>9}  {}\n", "SEQ", "NAME", "KIND", "STATUS", "ATTEMPT",
                     "DURATION", "OUTPUT");
}

std::string step_row(const storage::step_record& s) {
  const auto& r = s.result;
  return fmt::format("{:>3}  {:<26} {:<6} {:<6} {:>7} {:>9}  {}\n", r.seq, protocol::clip(terminal_text(r.name), 26),
                     protocol::to_string(r.kind), step_status(r), r.attempt, format_duration_us(r.duration_us),
                     step_preview(r, 56));
}

std::string event_line(const storage::event_record& e) {
  return fmt::format("  {}  {:<16} {}{}", format_time(e.at_ms), terminal_text(e.kind),
                     e.seq ? fmt::format("seq {} ", *e.seq) : "", preview(e.data, 90));
}

bool notable(const storage::event_record& e) {
  const auto* declared = engine::declared_event(e.kind);
  return !declared || declared->notable;
}

std::string runs_table(storage::journal& journal, const std::vector<storage::run_record>& runs) {
  std::string out = fmt::format("{:<20} {:<10} {:<20} {:>5} {:>8}  {:<19}  {:<24}  {}\n", "ID", "STATUS", "AGENT",
                                "STEPS", "ATTEMPTS", "UPDATED", "HELD BY", "WORKSPACE ON");
  for (const auto& r : runs) {
    std::string agent = terminal_text(std::filesystem::path(r.agent).filename().string());
    std::string wait;
    if (r.status == storage::run_status::waiting && r.wait)
      wait = r.wait->kind == "signal" ? "  signal '" + terminal_text(r.wait->key) + "'"
             : r.wait->kind == "timer" ? "  timer " + (r.wait->wake_at_ms ? format_time(*r.wait->wake_at_ms) : "")
                                       : "  child " + terminal_text(r.wait->key);
    // The workspace's machine only when it is not on storage every worker reaches.
    out += fmt::format("{:<20} {:<10} {:<20} {:>5} {:>8}  {:<19}  {:<24}  {}{}\n", terminal_text(r.id),
                       storage::to_string(r.status), agent, journal.step_count(r.id), r.attempts,
                       format_time(r.updated_at_ms), r.owner.empty() ? "-" : terminal_text(engine::describe_owner(r.owner)),
                       r.workspace_host.empty() ? "-" : terminal_text(r.workspace_host), wait);
  }
  return out;
}

std::string describe_wait(const storage::run_record& r) {
  if (!r.wait) return "waits";
  storage::wait_spec w = *r.wait;
  w.key = terminal_text(w.key);
  std::string until = w.wake_at_ms ? format_time(*w.wake_at_ms) : "";
  if (w.kind == "timer") return fmt::format("sleeps until {} (step {})", until, w.seq);
  if (w.kind == "signal")
    return fmt::format("waits for signal '{}' (step {}{}); send it: cairn signal {} {} --data JSON", w.key, w.seq,
                       until.empty() ? "" : ", until " + until, r.id, w.key);
  if (w.kind == "child") return fmt::format("waits for child run {} (step {})", w.key, w.seq);
  return "waits for " + terminal_text(w.kind);
}

std::string run_summary(const storage::run_record& r) {
  const auto t = [](std::string_view s) { return terminal_text(s); };
  std::string out = fmt::format("run {} ({})\n", t(r.id), storage::to_string(r.status));
  if (r.status == storage::run_status::waiting) out += fmt::format("  waiting    {}\n", describe_wait(r));
  if (!r.parent_id.empty()) out += fmt::format("  parent     {}\n", t(r.parent_id));
  out += fmt::format("  agent      {}\n", t(r.agent));
  out += fmt::format("  input      {}\n", preview(r.input, 100));
  out += fmt::format("  sandbox    {}\n", t(r.sandbox));
  out += fmt::format("  workspace  {}\n", t(r.workspace));
  out += fmt::format("  attempts   {} sandbox starts (up to {} crashes per resume)\n", r.attempts, r.max_attempts);
  out += fmt::format("  created    {}\n", format_time(r.created_at_ms));
  if (r.finished_at_ms) out += fmt::format("  finished   {}\n", format_time(*r.finished_at_ms));
  if (!r.owner.empty()) out += fmt::format("  owner      {}\n", t(r.owner));
  if (r.status == storage::run_status::completed) out += fmt::format("  output     {}\n", preview(r.output, 100));
  if (r.error) out += fmt::format("  error      {}: {}\n", t(r.error->type), t(r.error->message));
  if (!r.unreadable.empty()) out += fmt::format("  unreadable {}\n", t(r.unreadable));
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
  std::string out =
      fmt::format("  network    {}\n  limits     {}\n", terminal_text(policy.value("network", "none")), terminal_text(limits));
  if (policy.contains("timeouts") && policy["timeouts"].is_object()) {
    const json& t = policy["timeouts"];
    out += fmt::format("  timeouts   run {} s, step {} s, cancel grace {} s (0: none)\n", t.value("run_seconds", 0),
                       t.value("step_seconds", 0), t.value("cancel_grace_seconds", 0));
  }
  const json& tools = policy.value("tools", json::object());
  if (tools.empty()) out += "  tools      none granted\n";
  for (const auto& [name, grant] : tools.items()) {
    std::string detail;
    if (grant.contains("hosts"))
      detail = "hosts " + preview(grant["hosts"], 50) + " methods " + preview(grant["methods"], 30) +
               (grant.value("private", false) ? " private addresses too" : "");
    else if (grant.contains("command")) detail = terminal_text(grant.value("idempotency", "")) + ", " + preview(grant["command"], 50);
    else if (grant.contains("max_tokens")) detail = fmt::format("max_tokens {}, models {}", grant["max_tokens"].dump(),
                                                                grant["models"].empty() ? "any" : preview(grant["models"], 40)) +
                                                    (grant.value("max_total_tokens", 0) > 0
                                                         ? fmt::format(", {} tokens per run", grant["max_total_tokens"].dump())
                                                         : "");
    out += fmt::format("  tool       {:<14} {}\n", terminal_text(name), detail);
  }
  return out;
}

std::string state_summary(const std::optional<json>& kept, std::uint64_t journal_bytes, std::uint64_t next_seq) {
  std::string out = fmt::format("  journal    {} bytes\n", journal_bytes);
  if (!kept) return out + "  state      (not kept: the run predates kept state; its history holds it)\n";
  const auto s = engine::run_state_of(*kept);
  if (s.agent)
    out += fmt::format("  version    {} ({})\n", terminal_text(s.agent->version), terminal_text(s.agent->agent));
  const auto now = storage::now_ms();
  std::string facts;
  if (s.llm_tokens > 0) facts += fmt::format("{} model tokens, ", s.llm_tokens);
  facts += fmt::format("{} suspensions in the last hour", s.suspensions_since(now - 3'600'000));
  if (const int failed = s.failures_at(next_seq))
    facts += fmt::format(", step {} failed {} time{} so far", next_seq, failed, failed == 1 ? "" : "s");
  if (const auto call = s.tool_at(next_seq))
    facts += fmt::format(", step {} called {} ({}) and has no result journaled", next_seq, terminal_text(call->tool),
                         terminal_text(call->idempotency));
  return out + "  state      " + facts + "\n";
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
            {"workspace_host", r.workspace_host},
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

namespace cairn::cli {
namespace {

std::string lease_left(const storage::worker_record& w, std::int64_t now_ms) {
  const auto left = w.lease_expires_at_ms - now_ms;
  if (left > 0) return fmt::format("{:.1f} s", left / 1000.0);
  return fmt::format("expired {:.0f} s ago", -left / 1000.0);
}

}  // namespace

bool forgettable(const storage::worker_record& w, std::int64_t now_ms) {
  return w.runs == 0 && w.lease_expires_at_ms < now_ms - storage::journal::forgotten_worker_ms;
}

std::string workers_table(const std::vector<storage::worker_record>& workers, std::int64_t now_ms) {
  std::string out = fmt::format("{:<28} {:<20} {:>5}  {:<20} {:>6}  {}\n", "WORKER", "HOST", "RUNS", "LEASE",
                                "FENCED", "STARTED");
  for (const auto& w : workers)
    out += fmt::format("{:<28} {:<20} {:>5}  {:<20} {:>6}  {}\n",
                       protocol::clip(terminal_text(engine::describe_owner(w.id)), 28),
                       protocol::clip(terminal_text(w.host), 20), w.runs, lease_left(w, now_ms), w.fenced_writes,
                       format_time(w.started_at_ms));
  return out;
}

json to_json(const storage::worker_record& w, std::int64_t now_ms) {
  return {{"id", w.id},
          {"host", w.host},
          {"workspace_root", w.workspace_root},
          {"runs", w.runs},
          {"started_at_ms", w.started_at_ms},
          {"renewed_at_ms", w.renewed_at_ms},
          {"lease_expires_at_ms", w.lease_expires_at_ms},
          {"lease_expired", w.lease_expires_at_ms <= now_ms},
          {"fenced_writes", w.fenced_writes}};
}

}  // namespace cairn::cli
