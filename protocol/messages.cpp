#include "protocol/messages.hpp"

#include <iterator>

#include "protocol/text.hpp"

namespace cairn::protocol {
namespace {

template <class... F>
struct overloaded : F... {
  using F::operator()...;
};
template <class... F>
overloaded(F...) -> overloaded<F...>;

// A value from the peer, quoted in an error.
std::string clip_for_error(const std::string& value) { return "'" + clip(value, 64) + "'"; }

[[noreturn]] void bad(std::string_view type, std::string_view field, std::string_view why) {
  throw protocol_error("'" + std::string(type) + "' message: field '" + std::string(field) + "' " +
                       std::string(why));
}

const json& require(const json& j, std::string_view type, const char* field) {
  auto it = j.find(field);
  if (it == j.end()) bad(type, field, "is missing");
  return *it;
}

std::string get_string(const json& j, std::string_view type, const char* field,
                       std::size_t max_size = SIZE_MAX) {
  const json& v = require(j, type, field);
  if (!v.is_string()) bad(type, field, "must be a string");
  const auto& s = v.get_ref<const std::string&>();
  if (s.size() > max_size) bad(type, field, "is longer than " + std::to_string(max_size) + " bytes");
  return s;
}

std::int64_t get_int(const json& j, std::string_view type, const char* field, std::int64_t min,
                     std::int64_t max) {
  const json& v = require(j, type, field);
  if (!v.is_number_integer()) bad(type, field, "must be an integer");
  if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(max))
    bad(type, field, "is out of range");
  auto n = v.get<std::int64_t>();
  if (n < min || n > max) bad(type, field, "is out of range");
  return n;
}

std::optional<std::int64_t> get_optional_int(const json& j, std::string_view type, const char* field,
                                             std::int64_t min, std::int64_t max) {
  if (!j.contains(field)) return std::nullopt;
  return get_int(j, type, field, min, max);
}

// A duration in ms (a sleep, timeout or delay), 0 to max_duration_ms.
std::optional<std::int64_t> get_optional_duration(const json& j, std::string_view type, const char* field) {
  auto ms = get_optional_int(j, type, field, 0, INT64_MAX);
  if (ms && *ms > max_duration_ms)
    bad(type, field, std::to_string(*ms) + " is longer than 100 years (" + std::to_string(max_duration_ms) +
                         " ms), the longest duration the protocol allows");
  return ms;
}

std::uint64_t get_seq(const json& j, std::string_view type, const char* field = "seq") {
  return static_cast<std::uint64_t>(get_int(j, type, field, 0, INT64_MAX));
}

std::optional<double> get_optional_real(const json& j, std::string_view type, const char* field, double min,
                                        double max) {
  auto it = j.find(field);
  if (it == j.end()) return std::nullopt;
  if (!it->is_number()) bad(type, field, "must be a number");
  auto x = it->get<double>();
  if (!(x >= min && x <= max)) bad(type, field, "is out of range");
  return x;
}

std::optional<bool> get_optional_bool(const json& j, std::string_view type, const char* field) {
  auto it = j.find(field);
  if (it == j.end()) return std::nullopt;
  if (!it->is_boolean()) bad(type, field, "must be true or false");
  return it->get<bool>();
}

int get_attempt(const json& j, std::string_view type) {
  return static_cast<int>(get_int(j, type, "attempt", 1, 1'000'000));
}

// A step name, or a field that becomes one (a signal, agent or run id).
std::string get_name(const json& j, std::string_view type, const char* field = "name") {
  auto name = get_string(j, type, field, max_name_size);
  if (name.empty()) bad(type, field, "must not be empty");
  return name;
}

step_kind get_kind(const json& j, std::string_view type) {
  auto s = get_string(j, type, "kind");
  if (auto kind = parse_step_kind(s)) return *kind;
  bad(type, "kind",
      "must be one of step, now, random, patch, tool, sleep, signal, child, join (got " + clip_for_error(s) + ")");
}

error_info get_error(const json& j, std::string_view type) {
  const json& e = require(j, type, "error");
  if (!e.is_object()) bad(type, "error", "must be an object with 'message' and 'type'");
  error_info info;
  info.message = get_string(e, type, "message");
  if (e.contains("type")) info.type = get_string(e, type, "type", max_name_size);
  return info;
}

json error_json(const error_info& e) { return {{"message", e.message}, {"type", e.type}}; }

}  // namespace

