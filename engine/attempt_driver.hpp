// The state machine behind run_attempt (attempt.hpp): talks to one agent,
// journals what it sends, holds short waits and suspends long ones, and
// watches limits, timeouts, cancellation and host shutdown. Private to the
// engine; attempt.cpp holds the conversation, attempt_waits.cpp the waits.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>

#include "engine/attempt.hpp"
#include "engine/history_feed.hpp"
#include "engine/io.hpp"
#include "engine/step_retry.hpp"
#include "engine/tool_broker.hpp"

namespace cairn::engine {

// The agent broke the protocol; the run fails.
struct violation {
  std::string message;
};

// The attempt is over with `result` (a limit, a timeout, a cancellation, a
// suspension, the host stopping); the sandbox has been killed.
struct attempt_end {
  attempt_result result;
};

class attempt_driver {
 public:
  attempt_driver(attempt_journal& journal, attempt_wakeups& events, const storage::run_record& run, const policy& p,
                 int attempt, const attempt_options& options, run_observer& observer);

  task<attempt_result> drive(runtime::sandbox_backend& backend);

 private:
  using step = task<std::optional<attempt_result>>;

  // The conversation, with its endings turned into results.
  task<attempt_result> converse_to_end(const protocol::start_msg& start);
  task<attempt_result> converse(const protocol::start_msg& start);
  step handle(const protocol::agent_message& message);

  step on(const protocol::hello_msg&);
  step on(const protocol::begin_msg& m);
  step on(const protocol::step_msg& m);
  step on(const protocol::tool_msg& m);
  step on(const protocol::history_msg& m);
  step on(const protocol::emit_msg& m);
  step on(const protocol::done_msg& m);
  step on(const protocol::fail_msg& m);
  // attempt_waits.cpp
  step on(const protocol::sleep_msg& m);
  step on(const protocol::wait_msg& m);
  step on(const protocol::child_msg& m);
  step on(const protocol::join_msg& m);

  // Checks everything that can end the attempt from outside the
  // conversation; throws attempt_end when one does. Re-reads the run row
  // (for a cancel) only after a wake-up: a cancel comes as one.
  task<void> supervise();
  // The earliest time supervise() has something to check: the limits, a
  // timeout, the run's deadline, the end of a cancel's grace period or of
  // the drain.
  clock::time_point next_deadline() const;
  // Consumes the wake-ups of the run; after one, supervise() re-reads it.
  // Callers take them before they look, so one that comes meanwhile is kept.
  void take_wakes();
  // Ends the attempt if the sandbox ran into a limit; reads them at most
  // once a second (died() asks too, when the agent dies).
  task<void> check_limits();
  task<void> start_cancel(std::string reason, bool timed_out);
  // Ends the attempt (throws attempt_end).
  task<void> step_timed_out();
  // Sends `message`, supervising while the agent is slow to read it (a
  // cancel that comes meanwhile is sent after it).
  task<void> send(const protocol::host_message& message);
  // send() and journal_.apply() for a message or an effect of one kind. GCC
  // 12 destroys twice a temporary that a co_await expression converts into
  // another one (a cancel_msg into a host_message): these take each kind as
  // itself, and convert it where it is a named value.
  template <class M>
  task<void> send_one(M message) {
    const protocol::host_message whole = std::move(message);
    co_await send(whole);
  }
  template <class E>
  task<void> apply_effect(E e) {
    effect whole = std::move(e);
    co_await journal_.apply(std::move(whole));
  }
  // The attempt of the step at expected_seq_, as the host counts it.
  int step_attempt() const { return step_failures_ + 1; }
  task<void> record_retry(effects::retry_due retry);
  // Whether the host retries the failed attempt `m`; if so, journals the retry and answers the agent with it.
  task<bool> retried(const protocol::step_msg& m);
  // Journals the step at expected_seq_ as failed for good, with the host's attempt count.
  task<void> commit_failure(const std::string& name, protocol::step_kind kind, const protocol::error_info& error,
                            std::int64_t duration_us);
  // Kills the sandbox and ends the attempt with `result` (throws attempt_end).
  task<void> end(attempt_result result);
  // Kills every process of the sandbox, off the event loop.
  task<void> kill();
  task<void> watch_workspace();
  attempt_result cancelled_result() const;
  bool stopping() const { return options_.stopping && options_.stopping->load(); }

