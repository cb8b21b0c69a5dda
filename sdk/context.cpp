#include <cxxabi.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <thread>
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

std::chrono::milliseconds delay_after(const retry_policy& p, int attempt) {
  double ms = static_cast<double>(p.initial_delay.count()) * std::pow(p.multiplier, attempt - 1);
  ms = std::min(ms, static_cast<double>(p.max_delay.count()));
  return std::chrono::milliseconds(static_cast<std::int64_t>(std::max(ms, 0.0)));
}

// Clears session::in_step however the step ends.
struct step_guard {
  explicit step_guard(session& s) : s_(s) {
    if (s_.in_step) throw std::logic_error("ctx.step and ctx.tool cannot be called inside a step");
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
  const int max_attempts = std::max(policy.max_attempts, 1);
  for (int attempt = s.first_attempt_for(seq);; ++attempt) {
    s.send(protocol::begin_msg{seq, std::string(name), kind, attempt});
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

    if (r.ok || terminal || attempt >= max_attempts) {
      s.send_and_wait_ack(protocol::step_msg{r}, seq);
      if (r.ok) return r.output;
      throw step_failed(r.name, r.error.type, r.error.message);
    }
    auto delay = delay_after(policy, attempt);
    s.send_and_wait_ack(protocol::retry_msg{seq, r.name, attempt, r.error, delay.count()}, seq);
    std::this_thread::sleep_for(delay);
  }
}

}  // namespace

json context::run_step(std::string_view name, const std::function<json()>& fn, const retry_policy& policy) {
  return run_journaled(session_, name, protocol::step_kind::step, fn, policy);
}

json context::tool(std::string_view name, const json& args) {
  step_guard guard(session_);
  auto r = session_.replay_next(name, protocol::step_kind::tool);
  if (!r) r = session_.call_tool(protocol::tool_msg{session_.take_seq(), std::string(name), args});
  if (r->ok) return r->output;
  throw tool_error(r->name, r->error.type, r->error.message);
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
    static std::mt19937_64 engine{std::random_device{}()};
    return json(std::uniform_real_distribution<double>(0.0, 1.0)(engine));
  }, retry_policy::no_retry());
  return v.get<double>();
}

void context::emit(const json& data) {
  if (!session_.replaying()) session_.send(protocol::emit_msg{data});
}

const std::string& context::run_id() const { return session_.start().run_id; }
int context::attempt() const { return session_.start().attempt; }
bool context::replaying() const { return session_.replaying(); }

}  // namespace cairn