std::string_view to_string(step_kind kind) {
  switch (kind) {
    case step_kind::step: return "step";
    case step_kind::now: return "now";
    case step_kind::random: return "random";
    case step_kind::patch: return "patch";
    case step_kind::tool: return "tool";
    case step_kind::sleep: return "sleep";
    case step_kind::signal: return "signal";
    case step_kind::child: return "child";
    case step_kind::join: return "join";
  }
  return "step";
}

std::optional<step_kind> parse_step_kind(std::string_view name) {
  for (auto kind : {step_kind::step, step_kind::now, step_kind::random, step_kind::patch, step_kind::tool,
                    step_kind::sleep, step_kind::signal, step_kind::child, step_kind::join})
    if (name == to_string(kind)) return kind;
  return std::nullopt;
}

bool host_recorded(step_kind kind) {
  return kind != step_kind::step && kind != step_kind::now && kind != step_kind::random && kind != step_kind::patch;
}

step_result parse_step_result(const json& j) {
  constexpr std::string_view type = "step";
  step_result r;
  r.seq = get_seq(j, type);
  r.name = get_name(j, type);
  r.kind = get_kind(j, type);
  auto status = get_string(j, type, "status");
  if (status == "ok") {
    r.ok = true;
    r.output = require(j, type, "output");
  } else if (status == "error") {
    r.ok = false;
    r.error = get_error(j, type);
  } else {
    bad(type, "status", "must be \"ok\" or \"error\" (got " + clip_for_error(status) + ")");
  }
  r.attempt = get_attempt(j, type);
  if (j.contains("duration_us")) r.duration_us = get_int(j, type, "duration_us", 0, INT64_MAX);
  return r;
}

json to_json(const step_result& r) {
  json j = {{"seq", r.seq},         {"name", r.name},        {"kind", to_string(r.kind)},
            {"status", r.ok ? "ok" : "error"}, {"attempt", r.attempt}, {"duration_us", r.duration_us}};
  if (r.ok)
    j["output"] = r.output;
  else
    j["error"] = error_json(r.error);
  return j;
}