  // Calls `finish` (which journals the step and answers the agent when it
  // can) at first and after each wake-up of the run or at wait.wake_at_ms;
  // suspends the run as `wait` once it has waited `max_hold`. Returns when
  // `finish` did, or when a cancel was sent.
  task<void> hold(const storage::wait_spec& wait, std::chrono::milliseconds max_hold,
                  const std::function<task<bool>()>& finish);
  // Journals a step the host decided (sleep, signal, child, join, timeout)
  // and sends it to the agent as the result of its request.
  task<void> record_and_answer(protocol::step_result r,
                               std::optional<effects::delivered_signal> signal = std::nullopt);

  // Makes the step durable (over the run's journal budget: budget_exceeded,
  // nothing written) and moves on to the next seq.
  task<void> commit(const storage::step_record& record,
                    std::optional<effects::delivered_signal> signal = std::nullopt);
  task<void> expect_clean_exit(std::string_view last);
  void check_seq(std::uint64_t seq, std::string_view what);
  // The next frame, or nullopt when `until` came first or (with
  // `or_wakeup`) a wake-up of the run did.
  task<std::optional<json>> receive(clock::time_point until, bool or_wakeup);
  std::optional<json> spin_receive();
  protocol::ack_msg ack_of(std::uint64_t seq) const;
  task<attempt_result> died(std::string how);
  task<attempt_result> exceeded(std::string message, std::string limit);
  std::string log_excerpt() const;
  // attempt_options::agent, or the run's agent path.
  std::filesystem::path program() const {
    return options_.agent.empty() ? std::filesystem::path(run_.agent) : options_.agent;
  }

  attempt_journal& journal_;
  const storage::run_record& run_;
  const policy& policy_;
  int attempt_;
  const attempt_options& options_;
  run_observer& observer_;
  tool_broker tools_;
  std::optional<start_slot> starting_;  // from the sandbox's making until the agent's hello
  std::unique_ptr<runtime::agent_process> process_;
  bool greeted_ = false;  // the agent said hello: its program started
  // The agent's channel and the run's wake-ups, as the event loop watches them.
  std::optional<watched_fd> channel_fd_, events_fd_;
  std::optional<history_feed> history_;
  std::mt19937_64 rng_{std::random_device{}()};  // jitters retry delays
  attempt_wakeups& events_;
  bool recheck_run_ = true;  // at first too: a cancel may have come before events_ listened
  clock::time_point started_, last_limits_check_;
  std::uint64_t expected_seq_ = 0;
  std::uint64_t receives_ = 0;
  std::chrono::microseconds spin_{100};
  // Failed attempts of the step at expected_seq_: step_retry events, counted
  // by the host and capped by retry.step_attempts, whatever the agent says.
  int step_failures_ = 0;
  // A frame is on its way to the agent; a cancel waits for it.
  bool sending_ = false, cancel_unsent_ = false;
  std::optional<std::int64_t> begun_at_ms_;
  // The step the agent is executing (begin seen, no step yet).
  std::optional<protocol::begin_msg> in_step_;
  // The workspace's checkpoints (workspace_checkpoints.hpp); none when the
  // policy keeps none or the journal has no place for them.
  std::unique_ptr<workspace_keeper> checkpoints_;
  clock::time_point step_started_;
  // Cancellation: sent to the agent, and when the grace period ends.
  bool cancel_sent_ = false, timed_out_ = false;
  std::string cancel_reason_;
  clock::time_point cancel_deadline_;
  std::optional<clock::time_point> drain_deadline_;
};

}  // namespace cairn::engine
