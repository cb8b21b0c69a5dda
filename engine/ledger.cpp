#include "engine/ledger.hpp"

#include <algorithm>

#include <boost/asio/post.hpp>
#include <boost/asio/this_coro.hpp>
#include <fmt/format.h>

#include "runtime/crash_point.hpp"
#include "engine/event_schema.hpp"
#include "engine/run_journal.hpp"
#include "engine/run_state.hpp"
#include "engine/wakeups.hpp"
#include "protocol/text.hpp"

namespace cairn::engine {
namespace {

// The most writes one group commit carries; the rest wait for the next.
constexpr std::size_t max_group = 1024;

json error_json(const protocol::error_info& e) { return {{"message", e.message}, {"type", e.type}}; }

template <class... F>
struct overloaded : F... {
  using F::operator()...;
};
template <class... F>
overloaded(F...) -> overloaded<F...>;

// The event an effect records, built through the schema (event_schema.hpp).
std::optional<event_row> row_of(const effect& e) {
  using namespace effects;
  return std::visit(
      overloaded{
          [](const retry_due& r) -> std::optional<event_row> {
            return event("step_retry",
                         {{"name", r.name}, {"attempt", r.attempt}, {"error", error_json(r.error)},
                          {"delay_ms", r.delay_ms}},
                         r.seq);
          },
          [](const tool_started& t) -> std::optional<event_row> {
            return event("tool_started", {{"tool", t.tool}, {"idempotency", t.idempotency}, {"args", t.args}}, t.seq);
          },
          [](const tool_settled& t) -> std::optional<event_row> { return event("tool_settled", {{"how", t.how}}, t.seq); },
          [](const timer_set& t) -> std::optional<event_row> {
            return event("timer_set", {{"until_ms", t.until_ms}, {"in_past", t.in_past}}, t.seq);
          },
          [](const wait_started& w) -> std::optional<event_row> {
            return event("wait_started",
                         {{"signal", w.signal}, {"deadline_ms", w.deadline_ms ? json(*w.deadline_ms) : json()}}, w.seq);
          },
          [](const sandbox_warning& w) -> std::optional<event_row> {
            return event("sandbox_warning", {{"message", w.message}});
          },
          [](const cancel_sent& c) -> std::optional<event_row> {
            return event("cancel_sent", {{"reason", c.reason}, {"grace_seconds", c.grace_seconds}});
          },
          [](const limit_exceeded& l) -> std::optional<event_row> {
            return event("limit_exceeded", {{"limit", l.limit}, {"message", l.message}});
          },
          [](const attempt_crashed& a) -> std::optional<event_row> {
            return event("attempt_crashed", {{"attempt", a.attempt}, {"error", a.error}, {"will_retry", a.will_retry}});
          },
          [](const suspended& s) -> std::optional<event_row> {
            return event("suspended",
                         {{"count", s.count}, {"bytes_written", s.bytes_written}, {"cpu_ms", s.cpu_ms}, {"ms", s.ms}});
          },
          [](const agent_chosen& a) -> std::optional<event_row> {
            const auto& v = a.version;
            return event(a.replaced ? "agent_replaced" : "agent_version",
                         {{"agent", v.program.string()},
                          {"version", v.id},
                          {"program_sha256", v.program_sha256},
                          {"script", v.script},
                          {"files", v.files},
                          {"bytes", v.bytes},
                          {"partial", v.partial.empty() ? json() : json(v.partial)},
                          {"kept", a.kept.empty() ? json() : json(a.kept)},
                          {"unkept", a.unkept.empty() ? json() : json(a.unkept)}});
          },
          [](const agent_changed& a) -> std::optional<event_row> {
            return event("agent_changed", {{"agent", a.agent}, {"was", a.was}, {"now", a.now}, {"runs", a.runs}});
          },
          [](const auto&) -> std::optional<event_row> { return std::nullopt; },
      },
      e);
}

void append(storage::journal& j, const std::string& run_id, const event_row& row) {
  j.append_event(run_id, row.kind, row.data, row.seq);
}

// A run's attempt begins: counted, and recorded.
int begin(storage::journal& j, const std::string& id) {
  const int attempt = j.begin_attempt(id);
  append(j, id, attempt_started(attempt));
  return attempt;
}

void store(storage::journal& j, const std::string& run_id, const effect& e) {
  using namespace effects;
  if (auto row = row_of(e)) append(j, run_id, *row);
  std::visit(overloaded{
                 [&](const step_committed& s) {
                   if (s.checkpoint) {
                     j.put_blobs(run_id, s.checkpoint->blobs, s.checkpoint->used);
                     append(j, run_id, {std::string(checkpoint_event), s.checkpoint->data, s.record.result.seq});
                   }
                   if (!s.signal) return j.append_step(s.record);
                   j.deliver_signal(s.signal->id, s.record);
                   append(j, run_id, signal_delivered({.id = s.signal->id, .name = s.signal->name}, s.record.result.seq));
                 },
                 [&](const workspace_baseline& b) {
                   j.put_blobs(run_id, b.checkpoint.blobs, b.checkpoint.used);
                   append(j, run_id, {std::string(baseline_event), b.checkpoint.data, std::nullopt});
                 },
                 [&](const tool_settled& t) {
                   if (t.step) j.append_step(*t.step);
                 },
                 [&](const child_started& c) { j.create_run(c.child); },
                 [&](const suspended& s) {
                   j.suspend_run(run_id, s.wait);
                   append(j, run_id, run_waiting(s.wait));
                 },
                 [&](const released& r) {
                   j.release_run(run_id);
                   append(j, run_id, run_released(r.reason));
                 },
                 [&](const run_ended& r) {
                   j.finish_run(run_id, r.status, r.output, r.error);
                   append(j, run_id, run_finished(r.status, r.error));
                 },
                 [&](const attempts_reset&) {
                   const auto before = j.find_run(run_id);
                   j.reset_attempts(run_id);  // not_found when there is no run
                   append(j, run_id, run_reset(before->status, before->attempts));
                 },
                 [](const auto&) {},
             },
             e);
}

}  // namespace

ledger::ledger(const std::filesystem::path& db, storage::journal_options options)
    : ledger(storage::open_journal(db, options)) {}

ledger::ledger(std::unique_ptr<storage::journal> journal)
    : path_(journal->path()), journal_(std::move(journal)), committer_([this] { commit_loop(); }) {}

ledger::ledger(std::unique_ptr<storage::journal> journal, single_thread_t)
    : path_(journal->path()), journal_(std::move(journal)), single_thread_(true) {}

ledger::~ledger() {
  if (single_thread_) return;
  {
    std::lock_guard lock(mutex_);
    closing_ = true;
  }
  queued_.notify_one();
  committer_.join();
}

void ledger::enqueue(body write, done_fn done, bool sync_later) {
  if (single_thread_) throw std::logic_error("a ledger of one thread was written by two at once");
  {
    std::lock_guard lock(mutex_);
    queue_.push_back({std::move(write), std::move(done), sync_later});
  }
  queued_.notify_one();
}

bool ledger::lead(body& write, std::exception_ptr& error, bool sync_later) {
  {
    std::lock_guard lock(mutex_);
    if (committing_ || !queue_.empty()) return false;
    committing_ = true;
  }
  std::vector<writer> group;
  group.push_back({std::move(write), [&error](std::exception_ptr e) { error = e; }, sync_later});
  commit_group(group);
  bool queued;
  {
    std::lock_guard lock(mutex_);
    committing_ = false;
    queued = !queue_.empty() || closing_;
  }
  // Writers that queued meanwhile (or a closing ledger); else the committer
  // sleeps on: waking it for nothing costs a step a context switch.
  if (queued) queued_.notify_one();
  return true;
}

void ledger::commit_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    queued_.wait(lock, [&] { return closing_ || (!queue_.empty() && !committing_); });
    if (queue_.empty()) return;
    if (committing_) continue;  // closing, while a leading writer commits
    std::vector<writer> group;
    const std::size_t n = std::min(queue_.size(), max_group);
    group.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      group.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    committing_ = true;
    lock.unlock();
    commit_group(group);
    lock.lock();
    committing_ = false;
  }
}

