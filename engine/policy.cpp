#include "engine/policy.hpp"

#include <unistd.h>

#include <cmath>
#include <fstream>
#include <random>
#include <regex>
#include <set>

#include <fmt/format.h>

#include "protocol/bounded_json.hpp"

namespace cairn::engine {
namespace {

constexpr std::uint64_t mib = 1ull << 20;
constexpr std::size_t max_policy_bytes = 1 << 20;
constexpr const char* builtin_fetch = "http.fetch";
constexpr const char* builtin_llm = "llm.chat";

std::string join_key(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}

// Reads one JSON object strictly: every key must be taken by a getter before
// done(), or it is reported as unknown.
class object_reader {
 public:
  object_reader(const json& j, std::string path) : j_(j), path_(std::move(path)) {
    if (!j_.is_object()) throw policy_error(path_, "must be a JSON object");
  }

  bool has(const char* key) const { return j_.contains(key); }

  const json* take(const char* key) {
    seen_.insert(key);
    auto it = j_.find(key);
    return it == j_.end() ? nullptr : &*it;
  }

  std::uint64_t number(const char* key, std::uint64_t fallback, std::uint64_t min, std::uint64_t max,
                       const char* unit = "") {
    const json* v = take(key);
    if (!v) return fallback;
    if (!v->is_number_integer() || (v->is_number_integer() && !v->is_number_unsigned() && v->get<std::int64_t>() < 0))
      throw policy_error(key_of(key), "must be a whole number");
    auto n = v->get<std::uint64_t>();
    if (n < min || n > max)
      throw policy_error(key_of(key), fmt::format("{}{} is impossible: it must be between {} and {}{}", n, unit, min,
                                                  max, unit));
    return n;
  }

  double real(const char* key, double fallback, double min, double max) {
    const json* v = take(key);
    if (!v) return fallback;
    if (!v->is_number()) throw policy_error(key_of(key), "must be a number");
    double n = v->get<double>();
    if (!(n >= min && n <= max))
      throw policy_error(key_of(key), fmt::format("{} is impossible: it must be between {} and {}", n, min, max));
    return n;
  }

  bool boolean(const char* key, bool fallback) {
    const json* v = take(key);
    if (!v) return fallback;
    if (!v->is_boolean()) throw policy_error(key_of(key), "must be true or false");
    return v->get<bool>();
  }

  std::string string(const char* key, const std::string& fallback) {
    const json* v = take(key);
    if (!v) return fallback;
    if (!v->is_string()) throw policy_error(key_of(key), "must be a string");
    return v->get<std::string>();
  }

  std::vector<std::string> strings(const char* key, std::vector<std::string> fallback, bool required = false) {
    const json* v = take(key);
    if (!v) {
      if (required) throw policy_error(key_of(key), "is required");
      return fallback;
    }
    if (!v->is_array()) throw policy_error(key_of(key), "must be an array of strings");
    std::vector<std::string> out;
    for (const auto& e : *v) {
      if (!e.is_string() || e.get_ref<const std::string&>().empty())
        throw policy_error(key_of(key), "must be an array of non-empty strings");
      out.push_back(e.get<std::string>());
    }
    return out;
  }

  void done() const {
    for (const auto& [key, value] : j_.items())
      if (!seen_.count(key))
        throw policy_error(key_of(key), "is not a policy key" + known_keys());
  }

  std::string key_of(const std::string& key) const { return join_key(path_, key); }

 private:
  std::string known_keys() const {
    if (seen_.empty()) return "";
    std::string list;
    for (const auto& k : seen_) list += (list.empty() ? "" : ", ") + k;
    return " (known here: " + list + ")";
  }