agent_message parse_agent_message(const json& j) {
  if (!j.is_object()) throw protocol_error("a message must be a JSON object");
  auto it = j.find("t");
  if (it == j.end() || !it->is_string()) throw protocol_error("message has no string field 't' (its type)");
  const auto& t = it->get_ref<const std::string&>();
  if (t == "hello") {
    hello_msg m;
    m.version = static_cast<int>(get_int(j, t, "v", 0, INT32_MAX));
    m.sdk = get_string(j, t, "sdk", max_name_size);
    return m;
  }
  if (t == "begin") {
    begin_msg m;
    m.seq = get_seq(j, t);
    m.name = get_name(j, t);
    m.kind = get_kind(j, t);
    m.attempt = get_attempt(j, t);
    m.timeout_ms = get_optional_duration(j, t, "timeout_ms").value_or(0);
    auto& r = m.retry;
    r.max_attempts = static_cast<int>(get_optional_int(j, t, "max_attempts", 1, 1'000'000).value_or(r.max_attempts));
    r.initial_delay_ms = get_optional_duration(j, t, "initial_delay_ms").value_or(r.initial_delay_ms);
    r.multiplier = get_optional_real(j, t, "multiplier", 0, 1000).value_or(r.multiplier);
    r.max_delay_ms = get_optional_duration(j, t, "max_delay_ms").value_or(r.max_delay_ms);
    r.jitter = get_optional_real(j, t, "jitter", 0, 1).value_or(r.jitter);
    return m;
  }
  if (t == "step") return step_msg{parse_step_result(j), get_optional_bool(j, t, "terminal").value_or(false)};
  if (t == "history") return history_msg{get_seq(j, t, "from")};
  if (t == "tool") {
    tool_msg m;
    m.seq = get_seq(j, t);
    m.name = get_name(j, t);
    m.args = require(j, t, "args");
    return m;
  }
  if (t == "sleep") {
    sleep_msg m;
    m.seq = get_seq(j, t);
    m.duration_ms = get_optional_duration(j, t, "duration_ms");
    m.until_ms = get_optional_int(j, t, "until_ms", 0, INT64_MAX);
    if (!m.duration_ms && !m.until_ms) bad(t, "duration_ms", "is missing (give it or 'until_ms')");
    if (m.duration_ms && m.until_ms) bad(t, "duration_ms", "and field 'until_ms' are both given (give one)");
    return m;
  }
  if (t == "wait") {
    wait_msg m;
    m.seq = get_seq(j, t);
    m.signal = get_name(j, t, "signal");
    m.timeout_ms = get_optional_duration(j, t, "timeout_ms");
    return m;
  }
  if (t == "child") {
    child_msg m;
    m.seq = get_seq(j, t);
    m.agent = get_name(j, t, "agent");
    m.input = require(j, t, "input");
    return m;
  }
  if (t == "join") return join_msg{get_seq(j, t), get_name(j, t, "run_id")};
  if (t == "emit") return emit_msg{require(j, t, "data")};
  if (t == "done") return done_msg{require(j, t, "output")};
  if (t == "fail") return fail_msg{get_error(j, t)};
  throw protocol_error("unknown message type " + clip_for_error(t));
}

json to_json(const agent_message& m) {
  return std::visit(
      overloaded{
          [](const hello_msg& h) -> json { return {{"t", "hello"}, {"v", h.version}, {"sdk", h.sdk}}; },
          [](const begin_msg& b) -> json {
            return {{"t", "begin"},
                    {"seq", b.seq},
                    {"name", b.name},
                    {"kind", to_string(b.kind)},
                    {"attempt", b.attempt},
                    {"timeout_ms", b.timeout_ms},
                    {"max_attempts", b.retry.max_attempts},
                    {"initial_delay_ms", b.retry.initial_delay_ms},
                    {"multiplier", b.retry.multiplier},
                    {"max_delay_ms", b.retry.max_delay_ms},
                    {"jitter", b.retry.jitter}};
          },
          [](const step_msg& s) -> json {
            json j = to_json(s.result);
            j["t"] = "step";
            if (!s.result.ok) j["terminal"] = s.terminal;
            return j;
          },
          [](const history_msg& h) -> json { return {{"t", "history"}, {"from", h.from}}; },
          [](const tool_msg& c) -> json { return {{"t", "tool"}, {"seq", c.seq}, {"name", c.name}, {"args", c.args}}; },
          [](const sleep_msg& s) -> json {
            json j = {{"t", "sleep"}, {"seq", s.seq}};
            if (s.duration_ms) j["duration_ms"] = *s.duration_ms;
            if (s.until_ms) j["until_ms"] = *s.until_ms;
            return j;
          },
          [](const wait_msg& w) -> json {
            json j = {{"t", "wait"}, {"seq", w.seq}, {"signal", w.signal}};
            if (w.timeout_ms) j["timeout_ms"] = *w.timeout_ms;
            return j;
          },
          [](const child_msg& c) -> json { return {{"t", "child"}, {"seq", c.seq}, {"agent", c.agent}, {"input", c.input}}; },
          [](const join_msg& r) -> json { return {{"t", "join"}, {"seq", r.seq}, {"run_id", r.run_id}}; },
          [](const emit_msg& e) -> json { return {{"t", "emit"}, {"data", e.data}}; },
          [](const done_msg& d) -> json { return {{"t", "done"}, {"output", d.output}}; },
          [](const fail_msg& f) -> json { return {{"t", "fail"}, {"error", error_json(f.error)}}; },
      },
      m);
}