void ledger::commit_group(std::vector<writer>& group) {
  std::vector<body> bodies;
  bodies.reserve(group.size());
  bool sync_later = true;
  for (auto& w : group) {
    bodies.push_back(std::move(w.write));
    sync_later = sync_later && w.sync_later;
  }
  runtime::crash_point("before_group_commit");
  std::vector<std::exception_ptr> errors;
  try {
    errors = journal_->write_together(bodies, sync_later);
  } catch (...) {
    errors.assign(group.size(), std::current_exception());  // the committer goes on; every writer hears why
  }
  // Durable, and nobody has been answered yet.
  runtime::crash_point(group.size() > 1 ? "after_group_commit.many" : "after_group_commit.one");
  for (const auto& e : errors)
    if (e) try {
        std::rethrow_exception(e);
      } catch (const storage::storage_error& refused) {
        if (refused.code() == storage::errc::fenced) fenced_writes_.fetch_add(1, std::memory_order_relaxed);
      } catch (...) {
        // told to its writer below
      }
  for (std::size_t i = 0; i < group.size(); ++i) group[i].done(errors[i]);
}

void ledger::write(body write, bool sync_later) {
  if (std::exception_ptr error; lead(write, error, sync_later)) {
    if (error) std::rethrow_exception(error);
    return;
  }
  std::mutex m;
  std::condition_variable committed;
  bool done = false;
  std::exception_ptr error;
  enqueue(
      std::move(write),
      [&](std::exception_ptr e) {
        std::lock_guard lock(m);
        error = e;
        done = true;
        committed.notify_one();
      },
      sync_later);
  std::unique_lock lock(m);
  committed.wait(lock, [&] { return done; });
  if (error) std::rethrow_exception(error);
}

