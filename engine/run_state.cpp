#include "engine/run_state.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace cairn::engine {
namespace {

constexpr std::int64_t hour_ms = 3'600'000;
// One more than the most suspensions_per_hour a policy may allow
// (policy.cpp): enough to tell that a run went past any limit.
constexpr std::size_t most_suspensions_kept = 3601;

template <class... F>
struct overloaded : F... {
  using F::operator()...;
};
template <class... F>
overloaded(F...) -> overloaded<F...>;

// The per-step fields now speak of step `at`: cleared when they spoke of another.
void move_to(run_state& s, std::uint64_t at) {
  if (s.seq == at) return;
  s.seq = at;
  s.step_failures = 0;
  s.tool_attempts = 0;
  s.tool.reset();
  s.timer.reset();
  s.wait.reset();
}

void suspended_at(run_state& s, std::int64_t now_ms) {
  auto& times = s.suspended_at_ms;
  times.push_back(now_ms);
  std::erase_if(times, [&](std::int64_t t) { return t <= now_ms - hour_ms; });
  if (times.size() > most_suspensions_kept)
    times.erase(times.begin(), times.end() - static_cast<std::ptrdiff_t>(most_suspensions_kept));
}

run_agent agent_of(const runtime::agent_version& v) {
  return {v.program.string(), v.id, v.program.filename().string()};
}

[[noreturn]] void not_a_state(const std::string& why) {
  throw storage::storage_error(storage::errc::corrupt,
                               fmt::format("a run's kept state is damaged ({}); `cairn doctor` checks the journal", why));
}

}  // namespace

std::optional<effects::timer_set> run_state::timer_at(std::uint64_t at) const {
  return at == seq ? timer : std::nullopt;
}

std::optional<effects::wait_started> run_state::wait_at(std::uint64_t at) const {
  return at == seq ? wait : std::nullopt;
}

std::optional<unsettled_call> run_state::tool_at(std::uint64_t at) const { return at == seq ? tool : std::nullopt; }

std::uint64_t run_state::suspensions_since(std::int64_t since_ms) const {
  return static_cast<std::uint64_t>(
      std::count_if(suspended_at_ms.begin(), suspended_at_ms.end(), [&](std::int64_t t) { return t > since_ms; }));
}

json to_json(const run_state& s) {
  json out = {{"seq", s.seq},
              {"step_failures", s.step_failures},
              {"tool_attempts", s.tool_attempts},
              {"llm_tokens", s.llm_tokens},
              {"suspended_at_ms", s.suspended_at_ms}};
  if (s.tool)
    out["tool"] = {{"tool", s.tool->tool},
                   {"idempotency", s.tool->idempotency},
                   {"args", s.tool->args},
                   {"started_at_ms", s.tool->started_at_ms}};
  if (s.timer) out["timer"] = {{"until_ms", s.timer->until_ms}, {"in_past", s.timer->in_past}};
  if (s.wait)
    out["wait"] = {{"signal", s.wait->signal}, {"deadline_ms", s.wait->deadline_ms ? json(*s.wait->deadline_ms) : json()}};
  if (s.agent) out["agent"] = {{"agent", s.agent->agent}, {"version", s.agent->version}, {"program", s.agent->program}};
  return out;
}

run_state run_state_of(const json& stored) {
  if (!stored.is_object()) not_a_state("not an object");
  run_state s;
  try {
    s.seq = stored.value("seq", std::uint64_t{0});
    s.step_failures = stored.value("step_failures", 0);
    s.tool_attempts = stored.value("tool_attempts", 0);
    s.llm_tokens = stored.value("llm_tokens", std::uint64_t{0});
    s.suspended_at_ms = stored.value("suspended_at_ms", std::vector<std::int64_t>{});
    if (stored.contains("tool")) {
      const auto& t = stored.at("tool");
      s.tool = unsettled_call{t.at("tool").get<std::string>(), t.at("idempotency").get<std::string>(), t.at("args"),
                              t.at("started_at_ms").get<std::int64_t>()};
    }
    if (stored.contains("timer"))
      s.timer = effects::timer_set{s.seq, stored.at("timer").at("until_ms").get<std::int64_t>(),
                                   stored.at("timer").at("in_past").get<bool>()};
    if (stored.contains("wait")) {
      const auto& w = stored.at("wait");
      s.wait = effects::wait_started{s.seq, w.at("signal").get<std::string>(), std::nullopt};
      if (!w.at("deadline_ms").is_null()) s.wait->deadline_ms = w.at("deadline_ms").get<std::int64_t>();
    }
    if (stored.contains("agent")) {
      const auto& a = stored.at("agent");
      s.agent = run_agent{a.at("agent").get<std::string>(), a.at("version").get<std::string>(),
                          a.at("program").get<std::string>()};
    }
  } catch (const json::exception& e) {
    not_a_state(e.what());
  }
  return s;
}

