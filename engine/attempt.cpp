#include "engine/attempt.hpp"

#include <sched.h>

#include <atomic>

#include <boost/asio/this_coro.hpp>
#include <fmt/format.h>

#include "engine/attempt_driver.hpp"
#include "protocol/version.hpp"
#include "runtime/crash_point.hpp"
#include "protocol/bounded_json.hpp"

namespace cairn::engine {
namespace {

using namespace std::chrono_literals;
using kind = attempt_result::kind;

attempt_result failed(std::string message, std::string type) {
  return {kind::failed, nullptr, {std::move(message), std::move(type)}, {}};
}

// How often a live sandbox's limits are read; see check_limits().
constexpr auto limits_period = std::chrono::seconds(1);

attempt_result crashed(std::string message) { return {kind::crashed, nullptr, {std::move(message), "crash"}, {}}; }

std::chrono::milliseconds timeout_of(const protocol::begin_msg& step, const policy& p) {
  return step.timeout_ms > 0 ? std::chrono::milliseconds(step.timeout_ms) : std::chrono::milliseconds(p.timeouts.step);
}

// The longest look for a frame before sleeping; see spin_receive().
constexpr auto full_spin = std::chrono::microseconds(100);

// Counts an attempt in `count` (live_attempts, begun_attempts) for as long as it lives.
class counted {
 public:
  explicit counted(std::atomic<int>& count) : count_(count) { ++count_; }
  ~counted() { --count_; }
  counted(const counted&) = delete;
  counted& operator=(const counted&) = delete;

 private:
  std::atomic<int>& count_;
};

// Raises a flag for as long as it lives.
class raised {
 public:
  explicit raised(bool& flag) : flag_(flag) { flag_ = true; }
  ~raised() { flag_ = false; }
  raised(const raised&) = delete;
  raised& operator=(const raised&) = delete;