task<void> ledger::write_async(body write, bool sync_later) {
  // Leading blocks this event loop for a commit: only an attempt alone may.
  if (std::exception_ptr error;
      (single_thread_ || live_attempts.load(std::memory_order_relaxed) <= 1) && lead(write, error, sync_later)) {
    if (error) std::rethrow_exception(error);
    co_return;
  }
  auto executor = co_await asio::this_coro::executor;
  co_await asio::async_initiate<decltype(asio::use_awaitable), void(std::exception_ptr)>(
      [&](auto handler) {
        // The handler moves only (the queue's callbacks are copied), and is
        // invoked as an rvalue: the coroutine it resumes is then no longer its.
        auto resume = std::make_shared<decltype(handler)>(std::move(handler));
        // The caller's event loop counts the write as work until the
        // committer is done with it: a loop that ends with its work
        // (run_here) is not destroyed while the committer's post still
        // touches it (ThreadSanitizer saw cancel()'s loop go that way).
        auto work =
            std::make_shared<asio::any_io_executor>(asio::prefer(executor, asio::execution::outstanding_work.tracked));
        enqueue(
            std::move(write),
            [resume, work](std::exception_ptr e) mutable {
              asio::post(*work, [resume, e] { std::move(*resume)(e); });
              work.reset();
            },
            sync_later);
      },
      asio::use_awaitable);
}

ledger::body ledger::effects_body(const std::string& run_id, const std::vector<effect>& effects,
                                  std::string& parent) {
  return [&run_id, &effects, &parent](storage::journal& j) {
    // The run's state changes in the transaction of the effects that change
    // it: read once, written once. A run kept no state before the journal
    // could (nullopt): readers derive it from its history (run_state.hpp).
    bool read = false;
    std::optional<run_state> state;
    for (const auto& e : effects) {
      store(j, run_id, e);
      if (std::holds_alternative<effects::run_ended>(e))
        if (auto run = j.find_run(run_id)) parent = run->parent_id;
      if (!changes_state(e)) continue;
      if (!std::exchange(read, true))
        if (auto kept = j.run_state(run_id)) state = run_state_of(*kept);
      if (state) change(*state, e, storage::now_ms());
    }
    if (state) j.put_run_state(run_id, to_json(*state));
  };
}

void ledger::apply(const std::string& run_id, const std::vector<effect>& effects) {
  std::string parent;
  write(effects_body(run_id, effects, parent));
  announce_applied(run_id, effects, parent);
}