host_message parse_host_message(const json& j) {
  if (!j.is_object()) throw protocol_error("a message must be a JSON object");
  auto it = j.find("t");
  if (it == j.end() || !it->is_string()) throw protocol_error("message has no string field 't' (its type)");
  const auto& t = it->get_ref<const std::string&>();
  if (t == "start") {
    start_msg m;
    m.version = static_cast<int>(get_int(j, t, "v", 0, INT32_MAX));
    m.run_id = get_string(j, t, "run_id");
    m.input = require(j, t, "input");
    m.attempt = get_attempt(j, t);
    m.history_steps = get_seq(j, t, "history_steps");
    m.next_step_attempt = static_cast<int>(get_int(j, t, "next_step_attempt", 1, 1'000'000));
    if (j.contains("host")) m.host = get_string(j, t, "host", max_name_size);
    return m;
  }
  if (t == "history") {
    history_chunk m;
    m.from = get_seq(j, t, "from");
    const json& steps = require(j, t, "steps");
    if (!steps.is_array() || steps.empty()) bad(t, "steps", "must be a non-empty array");
    m.steps.reserve(steps.size());
    for (const auto& e : steps) {
      auto r = parse_step_result(e);
      if (r.seq != m.from + m.steps.size()) bad(t, "steps", "must hold the steps from 'from' on, in order");
      m.steps.push_back(std::move(r));
    }
    return m;
  }
  if (t == "retry") {
    retry_msg m;
    m.seq = get_seq(j, t);
    m.attempt = get_attempt(j, t);
    require(j, t, "delay_ms");
    m.delay_ms = *get_optional_duration(j, t, "delay_ms");
    return m;
  }
  if (t == "ack") return ack_msg{get_seq(j, t), get_optional_bool(j, t, "alone").value_or(false)};
  if (t == "reject") return reject_msg{get_string(j, t, "error")};
  if (t == "result") {
    auto r = parse_step_result(j);
    if (!host_recorded(r.kind)) bad(t, "kind", "must be one of tool, sleep, signal, child, join");
    return result_msg{std::move(r)};
  }
  if (t == "cancel") return cancel_msg{get_string(j, t, "reason")};
  throw protocol_error("unknown message type " + clip_for_error(t));
}

json to_json(const host_message& m) {
  return std::visit(
      overloaded{
          [](const start_msg& s) -> json {
            return {{"t", "start"},         {"v", s.version},       {"run_id", s.run_id},
                    {"input", s.input},     {"attempt", s.attempt}, {"history_steps", s.history_steps},
                    {"next_step_attempt", s.next_step_attempt}, {"host", s.host}};
          },
          [](const ack_msg& a) -> json {
            json j = {{"t", "ack"}, {"seq", a.seq}};
            if (a.alone) j["alone"] = true;
            return j;
          },
          [](const reject_msg& r) -> json { return {{"t", "reject"}, {"error", r.error}}; },
          [](const result_msg& r) -> json {
            json j = to_json(r.result);
            j["t"] = "result";
            return j;
          },
          [](const cancel_msg& c) -> json { return {{"t", "cancel"}, {"reason", c.reason}}; },
          [](const history_chunk& h) -> json {
            json steps = json::array();
            for (const auto& r : h.steps) steps.push_back(to_json(r));
            return {{"t", "history"}, {"from", h.from}, {"steps", std::move(steps)}};
          },
          [](const retry_msg& r) -> json {
            return {{"t", "retry"}, {"seq", r.seq}, {"attempt", r.attempt}, {"delay_ms", r.delay_ms}};
          },
      },
      m);
}

std::string_view type_name(const agent_message& m) {
  static constexpr std::string_view names[] = {"hello", "begin", "step", "history", "tool",  "sleep",
                                               "wait",  "child", "join", "emit",  "done", "fail"};
  static_assert(std::size(names) == std::variant_size_v<agent_message>);
  return names[m.index()];
}

}  // namespace cairn::protocol