bool changes_state(const effect& e) {
  return std::visit(overloaded{
                        [](const effects::step_committed& s) { return s.tokens > 0; },
                        [](const effects::tool_settled&) { return true; },
                        [](const effects::retry_due&) { return true; },
                        [](const effects::tool_started&) { return true; },
                        [](const effects::timer_set&) { return true; },
                        [](const effects::wait_started&) { return true; },
                        [](const effects::suspended&) { return true; },
                        [](const effects::agent_chosen&) { return true; },
                        [](const auto&) { return false; },
                    },
                    e);
}

void change(run_state& s, const effect& e, std::int64_t now_ms) {
  std::visit(overloaded{
                 [&](const effects::step_committed& c) { s.llm_tokens += c.tokens; },
                 [&](const effects::retry_due& r) {
                   move_to(s, r.seq);
                   ++s.step_failures;
                 },
                 [&](const effects::tool_started& t) {
                   move_to(s, t.seq);
                   ++s.tool_attempts;
                   s.tool = unsettled_call{t.tool, t.idempotency, t.args, now_ms};
                 },
                 [&](const effects::tool_settled& t) {
                   move_to(s, t.seq);
                   s.tool.reset();
                   s.llm_tokens += t.tokens;
                 },
                 [&](const effects::timer_set& t) {
                   move_to(s, t.seq);
                   s.timer = t;
                 },
                 [&](const effects::wait_started& w) {
                   move_to(s, w.seq);
                   s.wait = w;
                 },
                 [&](const effects::suspended&) { suspended_at(s, now_ms); },
                 [&](const effects::agent_chosen& a) { s.agent = agent_of(a.version); },
                 [](const auto&) {},
             },
             e);
}

void derive_step_fields(run_state& s, storage::journal& journal, const std::string& run_id) {
  const auto at = journal.step_count(run_id);
  for (const auto& e : journal.events_at(run_id, at)) {
    const auto& d = e.data;
    if (e.kind == "step_retry") {
      move_to(s, at);
      ++s.step_failures;
    } else if (e.kind == "tool_started") {
      move_to(s, at);
      ++s.tool_attempts;
      s.tool = unsettled_call{d.value("tool", ""), d.value("idempotency", ""), d.value("args", json()), e.at_ms};
    } else if (e.kind == "tool_settled") {
      move_to(s, at);
      s.tool.reset();
    } else if (e.kind == "timer_set") {
      move_to(s, at);
      s.timer = effects::timer_set{at, d.at("until_ms").get<std::int64_t>(), d.value("in_past", false)};
    } else if (e.kind == "wait_started") {
      move_to(s, at);
      s.wait = effects::wait_started{at, d.value("signal", ""), std::nullopt};
      if (d.contains("deadline_ms") && !d.at("deadline_ms").is_null())
        s.wait->deadline_ms = d.at("deadline_ms").get<std::int64_t>();
    }
  }
}

std::vector<std::int64_t> derive_suspensions(storage::journal& journal, const std::string& run_id,
                                             std::int64_t now_ms) {
  std::vector<std::int64_t> times;
  for (const auto& e : journal.events(run_id))
    if (e.kind == "suspended" && e.at_ms > now_ms - hour_ms) times.push_back(e.at_ms);
  if (times.size() > most_suspensions_kept)
    times.erase(times.begin(), times.end() - static_cast<std::ptrdiff_t>(most_suspensions_kept));
  return times;
}

std::uint64_t derive_tokens(storage::journal& journal, const std::string& run_id, tokens_of tokens) {
  std::uint64_t spent = 0;
  for (const auto& step : journal.steps(run_id))
    if (step.result.kind == protocol::step_kind::tool && step.result.name == "llm.chat" && step.result.ok)
      spent += tokens(step.result.output);
  return spent;
}

std::optional<run_agent> derive_agent(storage::journal& journal, const std::string& run_id) {
  std::optional<run_agent> agent;
  for (const auto& e : journal.events(run_id))
    if (e.kind == "agent_version" || e.kind == "agent_replaced")
      agent = run_agent{e.data.value("agent", ""), e.data.value("version", ""),
                        std::filesystem::path(e.data.value("agent", "")).filename().string()};
  return agent;
}

std::optional<run_agent> agent_of_run(storage::journal& journal, const std::string& run_id) {
  if (auto kept = kept_run_state(journal, run_id)) return kept->agent;
  return derive_agent(journal, run_id);
}

run_state derive_run_state(storage::journal& journal, const std::string& run_id, tokens_of tokens,
                           std::int64_t now_ms) {
  run_state s;
  derive_step_fields(s, journal, run_id);
  s.suspended_at_ms = derive_suspensions(journal, run_id, now_ms);
  s.llm_tokens = derive_tokens(journal, run_id, tokens);
  s.agent = derive_agent(journal, run_id);
  return s;
}

std::optional<run_state> kept_run_state(storage::journal& journal, const std::string& run_id) {
  if (auto kept = journal.run_state(run_id)) return run_state_of(*kept);
  return std::nullopt;
}

run_state step_state(storage::journal& journal, const std::string& run_id) {
  if (auto kept = kept_run_state(journal, run_id)) return *kept;
  run_state s;
  derive_step_fields(s, journal, run_id);
  return s;
}

}  // namespace cairn::engine