task<void> ledger::apply_effect_async(std::string run_id, effect e) {
  // Synced before the writer hears of it, whatever the effect: it acts on
  // it next (answers the agent; calls an at-most-once tool, whose started
  // record a power cut must not take, or the call is made again).
#ifdef CAIRN_TEST_UNSAFE_AMO_UNSYNCED  // cairn_unsafe_amo_unsynced, with which power_loss_test must fail
  const auto* started = std::get_if<effects::tool_started>(&e);
  const bool sync_later = started && started->idempotency == "at_most_once";
#else
  // A baseline is durable with the run's first step (SIGKILL keeps it
  // anyway): it saves the run a sync of its own as it starts.
  const bool sync_later = std::holds_alternative<effects::workspace_baseline>(e);
#endif
  std::vector<effect> effects;
  effects.push_back(std::move(e));
  std::string parent;
  co_await write_async(effects_body(run_id, effects, parent), sync_later);
  announce_applied(run_id, effects, parent);
}

task<std::optional<std::string>> ledger::start_child_async(
    std::string run_id, storage::new_run child, std::function<std::optional<std::string>(storage::journal&)> refusal) {
  std::optional<std::string> refused;
  body write = [&](storage::journal& j) {
    if (!j.find_run(child.id)) refused = refusal(j);
    if (!refused) store(j, run_id, effects::child_started{child});
  };
  co_await write_async(std::move(write));
  if (!refused) announce(path_, child.id, storage::change::submitted);
  co_return refused;
}

// Committed: whoever waits on these runs, here or in another process, looks again.
void ledger::announce_applied(const std::string& run_id, const std::vector<effect>& effects,
                              const std::string& parent) {
  for (const auto& e : effects) {
    if (std::holds_alternative<effects::suspended>(e)) announce(path_, run_id, storage::change::waiting);
    else if (std::holds_alternative<effects::released>(e) || std::holds_alternative<effects::attempts_reset>(e))
      announce(path_, run_id, storage::change::released);
    else if (std::holds_alternative<effects::run_ended>(e)) announce_end(run_id, parent);
    else if (const auto* child = std::get_if<effects::child_started>(&e))
      announce(path_, child->child.id, storage::change::submitted);
  }
}

void ledger::announce_end(const std::string& run_id, const std::string& parent_id) {
  announce(path_, run_id, storage::change::ended);
  if (!parent_id.empty()) announce(path_, parent_id, storage::change::child_ended);
}

std::optional<event_row> ledger::event_of(const effect& e) { return row_of(e); }

std::pair<storage::run_record, bool> ledger::create_run(const storage::new_run& run, bool sync_later) {
  std::pair<storage::run_record, bool> out;
  write([&](storage::journal& j) { out = j.create_run(run); }, sync_later);
  if (out.second) announce(path_, run.id, storage::change::submitted);
  return out;
}

std::vector<submitted_run> ledger::create_runs(std::span<const storage::new_run> runs) {
  std::vector<submitted_run> out;
  write([&](storage::journal& j) {
    out.reserve(runs.size());
    for (const auto& run : runs) out.push_back({run.id, j.create_run(run).second});
  });
  // A scheduler that hears of one new run looks at every schedulable one.
  const auto created = std::find_if(out.begin(), out.end(), [](const auto& r) { return r.created; });
  if (created != out.end()) announce(path_, created->id, storage::change::submitted);
  return out;
}

std::optional<std::string> ledger::fork_run(
    const storage::new_run& fork, const std::string& from, std::uint64_t seq,
    const std::function<std::optional<std::string>(storage::journal&)>& refusal) {
  // A history of any size is copied in bounded chunks (as a replay reads it).
  constexpr std::uint64_t chunk_bytes = 4 << 20;
  std::optional<std::string> refused;
  write([&](storage::journal& j) {
    if ((refused = refusal(j))) return;
    if (!j.create_run(fork).second)
      throw storage::storage_error(storage::errc::conflict, fmt::format("run {} exists", fork.id));
    append(j, fork.id, event("forked_from", {{"run", from}, {"seq", seq}}));
    run_state state;  // nothing happened yet at the fork's next step; its agent is identified at its first attempt
    for (std::uint64_t next = 0; next <= seq;) {
      auto chunk = j.steps_from(from, next, seq + 1, chunk_bytes);
      if (chunk.empty()) throw std::logic_error(fmt::format("run {} lost step {} while it was forked", from, next));
      for (auto& step : chunk) {
        step.run_id = fork.id;
        state.llm_tokens += tokens_of_step(step.result);
        j.append_step(step);
        next = step.result.seq + 1;
      }
    }
    for (std::int64_t after = 0;;) {
      auto chunk = j.events_from(from, after, chunk_bytes);
      if (chunk.empty()) break;
      for (const auto& e : chunk) {
        after = e.id;
        if (e.seq && *e.seq <= seq) j.append_event(fork.id, e.kind, e.data, e.seq);
      }
    }
    j.put_run_state(fork.id, to_json(state));
    append(j, from, event("forked", {{"run", fork.id}, {"seq", seq}}));
  });
  if (!refused) announce(path_, fork.id, storage::change::submitted);
  return refused;
}