 private:
  bool& flag_;
};

}  // namespace

attempt_driver::attempt_driver(attempt_journal& journal, attempt_wakeups& events, const storage::run_record& run,
                               const policy& p, int attempt, const attempt_options& options,
                               run_observer& observer)
    : journal_(journal),
      run_(run),
      policy_(p),
      attempt_(attempt),
      options_(options),
      observer_(observer),
      tools_(run.id, p, options.llm, p.llm_chat && p.llm_chat->max_total_tokens > 0 ? journal.llm_tokens_spent() : 0,
             [this](const json& event) { observer_.on_emit(event); }),
      events_(events) {}

task<attempt_result> attempt_driver::drive(runtime::sandbox_backend& backend) {
  counted begun(begun_attempts);
  protocol::start_msg start;
  start.run_id = run_.id;
  start.input = run_.input;
  start.attempt = attempt_;
  start.host = "cairn/" + std::string(protocol::cairn_version());
  start.history_steps = journal_.step_count();
  history_.emplace(journal_, start.history_steps);
  expected_seq_ = start.history_steps;
  step_failures_ = journal_.step_failures(expected_seq_);
  start.next_step_attempt = step_attempt();

  runtime::sandbox_spec spec;
  spec.run_id = run_.id;
  spec.workspace = run_.workspace;
  spec.limits = policy_.limits;
  // workspace_mb 0 asks for no quota: the plain folder, no image.
  if (policy_.limits.max_workspace_bytes > 0) spec.workspace_image = options_.workspace_image;
  spec.log_file = options_.log_file;
  spec.app_folder = runtime::script_folder(program());
  spec.private_paths = options_.private_paths;
  spec.agent = program();
  // Made, and later taken down, off the event loop: mounts, cgroups, fork and exec.
  starting_.emplace(co_await start_slot::take());
  const auto asked = clock::now();
  // One trip to a start thread makes the sandbox and starts the agent; only
  // a sandbox with warnings, which are journaled before its agent starts,
  // takes two.
  std::shared_ptr<runtime::sandbox> box;
  std::vector<std::string> warnings;
  process_ = co_await offload(
      [&]() -> std::unique_ptr<runtime::agent_process> {
        box = backend.create(spec);
        warnings = box->warnings();
        return warnings.empty() ? box->exec(program(), {}) : nullptr;
      },
      pool::starts);
  observer_.on_sandbox(run_.id, box->pooled(), box->agent_started(),
                       std::chrono::duration_cast<std::chrono::microseconds>(clock::now() - asked));
  for (const auto& warning : warnings) {
    co_await apply_effect(effects::sandbox_warning{warning});
    observer_.on_warning(warning);
  }
  if (!process_) process_ = co_await offload([&] { return box->exec(program(), {}); }, pool::starts);
  co_await watch_workspace();
  events_.watch_process(process_->pid());
  const auto executor = co_await asio::this_coro::executor;
  channel_fd_.emplace(executor, process_->io().fd());
  events_fd_.emplace(executor, events_.fd());
  started_ = clock::now();
  // The counters were read as the agent started (its baseline): the first
  // look is a period later, not on the first frame's way to its ack.
  last_limits_check_ = started_;
  runtime::crash_point("after_spawn");

  auto result = co_await [&]() -> task<attempt_result> {
    counted live(live_attempts);
    co_return co_await converse_to_end(start);
  }();
  // Its descriptors are on the workspace's mount: they go before the
  // sandbox does, or the unmount waits for them and then leaves the image
  // held by a detached mount that the next attempt, here or on another
  // worker, finds locked.
  checkpoints_.reset();
  // The attempt that ends its run releases the workspace from its own
  // sandbox, whose image is still mounted: end_run then finds it released.
  // Only while this process still holds the run (a run taken over has
  // another owner's workspace); what fails here, end_run tries again and tells.
  if (result.outcome == kind::completed || result.outcome == kind::failed || result.outcome == kind::cancelled) {
    co_await journal_.confirm_held();
    try {
      co_await offload([&] { box->destroy_ending_run(); }, pool::teardown);
    } catch (const runtime::sandbox_error&) {
    }
  }
  co_await offload([&] { box.reset(); }, pool::teardown);
  co_return result;
}

// Before the agent is told to start (it waits for that): the workspace is
// watched, and after a crash what the attempt before wrote past its last
// step is put back as that step left it.
task<void> attempt_driver::watch_workspace() {
  auto watch = co_await journal_.watch_workspace(run_, policy_);
  checkpoints_ = std::move(watch.keeper);
  std::string warning = std::move(watch.warning);
  if (watch.baseline) {
    try {
      co_await apply_effect(effects::workspace_baseline{std::move(*watch.baseline)});
    } catch (const budget_exceeded& e) {
      checkpoints_.reset();
      warning = fmt::format("this attempt keeps no workspace checkpoints: {}", e.message);
    }
  }
  if (!warning.empty()) {
    co_await apply_effect(effects::sandbox_warning{warning});
    observer_.on_warning(warning);
  }
}

task<attempt_result> attempt_driver::converse_to_end(const protocol::start_msg& start) {
  // No co_await in a handler: each says what follows.
  std::optional<attempt_result> result;
  std::optional<std::string> closed;
  std::optional<budget_exceeded> over;
  bool killed = false;  // the attempt ended itself, its sandbox killed
  std::exception_ptr lost;  // the journal refused a write: another process took the run over
  try {
    result = co_await converse(start);
    killed = true;
  } catch (const violation& v) {
    result = failed("the agent broke the protocol: " + v.message, "protocol");
  } catch (const protocol::protocol_error& e) {
    result = failed(std::string("the agent sent a malformed frame: ") + e.what(), "protocol");
  } catch (const runtime::channel_closed& e) {
    closed = e.truncated() ? "closed its channel in the middle of a frame" : "closed its channel";
  } catch (const attempt_end& end) {
    result = end.result;
    killed = true;
  } catch (const budget_exceeded& e) {
    over = e;
  } catch (const storage::storage_error& e) {
    if (e.code() != storage::errc::fenced) throw;
    lost = std::current_exception();
  }
  if (lost) {
    // Nothing more is written for this run here: the sandbox goes at once, no retry.
    co_await kill();
    std::rethrow_exception(lost);
  }
  if (closed) co_return co_await died(*closed);
  if (!killed) co_await kill();
  if (over) co_return co_await exceeded(over->message, over->limit);
  co_return *result;
}

task<attempt_result> attempt_driver::converse(const protocol::start_msg& start) {
  auto first = co_await receive(clock::now() + options_.hello_timeout, false);
  starting_.reset();
  if (!first) {
    co_await kill();
    co_return crashed("the agent did not say hello within " + std::to_string(options_.hello_timeout.count()) +
                      " ms" + log_excerpt());
  }
  const auto hello_message = protocol::parse_agent_message(*first);
  auto* hello = std::get_if<protocol::hello_msg>(&hello_message);
  if (!hello) throw violation{"the first message must be hello, got " + std::string(type_name(hello_message))};
  greeted_ = true;
  if (hello->version != protocol::version) {
    std::string why = "the agent speaks protocol v" + std::to_string(hello->version) + " (" + hello->sdk +
                      "); this host speaks v" + std::to_string(protocol::version);
    co_await send_one(protocol::reject_msg{why});
    co_await kill();
    co_return failed(why, "protocol");
  }
  co_await send(start);
  runtime::crash_point("after_hello");

  for (;;) {
    auto frame = co_await receive(next_deadline(), true);
    take_wakes();
    co_await supervise();
    if (!frame) {
      if (!process_->poll_exit()) continue;
      // It ended: all it wrote is readable now, up to its channel's end (a
      // frame cut short there throws channel_closed).
      frame = process_->io().try_receive();
      if (!frame) co_return co_await died("ended");
    }
    const auto message = protocol::parse_agent_message(*frame);
    auto result = co_await handle(message);
    if (result) co_return *result;
  }
}

task<void> attempt_driver::end(attempt_result result) {
  co_await kill();
  throw attempt_end{std::move(result)};
}

task<void> attempt_driver::kill() {
  co_await offload([this] { process_->kill(); }, pool::teardown);
}

void attempt_driver::take_wakes() {
  if (events_.take()) recheck_run_ = true;
}

// The kernel holds memory and processes at their limits whether or not we
// look (the OOM killer, a refused fork), RLIMIT_CPU each process's CPU, and a
// full workspace refuses writes: looking only ends the attempt and tells the
// run why, so once a second is enough. It cannot wait for a frame or the
// agent's death: a bomb that hits a limit may leave the agent silent for good.
task<void> attempt_driver::check_limits() {
  const auto now = clock::now();
  if (now - last_limits_check_ < limits_period) co_return;
  last_limits_check_ = now;
  auto breach = process_->check_limits();
  if (!breach) co_return;
  auto result = co_await exceeded(breach->message, breach->limit);
  throw attempt_end{std::move(result)};
}

clock::time_point attempt_driver::next_deadline() const {
  auto next = last_limits_check_ + limits_period;
  if (policy_.wall_time.count() > 0) next = std::min(next, started_ + policy_.wall_time);
  if (in_step_) {
    auto timeout = timeout_of(*in_step_, policy_);
    if (timeout.count() > 0) next = std::min(next, step_started_ + timeout);
  }
  if (cancel_sent_) next = std::min(next, cancel_deadline_);
  else if (run_.deadline_ms)
    next = std::min(next, clock::now() + std::chrono::milliseconds(*run_.deadline_ms - storage::now_ms()));
  if (drain_deadline_) next = std::min(next, *drain_deadline_);
  return next;
}

task<void> attempt_driver::supervise() {
  co_await check_limits();
  const auto now = clock::now();
  if (policy_.wall_time.count() > 0 && now - started_ > policy_.wall_time) {
    auto result = co_await exceeded(fmt::format("wall-clock limit exceeded: the attempt ran longer than {} s "
                                                "(limits.wall_seconds in the policy)",
                                                policy_.wall_time.count()),
                                    "wall_time");
    co_await end(std::move(result));
  }
  if (in_step_) {
    auto timeout = timeout_of(*in_step_, policy_);
    if (timeout.count() > 0 && now - step_started_ > timeout) co_await step_timed_out();
  }
  if (std::exchange(recheck_run_, false)) {
    // A wake-up may say this host lost the run (its worker's lease expired
    // and another took it over): then the fence throws, and the attempt
    // stops before anything else happens.
    co_await journal_.confirm_held();
    if (!cancel_sent_)
      if (auto reason = journal_.cancel_requested()) co_await start_cancel(*reason, false);
  }
  if (!cancel_sent_ && run_.deadline_ms && storage::now_ms() >= *run_.deadline_ms) {
    auto [message, type] = policy_.deadline_passed();
    if (type == "limit_exceeded") {
      auto result = co_await exceeded(message, "run_wall_time");
      co_await end(std::move(result));
    }
    co_await start_cancel(message, true);
  }
  if (cancel_sent_ && now >= cancel_deadline_) co_await end(cancelled_result());
  if (stopping() && !cancel_sent_) {
    if (!in_step_) co_await end({kind::released, nullptr, {}, {}});
    if (!drain_deadline_) drain_deadline_ = now + options_.drain;
    if (now >= *drain_deadline_) co_await end({kind::released, nullptr, {}, {}});
  }
}

task<void> attempt_driver::start_cancel(std::string reason, bool timed_out) {
  cancel_sent_ = true;
  timed_out_ = timed_out;
  cancel_reason_ = std::move(reason);
  cancel_deadline_ = clock::now() + std::chrono::seconds(policy_.timeouts.cancel_grace);
  co_await apply_effect(effects::cancel_sent{cancel_reason_, policy_.timeouts.cancel_grace.count()});
  // Frames must not interleave: send() sends the cancel once the frame in flight is out.
  if (sending_) {
    cancel_unsent_ = true;
    co_return;
  }
  bool gone = false;
  try {
    co_await send_one(protocol::cancel_msg{cancel_reason_});
  } catch (const attempt_end&) {
    throw;
  } catch (const std::exception&) {
    gone = true;  // the agent is gone already
  }
  if (gone) co_await end(cancelled_result());
}

attempt_result attempt_driver::cancelled_result() const {
  if (timed_out_) return failed(cancel_reason_, "timeout");
  return {kind::cancelled, nullptr, {cancel_reason_, "cancelled"}, {}};
}

task<void> attempt_driver::step_timed_out() {
  const auto step = *in_step_;
  const auto timeout = timeout_of(step, policy_);
  co_await kill();
  protocol::error_info error{fmt::format("step '{}' timed out after {} ms; its sandbox was killed", step.name,
                                         timeout.count()),
                             "timeout"};
  // The next sandbox makes the next attempt, after the engine's restart backoff.
  if (decide_step_retry(policy_, step.retry, step_failures_, false, rng_).retry)
    co_await record_retry({step.seq, step.name, step_attempt(), error, 0});
  else
    co_await commit_failure(step.name, step.kind, error,
                            std::chrono::duration_cast<std::chrono::microseconds>(timeout).count());
  throw attempt_end{{kind::restart, nullptr, error, {}}};
}

task<void> attempt_driver::send(const protocol::host_message& message) {
  {
    raised in_flight(sending_);
    auto& io = process_->io();
    const std::string frame = io.frame_of(protocol::to_json(message));
    // One deadline for the whole frame: a peer that reads a little at a time gets no more.
    const auto deadline = clock::now() + runtime::channel::send_timeout;
    for (std::size_t sent = io.send_some(frame, 0); sent < frame.size(); sent = io.send_some(frame, sent)) {
      take_wakes();
      co_await supervise();
      // Its channel may outlive it (held by what it started): nothing would read on.
      if (process_->poll_exit()) throw runtime::channel_closed("the agent ended while a frame was on its way", false);
      if (clock::now() >= deadline)
        throw runtime::channel_closed(fmt::format("the agent did not read a frame of {} bytes within {} ms",
                                                  frame.size(), runtime::channel::send_timeout.count()),
                                      false);
      co_await wait_any(*channel_fd_, asio::posix::descriptor_base::wait_write, &*events_fd_,
                        std::min(deadline, next_deadline()));
    }
  }
  if (cancel_unsent_) {
    cancel_unsent_ = false;
    co_await send_one(protocol::cancel_msg{cancel_reason_});
  }
}

task<void> attempt_driver::record_retry(effects::retry_due retry) {
  retry.attempt = step_attempt();
  co_await apply_effect(retry);
  ++step_failures_;
  observer_.on_retry(retry);
}

task<void> attempt_driver::commit_failure(const std::string& name, protocol::step_kind kind,
                                          const protocol::error_info& error, std::int64_t duration_us) {
  storage::step_record record;
  record.run_id = run_.id;
  record.result.seq = expected_seq_;
  record.result.name = name;
  record.result.kind = kind;
  record.result.ok = false;
  record.result.error = error;
  record.result.attempt = step_attempt();
  record.result.duration_us = duration_us;
  record.started_at_ms = begun_at_ms_.value_or(storage::now_ms());
  record.finished_at_ms = storage::now_ms();
  co_await commit(record);
  observer_.on_step(record);
}

task<attempt_result> attempt_driver::exceeded(std::string message, std::string limit) {
  co_await apply_effect(effects::limit_exceeded{limit, message});
  co_return failed(message, "limit_exceeded");
}

attempt_driver::step attempt_driver::handle(const protocol::agent_message& message) {
  return std::visit([this](const auto& m) { return on(m); }, message);
}

attempt_driver::step attempt_driver::on(const protocol::hello_msg&) {
  throw violation{"a second hello"};
  co_return std::nullopt;
}

attempt_driver::step attempt_driver::on(const protocol::begin_msg& m) {
  check_seq(m.seq, "begin");
  if (protocol::host_recorded(m.kind))
    throw violation{"a begin of kind " + std::string(protocol::to_string(m.kind)) +
                    ": the agent asks for those with their own messages"};
  if (m.kind == protocol::step_kind::patch) throw violation{"a begin of kind patch: a patch marker is one step alone"};
  begun_at_ms_ = storage::now_ms();
  in_step_ = m;
  step_started_ = clock::now();
  co_return std::nullopt;
}

attempt_driver::step attempt_driver::on(const protocol::step_msg& m) {
  check_seq(m.result.seq, "step");
  if (protocol::host_recorded(m.result.kind))
    throw violation{"a step of kind " + std::string(protocol::to_string(m.result.kind)) +
                    ": only the host records those"};
  // A marker is true or absent (PROTOCOL.md §4.1): anything else would replay as a branch no code took.
  if (m.result.kind == protocol::step_kind::patch && !(m.result.ok && m.result.output == true))
    throw violation{"a patch marker that is not status ok with output true"};
  // Deeper, it would be journaled and then break every replay of the run.
  if (protocol::nesting_depth(m.result.output) > protocol::max_output_depth)
    throw violation{fmt::format("the output of step {} nests deeper than {} levels, which a replay could not carry",
                                m.result.seq, protocol::max_output_depth)};
  if (!m.result.ok) {
    const bool retry = co_await retried(m);
    if (retry) co_return std::nullopt;
  }
  storage::step_record record;
  record.run_id = run_.id;
  record.result = m.result;
  record.result.attempt = step_attempt();
  record.finished_at_ms = storage::now_ms();
  record.started_at_ms = begun_at_ms_.value_or(record.finished_at_ms - m.result.duration_us / 1000);
#ifdef CAIRN_TEST_UNSAFE_EARLY_ACK  // cairn_unsafe_early_ack, with which ack_order_test must fail
  co_await send_one(ack_of(m.result.seq));
#endif
  co_await commit(record);
  // Shutting down: the step is durable; stop the agent before an ack lets it begin the next one.
  if (stopping() && !cancel_sent_) {
    observer_.on_step(record);
    co_await end({kind::released, nullptr, {}, {}});
  }
#ifndef CAIRN_TEST_UNSAFE_EARLY_ACK
  co_await send_one(ack_of(m.result.seq));
#endif
  runtime::crash_point("after_ack");
  observer_.on_step(record);
  co_return std::nullopt;
}

// The host calls the tool, journals the outcome, then answers.
attempt_driver::step attempt_driver::on(const protocol::tool_msg& m) {
  check_seq(m.seq, "tool");
  storage::step_record record;
  record.run_id = run_.id;
  record.started_at_ms = storage::now_ms();
  auto prepared = tools_.prepare(m);
  if (auto* refused = std::get_if<protocol::step_result>(&prepared)) {
    record.result = std::move(*refused);
  } else {
    const int previous = journal_.tool_attempts(m.seq);
    co_await apply_effect(std::get<effects::tool_started>(prepared));
    record.result = co_await offload([&] { return tools_.perform(m, previous); }, pool::tools);
  }
  record.finished_at_ms = storage::now_ms();
  co_await commit(record);
  co_await send_one(protocol::result_msg{record.result});
  runtime::crash_point("after_ack");
  observer_.on_step(record);
  co_return std::nullopt;
}

// An attempt alone in its process, with no other sandbox on its way up,
// says so: its agent may then poll for the next answer rather than sleep
// (PROTOCOL.md §3.3), as spin_receive() does for the agent's next frame,
// taking the CPU of no other run here.
protocol::ack_msg attempt_driver::ack_of(std::uint64_t seq) const {
  return {seq, begun_attempts.load(std::memory_order_relaxed) == 1};
}

// The answer to the agent goes out only after this returns: the row is durable.
task<void> attempt_driver::commit(const storage::step_record& record,
                                  std::optional<effects::delivered_signal> signal) {
  std::optional<workspace_checkpoint> checkpoint;
  if (checkpoints_) checkpoint = co_await offload([&] { return checkpoints_->take(); }, pool::tools);
  runtime::crash_point("before_commit");
  co_await apply_effect(effects::step_committed{record, std::move(signal), 0, std::move(checkpoint)});
  runtime::crash_point("after_commit");
  ++expected_seq_;
  step_failures_ = 0;
  begun_at_ms_.reset();
  in_step_.reset();
}

task<bool> attempt_driver::retried(const protocol::step_msg& m) {
  // Without a begin the agent asked for no retries.
  const auto asked = in_step_ ? in_step_->retry : protocol::retry_request{};
  const auto decision = decide_step_retry(policy_, asked, step_failures_, m.terminal, rng_);
  if (!decision.retry) co_return false;
  in_step_.reset();  // the agent waits out its backoff; the next begin restarts the clock
  co_await record_retry({m.result.seq, m.result.name, step_attempt(), m.result.error, decision.delay_ms});
  co_await send_one(protocol::retry_msg{m.result.seq, step_attempt(), decision.delay_ms});
  co_return true;
}

// Each journaled step goes to the agent once, in order (history_feed).
attempt_driver::step attempt_driver::on(const protocol::history_msg& m) {
  if (auto why = history_->refuse(m)) throw violation{*why};
  co_await send_one(history_->serve());
  co_return std::nullopt;
}

attempt_driver::step attempt_driver::on(const protocol::emit_msg& m) {
  observer_.on_emit(m.data);
  co_return std::nullopt;
}

attempt_driver::step attempt_driver::on(const protocol::done_msg& m) {
  // A parent joins a child's output as a step of its own.
  if (!run_.parent_id.empty() && protocol::nesting_depth(m.output) > protocol::max_output_depth)
    throw violation{fmt::format("the run's output nests deeper than {} levels, which its parent's replay could not "
                                "carry",
                                protocol::max_output_depth)};
  co_await expect_clean_exit("done");
  if (cancel_sent_) co_return cancelled_result();
  co_return attempt_result{kind::completed, m.output, {}, {}};
}

attempt_driver::step attempt_driver::on(const protocol::fail_msg& m) {
  co_await expect_clean_exit("fail");
  if (cancel_sent_) co_return cancelled_result();
  co_return failed(m.error.message, m.error.type);
}

// After done/fail the agent may only close its channel and exit.
task<void> attempt_driver::expect_clean_exit(std::string_view last) {
  try {
    const auto extra = co_await receive(clock::now() + options_.exit_grace, false);
    if (extra) throw violation{"sent a frame after " + std::string(last)};
  } catch (const runtime::channel_closed&) {
  }
  // The outcome is known; nothing the sandbox does now can change it.
  co_await kill();
}

void attempt_driver::check_seq(std::uint64_t seq, std::string_view what) {
  if (seq == expected_seq_) return;
  if (seq < expected_seq_)
    throw violation{std::string(what) + " for seq " + std::to_string(seq) + ", which is already journaled (next is " +
                    std::to_string(expected_seq_) + ")"};
  throw violation{std::string(what) + " for seq " + std::to_string(seq) + " skips ahead (next is " +
                  std::to_string(expected_seq_) + ")"};
}

// An attempt alone in its process gets its agent's next frame sooner by
// looking again for a while (up to 100 us) than by sleeping in epoll: a
// wake-up costs more than that on a VM. With others live, the loop's time is
// theirs. Each look that ends empty-handed halves the next; every 64th
// receive tries the full length again.
std::optional<json> attempt_driver::spin_receive() {
  // On one CPU looking again only delays the frame it waits for.
  static const bool may_spin = [] {
    cpu_set_t cpus;
    return ::sched_getaffinity(0, sizeof cpus, &cpus) != 0 || CPU_COUNT(&cpus) > 1;
  }();
  if (!may_spin || live_attempts.load(std::memory_order_relaxed) != 1) return std::nullopt;
  if (++receives_ % 64 == 0) spin_ = full_spin;
  // The machine's clock, not the engine's: a spin is CPU spent, not a wait a fake clock may stretch.
  const auto until = std::chrono::steady_clock::now() + spin_;
  while (std::chrono::steady_clock::now() < until) {
    if (auto frame = process_->io().try_receive()) return frame;
    ::sched_yield();  // the agent may be waiting for this core
  }
  spin_ /= 2;
  return std::nullopt;
}

task<std::optional<json>> attempt_driver::receive(clock::time_point until, bool or_wakeup) {
  if (auto frame = spin_receive()) co_return frame;
  for (;;) {
    if (auto frame = process_->io().try_receive()) co_return frame;
    const auto woken = co_await wait_any(*channel_fd_, asio::posix::descriptor_base::wait_read,
                                         or_wakeup ? &*events_fd_ : nullptr, until);
    // An agent that wrote its last frame and exited wakes both at once: the frame comes first.
    if (woken != woken_by::first) co_return process_->io().try_receive();
  }
}

// The channel closed or the process ended without done/fail.
task<attempt_result> attempt_driver::died(std::string how) {
  auto status = co_await offload([this] { return process_->wait_for(options_.exit_grace); }, pool::teardown);
  if (!status) status = co_await offload([this] { return process_->kill(); }, pool::teardown);
  if (cancel_sent_) co_return cancelled_result();
  if (auto breach = process_->check_limits()) co_return co_await exceeded(breach->message, breach->limit);
  auto tail = process_->log_tail();
  if (auto why = runtime::diagnose_bwrap_failure(tail)) co_return failed(*why, "sandbox");
  // A shell's 126 or 127 before any hello: the program, or what its script
  // starts, cannot be executed in the sandbox. Another attempt fails alike.
  if (!greeted_ && status->exited && (status->code == 126 || status->code == 127))
    co_return failed(fmt::format("the agent could not be started: it exited with code {} ({}) before saying hello{}; "
                                 "check that its program, and any interpreter or command its script starts, exists "
                                 "in the sandbox and may be executed",
                                 status->code, status->code == 127 ? "not found" : "cannot execute", log_excerpt()),
                     "sandbox");
  co_return crashed("the agent " + how + " without finishing (" + status->describe() + ")" + log_excerpt());
}

std::string attempt_driver::log_excerpt() const {
  auto tail = process_->log_tail(600);
  while (!tail.empty() && (tail.back() == '\n' || tail.back() == ' ')) tail.pop_back();
  if (tail.empty()) return "";
  // One line, its lines apart (a message is shown with its control characters escaped).
  std::string joined;
  for (const char c : tail) c == '\n' ? joined += " | " : joined += c;
  return "; its last output: " + joined;
}

task<attempt_result> run_attempt(attempt_journal& journal, attempt_wakeups& wakeups,
                                 runtime::sandbox_backend& backend, const storage::run_record& run, const policy& p,
                                 int attempt, const attempt_options& options, run_observer& observer) {
  attempt_driver driver(journal, wakeups, run, p, attempt, options, observer);
  co_return co_await driver.drive(backend);
}

}  // namespace cairn::engine
