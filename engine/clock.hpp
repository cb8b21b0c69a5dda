// The engine's time: how long a wait lasts, when a deadline, a lease's
// renewal or a retry's backoff comes. The machine's steady clock, or, while
// a test holds a fake_clock, that one: it moves only when the test moves it,
// and storage::now_ms() (the journal's wall time) moves with it, so the
// engine's timers, leases, deadlines and backoff are tested without waiting
// for them, however loaded the machine.
#pragma once

#include <chrono>
#include <cstdint>

#include <boost/asio/basic_waitable_timer.hpp>

namespace cairn::engine {

struct clock {
  using duration = std::chrono::steady_clock::duration;
  using rep = duration::rep;
  using period = duration::period;
  using time_point = std::chrono::time_point<clock>;
  static constexpr bool is_steady = true;
  static time_point now() noexcept;
  // Whether a fake_clock stands in for the machine's.
  static bool faked() noexcept;
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

// A test seam: while one exists, clock::now() and storage::now_ms() read it
// (one at a time per process). It starts at the machine's times and moves
// only by advance(), from any thread.
class fake_clock {
 public:
  fake_clock();
  ~fake_clock();
  fake_clock(const fake_clock&) = delete;
  fake_clock& operator=(const fake_clock&) = delete;

  void advance(std::chrono::milliseconds by);
  std::int64_t wall_ms() const;  // what storage::now_ms() says now
};

}  // namespace cairn::engine