bool ledger::claim_run(const std::string& id, const std::string& expected_owner, const std::string& new_owner) {
  bool claimed = false;
  write([&](storage::journal& j) { claimed = j.claim_run(id, expected_owner, new_owner); });
  return claimed;
}

task<bool> ledger::claim_run_async(std::string id, std::string expected_owner, std::string new_owner) {
  bool claimed = false;
  body write = [&](storage::journal& j) { claimed = j.claim_run(id, expected_owner, new_owner); };
  co_await write_async(std::move(write));
  co_return claimed;
}

void ledger::confirm_held(const std::string& id) {
  write([&](storage::journal& j) { j.confirm_held(id); });
}

task<void> ledger::confirm_held_async(std::string id) {
  body write = [&](storage::journal& j) { j.confirm_held(id); };
  co_await write_async(std::move(write));
}

void ledger::assign_workspace(const std::string& id, const std::string& workspace, const std::string& workspace_host) {
  write([&](storage::journal& j) { j.assign_workspace(id, workspace, workspace_host); });
}

task<void> ledger::assign_workspace_async(std::string id, std::string workspace, std::string workspace_host) {
  body write = [&](storage::journal& j) { j.assign_workspace(id, workspace, workspace_host); };
  co_await write_async(std::move(write));
}

void ledger::register_worker(const storage::worker_record& worker) {
  write([&](storage::journal& j) { j.register_worker(worker); });
}

task<void> ledger::register_worker_async(storage::worker_record worker) {
  body write = [&](storage::journal& j) { j.register_worker(worker); };
  co_await write_async(std::move(write));
}

task<bool> ledger::renew_lease_async(std::string worker_id, std::int64_t lease_expires_at_ms,
                                     std::int64_t fenced_writes) {
  bool renewed = false;
  body write = [&](storage::journal& j) { renewed = j.renew_lease(worker_id, lease_expires_at_ms, fenced_writes); };
  co_await write_async(std::move(write));
  co_return renewed;
}

void ledger::remove_worker(const std::string& worker_id) {
  write([&](storage::journal& j) { j.remove_worker(worker_id); });
}

int ledger::begin_attempt(const std::string& id) {
  int attempt = 0;
  write([&](storage::journal& j) { attempt = begin(j, id); });
  return attempt;
}

task<int> ledger::begin_attempt_async(std::string id) {
  int attempt = 0;
  body write = [&](storage::journal& j) { attempt = begin(j, id); };
  co_await write_async(std::move(write));
  co_return attempt;
}

task<std::optional<int>> ledger::take_run_async(std::string id, std::string expected_owner, std::string new_owner,
                                                std::optional<workspace_assignment> workspace) {
  std::optional<int> attempt;
  body write = [&](storage::journal& j) {
    if (!j.claim_run(id, expected_owner, new_owner)) return;
    if (workspace) j.assign_workspace(id, workspace->folder, workspace->host);
    attempt = begin(j, id);
  };
  co_await write_async(std::move(write), /*sync_later=*/true);
  co_return attempt;
}

storage::signal_record ledger::enqueue_signal(const std::string& run_id, const std::string& name, const json& payload,
                                              std::uint64_t max_signals) {
  storage::signal_record out;
  write([&](storage::journal& j) {
    out = j.enqueue_signal(run_id, name, payload, max_signals);
    append(j, run_id, signal_queued(out));
  });
  announce(path_, run_id, storage::change::signalled);
  return out;
}

bool ledger::request_cancel(const std::string& id, const std::string& reason) {
  return run_here(request_cancel_async(id, reason));
}

