// The engine's event loop vocabulary. An attempt is a C++20 coroutine on a
// Boost.Asio io_context: where a thread per run used to sleep in poll(2), it
// suspends on its agent's channel, its run's wake-ups and its deadlines, and a
// few threads carry every live run. What must block (fork and exec, killing a
// sandbox, a tool call, a commit's fsync, a read of all of a run's events)
// runs elsewhere: on the blocking pools below, or on the ledger's committer.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <utility>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/experimental/concurrent_channel.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>

#include <boost/asio/basic_waitable_timer.hpp>

namespace cairn::engine {

namespace asio = boost::asio;

// The engine's time: how long a wait lasts, when a deadline, a lease's
// renewal or a retry's backoff comes. The machine's steady clock, or, while
// a test holds a fake_clock, that one: it moves only when the test moves it,
// and storage::now_ms() (the journal's wall time) moves with it, so the
// engine's timers, leases, deadlines and backoff are tested without waiting
// for them, however loaded the machine.

struct clock {
  using duration = std::chrono::steady_clock::duration;
  using rep = duration::rep;
  using period = duration::period;
  using time_point = std::chrono::time_point<clock>;
  static constexpr bool is_steady = true;
  static time_point now() noexcept;
  // Whether a fake_clock stands in for the machine's.
  static bool faked() noexcept;
  // For fake_clock (engine/fake_clock.hpp) alone: from now on, now() reads
  // `at`, moved only by advance_fake(); nullopt: the machine's clock again.
  static void fake_at(std::optional<time_point> at) noexcept;
  static void advance_fake(duration by) noexcept;
};

// How an event loop waits for the clock: until a deadline on the machine's;
// a millisecond at a time on a fake one, which another thread moves.
struct clock_wait_traits {
  static clock::duration to_wait_duration(const clock::duration& d);
  static clock::duration to_wait_duration(const clock::time_point& t);
};

// The engine's timer, on its clock.
using timer = boost::asio::basic_waitable_timer<clock, clock_wait_traits>;

// The ms until `t` from now for a poll(2) timeout: 0 when past, capped at a
// day (no deadline: the waiter merely looks again); 1 on a fake clock.
int poll_timeout(clock::time_point t);

// Whether a timer set for `until_ms` (the journal's wall time) has come at
// `now_ms`: never before it. One rule for the scheduler's wake-up of a
// sleeping run and the attempt's answer to a sleep.
bool timer_due(std::int64_t now_ms, std::int64_t until_ms);

template <class T>
using task = asio::awaitable<T>;

// The process's threads for blocking work. They live as long as the
// process, so that an agent started from one (PR_SET_PDEATHSIG follows the
// thread) lives as long as the host. A forked child gets pools of its own.
//   starts:   making sandboxes, starting agents in them, readying a run's
//             files; 8 threads.
//   teardown: killing sandboxes, taking them down, releasing workspaces;
//             8 threads. Each job is short and bounded by the host, so a
//             kill waits at most behind other kills.
//   tools:    tool calls (commands, http.fetch, llm.chat), whose length a
//             remote server or the agent's grant decides: 30 s model calls
//             are ordinary. A thread per call in flight, started when a
//             call finds none idle and kept for the next, up to 256
//             (tool_threads in io.cpp): an attempt has at most one call in
//             flight, so under the scheduler's max_concurrent no call waits
//             behind another; past the bound calls wait their turn, and
//             nothing else ever does.
// Apart, so that a run that is ending never waits behind a thousand that
// are starting (under load a start takes seconds), and a cancel's kill
// never waits behind slow tool calls.
enum class pool { starts, teardown, tools };

// Attempts of this process whose agent runs (engine/attempt.cpp counts them).
// Alone, an attempt may spend its loop's time to answer sooner (look again
// for a frame before sleeping, commit on its own thread).
extern std::atomic<int> live_attempts;
// Attempts of this process from the making of their sandbox to their end: a
// superset of the live ones. An attempt that is the only one tells its agent
// so (ack.alone), whose polling then takes the CPU of no other run's start.
extern std::atomic<int> begun_attempts;
asio::any_io_executor blocking_executor(pool which);

// A test seam for the deterministic simulator (tests/sim), which runs the
// attempt driver on one thread: while on, offload() calls its function on
// the caller's thread and event loop (taking no pool_use), start_slot::take()
// holds no place, and no pool thread is started. Off unless a test turns it on.
void run_blocking_inline(bool on);
bool blocking_inline() noexcept;

// Holds a thread of `which` for one job: for pool::tools, starts one when
// none is idle (up to the bound). Nothing for the fixed pools.
class pool_use {
 public:
  explicit pool_use(pool which);
  ~pool_use();
  pool_use(const pool_use&) = delete;
  pool_use& operator=(const pool_use&) = delete;

 private:
  pool which_;
};

// Runs `fn` on a blocking pool; the coroutine resumes on its own executor
// with what `fn` returned or threw.
template <class F>
auto offload(F fn, pool which) -> task<std::invoke_result_t<F&>> {
  using T = std::invoke_result_t<F&>;
  if (blocking_inline()) co_return fn();
  const pool_use use(which);
  co_return co_await asio::co_spawn(
      blocking_executor(which), [fn = std::move(fn)]() mutable -> task<T> { co_return fn(); }, asio::use_awaitable);
}

// A place among the sandboxes of this process that are starting (from their
// making until their agent's hello). Few at once: a start under a thousand
// others is slow for all of them (each new mount namespace copies every
// mount of the host), and an agent must say hello within its deadline.
// Released when destroyed; a forked child has places of its own.
class start_slot {
 public:
  static task<start_slot> take();
  start_slot(start_slot&& other) noexcept : held_(std::exchange(other.held_, false)) {}
  start_slot& operator=(start_slot&&) = delete;
  ~start_slot();

 private:
  explicit start_slot(bool held) : held_(held) {}
  bool held_;
};

// A descriptor the event loop watches without owning it: the owner closes
// it, after this is gone.
class watched_fd {
 public:
  watched_fd(const asio::any_io_executor& executor, int fd) : descriptor_(executor, fd) {}
  ~watched_fd() { descriptor_.release(); }
  watched_fd(const watched_fd&) = delete;
  watched_fd& operator=(const watched_fd&) = delete;
  asio::posix::stream_descriptor& get() { return descriptor_; }

 private:
  asio::posix::stream_descriptor descriptor_;
};

// What ended a wait_any.
enum class woken_by { first, second, deadline };

// Waits until `first` is ready for `first_wait`, `second` (when given) is
// readable, or `deadline` has come; says which came first.
task<woken_by> wait_any(watched_fd& first, asio::posix::descriptor_base::wait_type first_wait, watched_fd* second,
                        clock::time_point deadline);

// Runs `t` to its end on a private event loop on this thread, for a caller
// that blocks; returns what it returned, throws what it threw.
template <class T>
T run_here(task<T> t) {
  asio::io_context io;
  auto done = asio::co_spawn(io, std::move(t), asio::use_future);
  io.run();
  return done.get();
}

}  // namespace cairn::engine
