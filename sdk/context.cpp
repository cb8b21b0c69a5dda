#include <cxxabi.h>

#include <algorithm>
#include <random>
#include <typeinfo>

#include "session.hpp"

namespace cairn {
namespace {

using clock = std::chrono::steady_clock;

std::string type_of(const std::exception& e) {
  int status = 0;
  const char* mangled = typeid(e).name();
  std::unique_ptr<char, void (*)(void*)> demangled(abi::__cxa_demangle(mangled, nullptr, nullptr, &status),
                                                   std::free);
  return status == 0 && demangled ? demangled.get() : mangled;
}

std::mt19937_64& random_engine() {
  static std::mt19937_64 engine{std::random_device{}()};
  return engine;
}

// A duration for the wire: the protocol's longest at most (PROTOCOL.md §3.1), never negative.
std::int64_t wire_ms(std::chrono::milliseconds d) {
  return std::clamp<std::int64_t>(d.count(), 0, protocol::max_duration_ms);
}

// `x` within [0, max] for the wire; NaN gives 0.
double wire_real(double x, double max) { return x > 0 ? std::min(x, max) : 0.0; }

// What the agent asks the host for; the host decides every retry (PROTOCOL.md §2.1).
protocol::retry_request retry_request_of(const retry_policy& p) {
  return {std::clamp(p.max_attempts, 1, 1'000'000), wire_ms(p.initial_delay), wire_real(p.multiplier, 1000),
          wire_ms(p.max_delay), wire_real(p.jitter, 1)};
}

// Starts every journaled ctx call: refuses one inside a step, throws
// cancelled_error once the run is cancelled, and clears session::in_step
// however the call ends.
struct step_guard {
  explicit step_guard(session& s) : s_(s) {
    if (s_.in_step)
      throw std::logic_error(
          "ctx.step, tool, sleep, sleep_until, wait_signal, start_child, join, now, random and patched cannot be "
          "called inside a step");
    // A replayed call returns at once: it sees a cancel read with the history
    // but does not spend a read of the channel on each of thousands of steps.
    if (!s_.replaying()) s_.throw_if_cancelled();
    else if (s_.cancel_reason()) throw cancelled_error(*s_.cancel_reason());
    s_.in_step = true;
  }
  ~step_guard() { s_.in_step = false; }
  session& s_;
};

json run_journaled(session& s, std::string_view name, protocol::step_kind kind,
                   const std::function<json()>& fn, const retry_policy& policy) {
  step_guard guard(s);
  if (auto recorded = s.replay_next(name, kind)) {
    if (recorded->ok) return recorded->output;
    throw step_failed(recorded->name, recorded->error.type, recorded->error.message);
  }

  const std::uint64_t seq = s.take_seq();
  const std::int64_t timeout_ms = wire_ms(policy.timeout);
  const auto asked = retry_request_of(policy);
  for (int attempt = s.first_attempt_for(seq);;) {
    s.send(protocol::begin_msg{seq, std::string(name), kind, attempt, timeout_ms, asked});
    protocol::step_result r;
    r.seq = seq;
    r.name = std::string(name);
    r.kind = kind;
    r.attempt = attempt;
    bool terminal = false;
    auto started = clock::now();
    try {
      r.output = fn();
    } catch (const terminal_error& e) {
      r.ok = false;
      r.error = {e.what(), type_of(e)};
      terminal = true;
    } catch (const std::exception& e) {
      r.ok = false;
      r.error = {e.what(), type_of(e)};
    } catch (const nondeterminism&) {
      throw;
    } catch (...) {
      r.ok = false;
      r.error = {"a non-standard exception was thrown", "unknown"};
    }
    r.duration_us = std::chrono::duration_cast<std::chrono::microseconds>(clock::now() - started).count();

    auto retry = s.report(protocol::step_msg{r, terminal});
    if (!retry) {
      if (r.ok) return r.output;
      throw step_failed(r.name, r.error.type, r.error.message);
    }
    attempt = retry->attempt;
    s.pause(std::chrono::milliseconds(retry->delay_ms));
    if (s.cancel_reason()) throw cancelled_error(*s.cancel_reason());
  }
}

// An operation the host performs and journals (tool, sleep, wait, child,
// join): the journaled record on replay, else the host's answer to `request`.
template <class Request>
protocol::step_result host_operation(session& s, std::string_view name, protocol::step_kind kind,
                                     Request request) {
  step_guard guard(s);
  if (auto recorded = s.replay_next(name, kind)) return std::move(*recorded);
  const std::uint64_t seq = s.take_seq();
  return s.request(request(seq), seq);
}

// A field of a host-recorded output the SDK interprets; its absence means a broken host.
const json& output_field(const protocol::step_result& r, const char* field) {
  if (r.ok && r.output.is_object())
    if (auto it = r.output.find(field); it != r.output.end()) return *it;
  throw host_gone("the host's " + std::string(protocol::to_string(r.kind)) + " result for seq " +
                  std::to_string(r.seq) + " has no output field '" + field + "'");
}

}  // namespace

json context::run_step(std::string_view name, const std::function<json()>& fn, const retry_policy& policy) {
  return run_journaled(session_, name, protocol::step_kind::step, fn, policy);
}

json context::tool(std::string_view name, const json& args) {
  auto r = host_operation(session_, name, protocol::step_kind::tool, [&](std::uint64_t seq) {
    return protocol::tool_msg{seq, std::string(name), args};
  });
  if (r.ok) return r.output;
  throw tool_error(r.name, r.error.type, r.error.message);
}

void context::sleep(std::chrono::milliseconds d) {
  auto r = host_operation(session_, "sleep", protocol::step_kind::sleep, [&](std::uint64_t seq) {
    return protocol::sleep_msg{seq, wire_ms(d), std::nullopt};
  });
  output_field(r, "until_ms");  // only checked: a sleep returns nothing, but an error record is a broken host
}

void context::sleep_until(std::chrono::system_clock::time_point t) {
  auto r = host_operation(session_, "sleep", protocol::step_kind::sleep, [&](std::uint64_t seq) {
    // Saturates at 100 years from now, as sleep() does; floor() keeps a far time from overflowing.
    const auto now = std::chrono::floor<std::chrono::milliseconds>(std::chrono::system_clock::now());
    const auto latest = now + std::chrono::milliseconds(protocol::max_duration_ms);
    const auto until = std::min(std::chrono::floor<std::chrono::milliseconds>(t), latest);
    return protocol::sleep_msg{seq, std::nullopt, std::max<std::int64_t>(until.time_since_epoch().count(), 0)};
  });
  output_field(r, "until_ms");
}

std::optional<json> context::wait_signal(std::string_view name, std::optional<std::chrono::milliseconds> timeout) {
  auto r = host_operation(session_, name, protocol::step_kind::signal, [&](std::uint64_t seq) {
    std::optional<std::int64_t> timeout_ms;
    if (timeout && timeout->count() < protocol::max_duration_ms) timeout_ms = wire_ms(*timeout);  // longer: none
    return protocol::wait_msg{seq, std::string(name), timeout_ms};
  });
  if (output_field(r, "timed_out") == true) return std::nullopt;
  return output_field(r, "payload");
}

child_handle context::start_child(std::string_view agent, const json& input) {
  auto r = host_operation(session_, agent, protocol::step_kind::child, [&](std::uint64_t seq) {
    return protocol::child_msg{seq, std::string(agent), input};
  });
  if (!r.ok) throw child_error(std::string(agent), r.error.type, r.error.message);
  const json& run_id = output_field(r, "run_id");
  if (!run_id.is_string()) throw host_gone("the host's child result for seq " + std::to_string(r.seq) +
                                           " has a run_id that is not a string");
  return child_handle{run_id.get<std::string>()};
}

json context::join(const child_handle& child) {
  auto r = host_operation(session_, child.run_id, protocol::step_kind::join, [&](std::uint64_t seq) {
    return protocol::join_msg{seq, child.run_id};
  });
  if (r.ok) return r.output;
  throw child_failed(child.run_id, r.error.type, r.error.message);
}

bool context::cancelled() const {
  session_.poll();
  return session_.cancel_reason().has_value();
}

std::chrono::system_clock::time_point context::now() {
  json ms = run_journaled(session_, "ctx.now", protocol::step_kind::now, [] {
    return json(std::chrono::duration_cast<std::chrono::milliseconds>(
                    std::chrono::system_clock::now().time_since_epoch()).count());
  }, retry_policy::no_retry());
  return std::chrono::system_clock::time_point(std::chrono::milliseconds(ms.get<std::int64_t>()));
}

double context::random() {
  json v = run_journaled(session_, "ctx.random", protocol::step_kind::random, [] {
    return json(std::uniform_real_distribution<double>(0.0, 1.0)(random_engine()));
  }, retry_policy::no_retry());
  return v.get<double>();
}

bool context::patched(std::string_view id) {
  step_guard guard(session_);
  if (id.empty() || id.size() > protocol::max_name_size)
    throw std::invalid_argument("ctx.patched needs an id of 1 to 1024 bytes");
  if (auto replayed = session_.replay_patch(id)) return *replayed;
  protocol::step_result r;
  r.seq = session_.take_seq();
  r.name = std::string(id);
  r.kind = protocol::step_kind::patch;
  r.output = true;
  r.attempt = session_.first_attempt_for(r.seq);
  session_.report(protocol::step_msg{r, false});  // an ok step is acknowledged, never retried
  return true;
}

void context::emit(const json& data) {
  if (!session_.replaying()) session_.send(protocol::emit_msg{data});
}

const std::string& context::run_id() const { return session_.start().run_id; }
int context::attempt() const { return session_.start().attempt; }
bool context::replaying() const { return session_.replaying(); }

}  // namespace cairn