task<bool> ledger::request_cancel_async(std::string id, std::string reason) {
  bool marked = false;
  body write = [&](storage::journal& j) {
    const auto mark = j.request_cancel(id, reason);
    marked = mark != storage::cancel_mark::run_finished;
    if (mark == storage::cancel_mark::marked_now) append(j, id, cancel_requested(reason));
  };
  co_await write_async(std::move(write));
  if (marked) announce(path_, id, storage::change::cancel_requested);
  co_return marked;
}

bool ledger::cancel_idle_run(const std::string& id, const std::string& message) {
  return run_here(cancel_idle_run_async(id, message));
}

task<bool> ledger::cancel_idle_run_async(std::string id, std::string message) {
  bool cancelled = false;
  std::string parent;
  body write = [&](storage::journal& j) {
    cancelled = j.cancel_idle_run(id, message);
    if (!cancelled) return;
    append(j, id, run_finished(storage::run_status::cancelled, protocol::error_info{message, "cancelled"}));
    if (auto run = j.find_run(id)) parent = run->parent_id;
  };
  co_await write_async(std::move(write));
  if (cancelled) announce_end(id, parent);
  co_return cancelled;
}

int step_failures(storage::journal& journal, const std::string& run_id, std::uint64_t seq) {
  return step_state(journal, run_id).failures_at(seq);
}

int tool_attempts(storage::journal& journal, const std::string& run_id, std::uint64_t seq) {
  return step_state(journal, run_id).tool_attempts_at(seq);
}

std::optional<effects::timer_set> timer_at(storage::journal& journal, const std::string& run_id, std::uint64_t seq) {
  return step_state(journal, run_id).timer_at(seq);
}

std::optional<effects::wait_started> wait_at(storage::journal& journal, const std::string& run_id,
                                             std::uint64_t seq) {
  return step_state(journal, run_id).wait_at(seq);
}

std::uint64_t suspensions_since(storage::journal& journal, const std::string& run_id, std::int64_t since_ms) {
  if (auto kept = kept_run_state(journal, run_id)) return kept->suspensions_since(since_ms);
  run_state derived;
  derived.suspended_at_ms = derive_suspensions(journal, run_id, since_ms + 3'600'000);
  return derived.suspensions_since(since_ms);
}

std::string cancel_reason(storage::journal& journal, const std::string& run_id) {
  auto run = journal.find_run(run_id);
  return run && !run->cancel_reason.empty() ? run->cancel_reason : "the run was cancelled";
}

std::optional<fork_link> fork_made(const storage::event_record& e) {
  if (e.kind != "forked") return std::nullopt;
  return fork_link{e.data.value("run", ""), e.data.value("seq", std::uint64_t{0})};
}

std::optional<fork_link> forked_from(storage::journal& journal, const std::string& run_id) {
  const auto first = journal.events_from(run_id, 0, 1);
  if (first.empty() || first.front().kind != "forked_from") return std::nullopt;
  const auto& data = first.front().data;
  return fork_link{data.value("run", ""), data.value("seq", std::uint64_t{0})};
}

std::vector<fork_link> forks_of(storage::journal& journal, const std::string& run_id) {
  std::vector<fork_link> forks;
  for (const auto& e : journal.events(run_id))
    if (auto fork = fork_made(e)) forks.push_back(std::move(*fork));
  return forks;
}

std::optional<in_doubt_call> find_in_doubt(storage::journal& journal, const std::string& run_id) {
  const std::uint64_t seq = journal.step_count(run_id);
  auto started = step_state(journal, run_id).tool_at(seq);
  if (!started || started->idempotency != "at_most_once") return std::nullopt;
#ifdef CAIRN_TEST_UNSAFE_AMO_RETRIED  // cairn_unsafe_amo_retried, with which the simulator must fail
  return std::nullopt;
#endif
  in_doubt_call c;
  c.seq = seq;
  c.tool = started->tool;
  c.args = started->args;
  c.started_at_ms = started->started_at_ms;
  c.message = fmt::format(
      "step {} called at-most-once tool '{}' with {}, but its result was never recorded: the host stopped in "
      "between, so the call may or may not have happened. Check whether it did, then record the outcome with "
      "`cairn settle {} {} --result JSON` (or --error MESSAGE), or call it again with `cairn settle {} {} --retry`",
      seq, c.tool, protocol::clip(c.args.dump(), 100), run_id, seq, run_id, seq);
  return c;
}

}  // namespace cairn::engine