  const json& j_;
  std::string path_;
  std::set<std::string> seen_;
};

std::uint64_t physical_memory() {
  long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
  return pages > 0 && size > 0 ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(size) : 1ull << 40;
}

// Sets p.limits and the limits that live beside them in the policy.
void parse_limits(object_reader& r, policy& p) {
  runtime::resource_limits d = default_policy().limits;
  runtime::resource_limits l;
  const std::uint64_t ram_mib = physical_memory() / mib;
  l.max_memory_bytes = r.number("memory_mb", d.max_memory_bytes / mib, 32, ram_mib, " MiB") * mib;
  l.max_processes = r.number("processes", d.max_processes, 8, 1'000'000);
  l.max_cpu_seconds = r.number("cpu_seconds", d.max_cpu_seconds, 0, 365ull * 24 * 3600, " s");
  p.wall_time = std::chrono::seconds(r.number("wall_seconds", default_policy().wall_time.count(), 0, 365ull * 24 * 3600, " s"));
  p.run_wall_time = std::chrono::seconds(
      r.number("run_wall_seconds", default_policy().run_wall_time.count(), 0, 10 * 365ull * 24 * 3600, " s"));
  l.max_open_files = r.number("open_files", d.max_open_files, 16, 1 << 20);
  l.max_workspace_bytes = r.number("workspace_mb", d.max_workspace_bytes / mib, 0, 1ull << 24, " MiB") * mib;
  if (l.max_workspace_bytes > 0 && l.max_workspace_bytes < 16 * mib)
    throw policy_error(r.key_of("workspace_mb"),
                       fmt::format("{} MiB is impossible: a quota is at least 16 MiB (0: no quota, files bounded "
                                   "one by one by file_mb)",
                                   l.max_workspace_bytes / mib));
  l.max_file_bytes = r.number("file_mb", d.max_file_bytes / mib, 1, 1ull << 24, " MiB") * mib;
  l.max_tmp_bytes = r.number("tmp_mb", d.max_tmp_bytes / mib, 1, 1ull << 24, " MiB") * mib;
  l.max_log_bytes = r.number("log_mb", d.max_log_bytes / mib, 1, 1ull << 20, " MiB") * mib;
  p.suspensions_per_hour = r.number("suspensions_per_hour", default_policy().suspensions_per_hour, 1, 3600);
  if (l.max_tmp_bytes > l.max_memory_bytes)
    throw policy_error(r.key_of("tmp_mb"), fmt::format("{} MiB is impossible: /tmp is memory and must fit in "
                                                       "memory_mb ({} MiB)",
                                                       l.max_tmp_bytes / mib, l.max_memory_bytes / mib));
  const journal_limits dj;
  auto& journal = p.journal;
  journal.journal_bytes = r.number("journal_mb", dj.journal_bytes / mib, 1, 1ull << 20, " MiB") * mib;
  // A step's output reaches the agent in one frame, at most 16 MiB.
  journal.step_output_bytes = r.number("step_output_mb", dj.step_output_bytes / mib, 1, 15, " MiB") * mib;
  journal.signal_bytes = r.number("signal_kb", dj.signal_bytes >> 10, 1, 15ull << 10, " KiB") << 10;
  journal.signals = r.number("signals", dj.signals, 1, 1'000'000);
  journal.checkpoint_bytes = r.number("checkpoint_mb", dj.checkpoint_bytes / mib, 0, 1ull << 24, " MiB") * mib;
  r.done();
  p.limits = l;
}

// The host patterns, tool names and variable names below are matched by
// std::regex, whose matcher recurses once a character: a longer text is
// refused before it is matched (a host of 900,000 characters overflowed the
// stack), and its message names its length rather than quoting it.
constexpr std::size_t max_host_pattern = 300;  // a 253-character name, "*." and ":65535"
constexpr std::size_t max_tool_name = 128;
constexpr std::size_t max_env_name = 256;

void check_host_pattern(const std::string& key, const std::string& host) {
  if (host.size() > max_host_pattern)
    throw policy_error(key, fmt::format("a host pattern of {} characters is longer than a host name and port may be "
                                        "(at most {})",
                                        host.size(), max_host_pattern));
  static const std::regex pattern(
      R"(^((\*\.)?[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])(:([0-9]{1,5}|\*))?$)");
  if (!std::regex_match(host, pattern))
    throw policy_error(key, fmt::format("'{}' is not a host pattern: use 'example.com' (the scheme's default "
                                        "port), 'example.com:8443', 'example.com:*' (any port), '*.example.com', "
                                        "'127.0.0.1:8080' or '[::1]:8080' (no scheme, no path)",
                                        host));
}

http_fetch_grant parse_fetch(object_reader& r) {
  http_fetch_grant d, g;
  g.hosts = r.strings("hosts", {}, true);
  if (g.hosts.empty()) throw policy_error(r.key_of("hosts"), "must name at least one host");
  for (const auto& h : g.hosts) check_host_pattern(r.key_of("hosts"), h);
  g.methods = r.strings("methods", d.methods);
  static const std::set<std::string> methods = {"GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE"};
  for (const auto& m : g.methods)
    if (!methods.count(m))
      throw policy_error(r.key_of("methods"), "'" + m + "' is not one of GET, HEAD, OPTIONS, POST, PUT, PATCH, DELETE");
  g.max_response_bytes = r.number("max_bytes", d.max_response_bytes, 1, 1ull << 30);
  g.timeout = std::chrono::milliseconds(
      r.number("timeout_ms", d.timeout.count(), min_network_timeout.count(), 3'600'000, " ms"));
  g.max_redirects = static_cast<int>(r.number("max_redirects", d.max_redirects, 0, 20));
  g.private_addresses = r.boolean("private", d.private_addresses);
  r.done();
  return g;
}

llm_chat_grant parse_llm(object_reader& r) {
  llm_chat_grant d, g;
  g.models = r.strings("models", d.models);
  g.max_tokens = static_cast<int>(r.number("max_tokens", d.max_tokens, 1, 10'000'000));
  g.timeout = std::chrono::milliseconds(
      r.number("timeout_ms", d.timeout.count(), min_network_timeout.count(), 3'600'000, " ms"));
  g.stream = r.boolean("stream", d.stream);
  g.max_response_bytes = r.number("max_bytes", d.max_response_bytes, 1, 1ull << 30);
  g.images = r.boolean("images", d.images);
  g.max_total_tokens = r.number("max_total_tokens", d.max_total_tokens, 0, 1ull << 40);
  r.done();
  return g;
}

idempotency parse_idempotency(const std::string& key, const json* v) {
  if (!v) throw policy_error(key, "is required: declare the tool \"idempotent\" (safe to repeat with the same "
                                  "idempotency key after a crash) or \"at_most_once\"");
  if (v->is_string() && *v == "idempotent") return idempotency::idempotent;
  if (v->is_string() && *v == "at_most_once") return idempotency::at_most_once;
  throw policy_error(key, "must be \"idempotent\" or \"at_most_once\"");
}

command_tool_spec parse_command(object_reader& r) {
  command_tool_spec d, c;
  c.command = r.strings("command", {}, true);
  if (c.command.empty()) throw policy_error(r.key_of("command"), "must hold the program and its arguments");
  const std::filesystem::path program = c.command[0];
  if (!program.is_absolute())
    throw policy_error(r.key_of("command"), "'" + c.command[0] + "' must be an absolute path");
  if (access(program.c_str(), X_OK) != 0)
    throw policy_error(r.key_of("command"), "'" + c.command[0] + "' is not an executable file on this host");
  if (const json* input = r.take("input")) {
    if (!input->is_object()) throw policy_error(r.key_of("input"), "must map argument names to types");
    static const std::set<std::string> types = {"string", "number", "integer", "boolean", "object", "array", "any"};
    for (const auto& [name, type] : input->items()) {
      if (!type.is_string() || !types.count(type.get<std::string>()))
        throw policy_error(r.key_of("input") + "." + name,
                           "must be one of string, number, integer, boolean, object, array, any");
      if (name.empty() || name == "?") throw policy_error(r.key_of("input"), "an argument name is empty");
      c.input[name] = type.get<std::string>();
    }
  }
  c.timeout = std::chrono::milliseconds(r.number("timeout_ms", d.timeout.count(), 1, 3'600'000, " ms"));
  c.kind = parse_idempotency(r.key_of("idempotency"), r.take("idempotency"));
  c.max_output_bytes = r.number("max_output_bytes", d.max_output_bytes, 1, 1ull << 30);
  c.env = r.strings("env", d.env);
  static const std::regex env_name(R"(^[A-Za-z_][A-Za-z0-9_]*$)");
  for (const auto& name : c.env) {
    if (name.size() > max_env_name)
      throw policy_error(r.key_of("env"), fmt::format("a variable name of {} characters is too long (at most {})",
                                                      name.size(), max_env_name));
    if (!std::regex_match(name, env_name) || name == "CAIRN_RUN_ID" || name == "CAIRN_TOOL_SEQ" ||
        name == "CAIRN_IDEMPOTENCY_KEY")
      throw policy_error(r.key_of("env"), "'" + name + "' is not a variable the tool may take from the host: name "
                                          "variables like SMTP_PASSWORD (cairn sets CAIRN_RUN_ID, CAIRN_TOOL_SEQ and "
                                          "CAIRN_IDEMPOTENCY_KEY itself)");
  }
  r.done();
  return c;
}

void check_tool_name(const std::string& key, const std::string& name) {
  if (name.size() > max_tool_name)
    throw policy_error("tools", fmt::format("a tool name of {} characters is too long (at most {})", name.size(),
                                            max_tool_name));
  static const std::regex pattern(R"(^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$)");
  if (!std::regex_match(name, pattern))
    throw policy_error(key, "a tool name is lowercase letters, digits and '_', dot-separated (like send_email "
                            "or crm.lookup)");
}

struct timeouts parse_timeouts(object_reader& r) {
  struct timeouts d, t;
  constexpr std::uint64_t year = 365ull * 24 * 3600;
  t.run = std::chrono::seconds(r.number("run_seconds", d.run.count(), 0, 10 * year, " s"));
  t.step = std::chrono::seconds(r.number("step_seconds", d.step.count(), 0, year, " s"));
  t.cancel_grace = std::chrono::seconds(r.number("cancel_grace_seconds", d.cancel_grace.count(), 0, 3600, " s"));
  r.done();
  return t;
}

run_retry parse_retry(object_reader& r) {
  run_retry d, g;
  g.initial = std::chrono::milliseconds(r.number("initial_ms", d.initial.count(), 0, 3'600'000, " ms"));
  g.multiplier = r.real("multiplier", d.multiplier, 1.0, 100.0);
  g.max = std::chrono::milliseconds(r.number("max_ms", d.max.count(), 0, 86'400'000, " ms"));
  g.jitter = r.real("jitter", d.jitter, 0.0, 1.0);
  g.step_attempts = static_cast<int>(r.number("step_attempts", d.step_attempts, 1, 1000));
  if (g.max < g.initial)
    throw policy_error(r.key_of("max_ms"), fmt::format("{} ms is impossible: it must be at least initial_ms ({} ms)",
                                                       g.max.count(), g.initial.count()));
  r.done();
  return g;
}

child_grant parse_children(object_reader& r) {
  child_grant d, g;
  g.max = r.number("max", d.max, 0, 100'000);
  g.max_depth = r.number("max_depth", d.max_depth, 0, 100);
  g.agents = r.strings("agents", d.agents);
  for (const auto& a : g.agents)
    if (!std::filesystem::path(a).is_absolute())
      throw policy_error(r.key_of("agents"), "'" + a + "' must be an absolute path (or relative to the policy file)");
  r.done();
  return g;
}

json strings_json(const std::vector<std::string>& v) { return json(v); }

}  // namespace

policy default_policy() {
  policy p;
  p.limits.max_memory_bytes = 1024 * mib;
  p.limits.max_processes = 256;
  p.limits.max_cpu_seconds = 1800;
  p.limits.max_open_files = 256;
  p.limits.max_workspace_bytes = 1024 * mib;
  p.limits.max_file_bytes = 1024 * mib;
  p.limits.max_tmp_bytes = 64 * mib;
  p.limits.max_log_bytes = 16 * mib;
  p.wall_time = std::chrono::seconds(3600);
  return p;
}

std::chrono::milliseconds run_retry::delay_after(int crashes) const {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  double ms = static_cast<double>(initial.count()) * std::pow(multiplier, std::max(crashes - 1, 0));
  ms = std::min(ms, static_cast<double>(max.count()));
  ms *= 1.0 - jitter * std::uniform_real_distribution<double>(0.0, 1.0)(rng);
  return std::chrono::milliseconds(static_cast<std::int64_t>(ms));
}

bool policy::grants(const std::string& tool) const {
  if (tool == builtin_fetch) return http_fetch.has_value();
  if (tool == builtin_llm) return llm_chat.has_value();
  return commands.count(tool) > 0;
}

std::vector<std::string> policy::tool_names() const {
  std::vector<std::string> names;
  if (http_fetch) names.push_back(builtin_fetch);
  if (llm_chat) names.push_back(builtin_llm);
  for (const auto& [name, spec] : commands) names.push_back(name);
  return names;
}

std::chrono::seconds policy::run_bound() const {
  if (timeouts.run.count() == 0) return run_wall_time;
  if (run_wall_time.count() == 0) return timeouts.run;
  return std::min(timeouts.run, run_wall_time);
}

std::pair<std::string, std::string> policy::deadline_passed() const {
  if (timeouts.run.count() > 0 && timeouts.run == run_bound())
    return {fmt::format("the run exceeded its timeout of {} s (timeouts.run_seconds in the policy)", timeouts.run.count()),
            "timeout"};
  return {fmt::format("the run lived longer than {} s across all its attempts and waits (limits.run_wall_seconds in the "
                      "policy)",
                      run_wall_time.count()),
          "limit_exceeded"};
}

policy parse_policy(const json& j) {
  policy p = default_policy();
  object_reader root(j, "");
  p.network = root.string("network", "none");
  if (p.network != "none")
    throw policy_error("network", "only \"none\" is supported: a sandbox has no network. Reach the outside "
                                  "through the http.fetch tool, which the host makes within this policy");
  if (const json* limits = root.take("limits")) {
    object_reader r(*limits, "limits");
    parse_limits(r, p);
  }
  if (const json* t = root.take("timeouts")) {
    object_reader r(*t, "timeouts");
    p.timeouts = parse_timeouts(r);
  }
  if (const json* t = root.take("retry")) {
    object_reader r(*t, "retry");
    p.retry = parse_retry(r);
  }
  if (const json* t = root.take("children")) {
    object_reader r(*t, "children");
    p.children = parse_children(r);
  }
  if (const json* tools = root.take("tools")) {
    if (!tools->is_object()) throw policy_error("tools", "must map tool names to their grants");
    for (const auto& [name, grant] : tools->items()) {
      const std::string key = "tools." + name;
      check_tool_name(key, name);
      object_reader r(grant, key);
      if (name == builtin_fetch) p.http_fetch = parse_fetch(r);
      else if (name == builtin_llm) p.llm_chat = parse_llm(r);
      else if (!r.has("command"))
        throw policy_error(key, "is neither a built-in tool (http.fetch, llm.chat) nor a user tool with a "
                                "\"command\"");
      else p.commands[name] = parse_command(r);
    }
  }
  root.done();
  return p;
}

policy load_policy_file(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw policy_error("", fmt::format("cannot read policy file {}", file.string()));
  // Read in chunks until past the limit, which tells a file that is too long
  // without reading it all (a buffer of the limit's size, zeroed first, cost
  // every command with a policy a millisecond of page faults).
  std::string text;
  for (char chunk[16384]; text.size() <= max_policy_bytes;) {
    in.read(chunk, sizeof chunk);
    if (in.gcount() == 0) break;
    text.append(chunk, static_cast<std::size_t>(in.gcount()));
  }
  if (text.size() > max_policy_bytes)
    throw policy_error("", fmt::format("policy file {} is larger than {} KiB; a policy is a few lines", file.string(),
                                       max_policy_bytes >> 10));
  json j;
  try {
    j = protocol::parse_bounded(text, "policy file " + file.string(), {protocol::max_depth, max_policy_bytes});
  } catch (const protocol::json_error& e) {
    throw policy_error("", e.what());
  }
  // A user tool's program may be named relative to the policy file, so a
  // policy and its tools can live together in one folder.
  if (j.is_object() && j.contains("tools") && j["tools"].is_object())
    for (auto& [name, grant] : j["tools"].items())
      if (grant.is_object() && grant.contains("command") && grant["command"].is_array() && !grant["command"].empty() &&
          grant["command"][0].is_string()) {
        std::filesystem::path program = grant["command"][0].get<std::string>();
        if (program.is_relative() && program.has_parent_path())
          grant["command"][0] = std::filesystem::absolute(file.parent_path() / program).lexically_normal().string();
      }
  if (j.is_object() && j.contains("children") && j["children"].is_object() && j["children"].contains("agents") &&
      j["children"]["agents"].is_array())
    for (auto& a : j["children"]["agents"])
      if (a.is_string() && std::filesystem::path(a.get<std::string>()).is_relative())
        a = std::filesystem::absolute(file.parent_path() / a.get<std::string>()).lexically_normal().string();
  try {
    return parse_policy(j);
  } catch (const policy_error& e) {
    throw policy_error(e, file);
  }
}

json to_json(const policy& p) {
  const auto& l = p.limits;
  json tools = json::object();
  if (p.http_fetch) {
    const auto& g = *p.http_fetch;
    tools[builtin_fetch] = {{"hosts", strings_json(g.hosts)},
                            {"methods", strings_json(g.methods)},
                            {"max_bytes", g.max_response_bytes},
                            {"timeout_ms", g.timeout.count()},
                            {"max_redirects", g.max_redirects},
                            {"private", g.private_addresses}};
  }
  if (p.llm_chat) {
    const auto& g = *p.llm_chat;
    tools[builtin_llm] = {{"models", strings_json(g.models)},
                          {"max_tokens", g.max_tokens},
                          {"timeout_ms", g.timeout.count()},
                          {"stream", g.stream},
                          {"max_bytes", g.max_response_bytes},
                          {"images", g.images},
                          {"max_total_tokens", g.max_total_tokens}};
  }
  for (const auto& [name, c] : p.commands)
    tools[name] = {{"command", strings_json(c.command)},
                   {"input", c.input},
                   {"timeout_ms", c.timeout.count()},
                   {"idempotency", to_string(c.kind)},
                   {"max_output_bytes", c.max_output_bytes},
                   {"env", strings_json(c.env)}};
  return {{"network", p.network},
          {"limits",
           {{"memory_mb", l.max_memory_bytes / mib},
            {"processes", l.max_processes},
            {"cpu_seconds", l.max_cpu_seconds},
            {"wall_seconds", p.wall_time.count()},
            {"run_wall_seconds", p.run_wall_time.count()},
            {"open_files", l.max_open_files},
            {"workspace_mb", l.max_workspace_bytes / mib},
            {"file_mb", l.max_file_bytes / mib},
            {"tmp_mb", l.max_tmp_bytes / mib},
            {"log_mb", l.max_log_bytes / mib},
            {"suspensions_per_hour", p.suspensions_per_hour},
            {"journal_mb", p.journal.journal_bytes / mib},
            {"step_output_mb", p.journal.step_output_bytes / mib},
            {"signal_kb", p.journal.signal_bytes >> 10},
            {"signals", p.journal.signals},
            {"checkpoint_mb", p.journal.checkpoint_bytes / mib}}},
          {"timeouts",
           {{"run_seconds", p.timeouts.run.count()},
            {"step_seconds", p.timeouts.step.count()},
            {"cancel_grace_seconds", p.timeouts.cancel_grace.count()}}},
          {"retry",
           {{"initial_ms", p.retry.initial.count()},
            {"multiplier", p.retry.multiplier},
            {"max_ms", p.retry.max.count()},
            {"jitter", p.retry.jitter},
            {"step_attempts", p.retry.step_attempts}}},
          {"children",
           {{"max", p.children.max}, {"max_depth", p.children.max_depth}, {"agents", strings_json(p.children.agents)}}},
          {"tools", std::move(tools)}};
}

}  // namespace cairn::engine
