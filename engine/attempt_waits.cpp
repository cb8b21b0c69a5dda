// The waits an agent asks the host for: timers, signals, child runs and
// joins. Each is journaled as a step of its own kind once it is over; until
// then the host holds it (a short wait keeps the sandbox) or suspends the run.
//
// A timer's wake time and a signal wait's deadline are recorded on first
// sight (timer_set, wait_started) so that a replayed request keeps them.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <system_error>

#include <fmt/chrono.h>
#include <fmt/format.h>

#include "engine/attempt_driver.hpp"
#include "engine/io.hpp"
#include "engine/effects.hpp"
#include "runtime/crash_point.hpp"

namespace cairn::engine {
namespace {

using namespace std::chrono_literals;
using kind = attempt_result::kind;

std::string format_ms(std::int64_t ms) {
  return fmt::format("{:%Y-%m-%d %H:%M:%S} UTC", fmt::gmtime(static_cast<std::time_t>(ms / 1000)));
}

// Whether a `child` step of the run's own journal before `before` started
// run `child_id`: a fork's journal holds the child steps of the run it came
// from, whose children it shares (engine::fork).
bool journaled_child(attempt_journal& journal, const std::string& child_id, std::uint64_t before) {
  for (std::uint64_t next = 0; next < before;) {
    const auto chunk = journal.history(next, before, 4 << 20);
    if (chunk.empty()) return false;
    for (const auto& step : chunk) {
      if (step.kind == protocol::step_kind::child && step.ok && step.output.is_object() &&
          step.output.value("run_id", "") == child_id)
        return true;
      next = step.seq + 1;
    }
  }
  return false;
}

}  // namespace

task<void> attempt_driver::record_and_answer(protocol::step_result r,
                                             std::optional<effects::delivered_signal> signal) {
  storage::step_record record;
  record.run_id = run_.id;
  record.started_at_ms = storage::now_ms();
  record.finished_at_ms = record.started_at_ms;
  record.result = std::move(r);
  co_await commit(record, std::move(signal));
  co_await send_one(protocol::result_msg{record.result});
  runtime::crash_point("after_ack");
  observer_.on_step(record);
}

task<void> attempt_driver::hold(const storage::wait_spec& wait, std::chrono::milliseconds max_hold,
                                const std::function<task<bool>()>& finish) {
  const auto give_up = clock::now() + max_hold;
  // The agent sends nothing while it waits: its channel is watched for its
  // closing, unless bytes the agent had no reason to send sit in it.
  bool channel_quiet = true;
  for (;;) {
    take_wakes();
    const bool finished = co_await finish();
    if (finished) co_return;
    // Before supervise(), which hands back a run that is between steps: a waiting one is suspended.
    if (stopping()) co_await end({kind::suspended, nullptr, {}, wait});
    co_await supervise();
    if (cancel_sent_) co_return;  // the agent hears cancel instead of an answer
    if (process_->poll_exit()) throw runtime::channel_closed("the agent ended while it waited", false);
    if (clock::now() >= give_up) co_await end({kind::suspended, nullptr, {}, wait});
    auto until = std::min(give_up, next_deadline());
    if (wait.wake_at_ms)
      until = std::min(until, clock::now() + std::chrono::milliseconds(*wait.wake_at_ms - storage::now_ms()));
    const auto woken = co_await wait_any(*events_fd_, asio::posix::descriptor_base::wait_read,
                                         channel_quiet ? &*channel_fd_ : nullptr, until);
    if (woken == woken_by::second) {
      if (process_->io().peer_closed()) throw runtime::channel_closed("the agent ended while it waited", false);
      channel_quiet = false;
    }
  }
}

attempt_driver::step attempt_driver::on(const protocol::sleep_msg& m) {
  check_seq(m.seq, "sleep");
  if (cancel_sent_) co_return std::nullopt;
  std::int64_t until = 0;
  if (auto set = journal_.timer_at(m.seq)) {
    until = set->until_ms;
  } else {
    const auto now = storage::now_ms();
    // Durations are bounded on the wire; a time is bounded here, against the host's clock.
    if (m.until_ms && *m.until_ms - now > protocol::max_duration_ms)
      throw violation{fmt::format("a sleep until {} ms since the epoch, more than 100 years ahead", *m.until_ms)};
    until = m.until_ms ? *m.until_ms : now + std::max<std::int64_t>(*m.duration_ms, 0);
    const bool in_past = m.until_ms ? *m.until_ms < now : *m.duration_ms < 0;
    co_await apply_effect(effects::timer_set{m.seq, until, in_past});
    if (in_past)
      observer_.on_warning(fmt::format("run {}: the timer at step {} was set for {}, which is in the past; it "
                                       "fires now",
                                       run_.id, m.seq, format_ms(until)));
  }
  auto fire = [&]() -> task<bool> {
    const auto now = storage::now_ms();
    if (!timer_due(now, until)) co_return false;
    protocol::step_result r;
    r.seq = m.seq;
    r.name = "sleep";
    r.kind = protocol::step_kind::sleep;
    r.output = {{"until_ms", until}, {"fired_at_ms", now}};
    co_await record_and_answer(std::move(r));
    co_return true;
  };
  // A timer further off than suspend_after suspends the run at once.
  const bool long_wait = until - storage::now_ms() > options_.suspend_after.count();
  co_await hold({"timer", "", m.seq, until},
                long_wait ? 0ms : std::chrono::milliseconds(std::chrono::hours(24 * 365)), fire);
  co_return std::nullopt;
}

attempt_driver::step attempt_driver::on(const protocol::wait_msg& m) {
  check_seq(m.seq, "wait");
  if (m.signal.empty() || m.signal.size() > protocol::max_name_size)
    throw violation{"a wait for a signal with an empty or over-long name"};
  if (cancel_sent_) co_return std::nullopt;
  std::optional<std::int64_t> deadline;
  if (auto started = journal_.wait_at(m.seq)) {
    deadline = started->deadline_ms;
  } else {
    if (m.timeout_ms) deadline = storage::now_ms() + std::max<std::int64_t>(*m.timeout_ms, 0);
    co_await apply_effect(effects::wait_started{m.seq, m.signal, deadline});
  }
  auto deliver = [&]() -> task<bool> {
    protocol::step_result r;
    r.seq = m.seq;
    r.name = m.signal;
    r.kind = protocol::step_kind::signal;
    if (auto sig = journal_.pending_signal(m.signal)) {
      r.output = {{"signal", m.signal}, {"timed_out", false}, {"payload", sig->payload}};
      co_await record_and_answer(std::move(r), effects::delivered_signal{sig->id, sig->name});
      co_return true;
    }
    if (deadline && storage::now_ms() >= *deadline) {
      r.output = {{"signal", m.signal}, {"timed_out", true}};
      co_await record_and_answer(std::move(r));
      co_return true;
    }
    co_return false;
  };
  co_await hold({"signal", m.signal, m.seq, deadline}, options_.suspend_after, deliver);
  co_return std::nullopt;
}

attempt_driver::step attempt_driver::on(const protocol::child_msg& m) {
  check_seq(m.seq, "child");
  if (cancel_sent_) co_return std::nullopt;
  protocol::step_result r;
  r.seq = m.seq;
  r.name = m.agent;
  r.kind = protocol::step_kind::child;
  auto refuse = [&](std::string type, std::string message) -> step {
    r.ok = false;
    r.error = {std::move(message), std::move(type)};
    co_await record_and_answer(std::move(r));
    co_return std::nullopt;
  };

  namespace fs = std::filesystem;
  // A script's child is of its version, looked for in the kept copy of its
  // folder; a compiled agent's copy holds it alone, and its children stay beside it.
  const fs::path folder =
      runtime::script_folder(program()).empty() ? fs::path(run_.agent).parent_path() : program().parent_path();
  fs::path program;
  if (m.agent.empty() || m.agent.size() > protocol::max_name_size)
    co_return co_await refuse("no_such_agent", "a child agent needs a name");
  if (m.agent.find('/') == std::string::npos) {
    program = folder / m.agent;
  } else {
    program = (folder / m.agent).lexically_normal();
    const auto& allowed = policy_.children.agents;
    if (std::find(allowed.begin(), allowed.end(), program.string()) == allowed.end())
      co_return co_await refuse("refused", fmt::format("child agent '{}' is neither in this agent's folder ({}) nor listed in "
                                           "the policy's children.agents",
                                           m.agent, folder.string()));
  }
  std::error_code ec;
  if (!fs::is_regular_file(program, ec) || ::access(program.c_str(), X_OK) != 0)
    co_return co_await refuse("no_such_agent", fmt::format("there is no agent program '{}' ({} is not an executable file)",
                                               m.agent, program.string()));
  storage::new_run child;
  child.id = fmt::format("{}.{}", run_.id, m.seq);
  child.agent = program.string();
  child.input = m.input;
  child.max_attempts = run_.max_attempts;
  child.sandbox = run_.sandbox;
  child.policy = run_.policy;  // the root's, down the tree: a child cannot raise a bound
  child.parent_id = run_.id;
  child.deadline_ms = run_.deadline_ms;  // the root's too
  if (!child.deadline_ms && policy_.run_bound().count() > 0)
    child.deadline_ms = storage::now_ms() + std::chrono::milliseconds(policy_.run_bound()).count();
  const std::string id = child.id;
  // A replay after a crash finds the same id: created once.
  const auto refused = co_await journal_.start_child(std::move(child), policy_);
  if (refused) co_return co_await refuse("refused", *refused);
  runtime::crash_point("child_created");
  r.output = {{"run_id", id}};
  co_await record_and_answer(std::move(r));
  co_return std::nullopt;
}

attempt_driver::step attempt_driver::on(const protocol::join_msg& m) {
  check_seq(m.seq, "join");
  if (cancel_sent_) co_return std::nullopt;
  protocol::step_result r;
  r.seq = m.seq;
  r.name = m.run_id;
  r.kind = protocol::step_kind::join;
  auto child = journal_.find_run(m.run_id);
  // Another run's outcome is not this agent's to wait for or read, unless
  // its journal started that run (a fork's does).
  if (!child || (child->parent_id != run_.id && !journaled_child(journal_, m.run_id, m.seq)))
    throw violation{fmt::format("a join of run '{}', which is not a child of run {}", m.run_id, run_.id)};
  auto joined = [&]() -> task<bool> {
    auto c = journal_.find_run(m.run_id);
    if (!c || !is_finished(c->status)) co_return false;
    if (c->status == storage::run_status::completed) {
      r.output = c->output;
    } else {
      r.ok = false;
      const std::string why = c->error ? c->error->message : "no reason recorded";
      r.error = c->status == storage::run_status::cancelled
                    ? protocol::error_info{why, "child_cancelled"}
                    : protocol::error_info{why, "child_failed"};
    }
    co_await record_and_answer(std::move(r));
    co_return true;
  };
  co_await hold({"child", m.run_id, m.seq, std::nullopt}, options_.suspend_after, joined);
  co_return std::nullopt;
}

}  // namespace cairn::engine
