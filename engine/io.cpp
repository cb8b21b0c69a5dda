#include "engine/io.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include <boost/asio/deferred.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/experimental/parallel_group.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/this_coro.hpp>

namespace cairn::engine {
namespace {

// Enough for the blocking moments of many runs at once (sandboxes being made
// or killed); more wait their turn.
constexpr int start_threads = 8;
constexpr int teardown_threads = 8;
// Tool calls in flight with a thread each (io.hpp, pool::tools): a thread
// idles at a few KiB resident, and the scheduler's max_concurrent (8 by
// default) bounds the calls in flight long before this does; the bound is
// for a host asked for thousands at once, whose calls then take turns.
constexpr std::size_t most_tool_threads = 256;
// Sandboxes starting at once: as many as can be made at once.
constexpr std::size_t starting_at_once = start_threads;

// A channel whose buffered messages are the taken places: a send waits
// while all are taken, a receive frees one.
using places = asio::experimental::concurrent_channel<void(boost::system::error_code)>;

// The threads of pool::tools: an event loop that each runs, one more
// started whenever a call comes and every thread has one. Kept, never
// joined, like the fixed pools.
class tool_threads {
 public:
  asio::any_io_executor executor() { return io_.get_executor(); }

  void take() {
    std::lock_guard lock(mutex_);
    if (++busy_ <= threads_.size() || threads_.size() >= most_tool_threads) return;
    threads_.emplace_back([this] { io_.run(); });
  }
  void give_back() {
    std::lock_guard lock(mutex_);
    --busy_;
  }

 private:
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> open_{io_.get_executor()};
  std::mutex mutex_;
  std::size_t busy_ = 0;  // calls handed to the loop and not yet returned
  std::vector<std::thread> threads_;
};

// What the engine keeps once per process.
struct per_process {
  asio::thread_pool starts{start_threads};
  asio::thread_pool teardown{teardown_threads};
  tool_threads tools;
  places start_places{teardown.get_executor(), starting_at_once};
};

std::atomic<bool> inline_blocking{false};

per_process& this_process() {
  // Made again in a forked child, which has none of its parent's threads;
  // never destroyed, so that no agent outlives its pools (and none is
  // killed before the process ends).
  static std::mutex mutex;
  static per_process* made = nullptr;
  static pid_t made_by = 0;
  std::lock_guard lock(mutex);
  if (made_by != ::getpid()) {
    made = new per_process;
    made_by = ::getpid();
  }
  return *made;
}

}  // namespace

namespace {

std::atomic<bool> faking{false};
std::atomic<clock::rep> fake_steady{0};  // ticks of clock::duration

}  // namespace

clock::time_point clock::now() noexcept {
  if (faking.load(std::memory_order_acquire)) return time_point(duration(fake_steady.load(std::memory_order_acquire)));
  return time_point(std::chrono::steady_clock::now().time_since_epoch());
}

bool clock::faked() noexcept { return faking.load(std::memory_order_acquire); }

void clock::fake_at(std::optional<time_point> at) noexcept {
  if (at) fake_steady.store(at->time_since_epoch().count(), std::memory_order_release);
  faking.store(at.has_value(), std::memory_order_release);
}

void clock::advance_fake(duration by) noexcept { fake_steady.fetch_add(by.count(), std::memory_order_acq_rel); }

clock::duration clock_wait_traits::to_wait_duration(const clock::duration& d) {
  if (!clock::faked()) return d;
  return std::min<clock::duration>(d, std::chrono::milliseconds(1));
}

clock::duration clock_wait_traits::to_wait_duration(const clock::time_point& t) {
  return to_wait_duration(t - clock::now());
}

int poll_timeout(clock::time_point t) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(t - clock::now());
  if (left.count() <= 0) return 0;
  if (clock::faked()) return 1;
  return static_cast<int>(std::min<std::int64_t>(left.count(), 24 * 3600 * 1000));
}

bool timer_due(std::int64_t now_ms, std::int64_t until_ms) {
#ifdef CAIRN_TEST_UNSAFE_TIMER_EARLY
  // Test seam (cairn_unsafe_timer_early): a timer fires a second early.
  return now_ms + 1'000 >= until_ms;
#else
  return now_ms >= until_ms;
#endif
}

std::atomic<int> live_attempts{0};
std::atomic<int> begun_attempts{0};

void run_blocking_inline(bool on) { inline_blocking.store(on, std::memory_order_release); }

bool blocking_inline() noexcept { return inline_blocking.load(std::memory_order_acquire); }

asio::any_io_executor blocking_executor(pool which) {
  auto& process = this_process();
  switch (which) {
    case pool::starts:
      return process.starts.get_executor();
    case pool::teardown:
      return process.teardown.get_executor();
    case pool::tools:
      return process.tools.executor();
  }
  return process.teardown.get_executor();
}

pool_use::pool_use(pool which) : which_(which) {
  if (which_ == pool::tools) this_process().tools.take();
}

pool_use::~pool_use() {
  if (which_ == pool::tools) this_process().tools.give_back();
}

task<start_slot> start_slot::take() {
  if (blocking_inline()) co_return start_slot{false};
  co_await this_process().start_places.async_send(boost::system::error_code{}, asio::use_awaitable);
  co_return start_slot{true};
}

start_slot::~start_slot() {
  if (held_) this_process().start_places.try_receive([](boost::system::error_code) {});
}

task<woken_by> wait_any(watched_fd& first, asio::posix::descriptor_base::wait_type first_wait, watched_fd* second,
                        clock::time_point deadline) {
  // One parallel group of plain waits: the first to complete cancels the
  // others, whose operation_aborted is a value here, not an exception (this
  // runs for every frame an agent sends).
  namespace x = asio::experimental;
  timer deadline_timer(co_await asio::this_coro::executor, deadline);
  if (second) {
    auto [order, e1, e2, e3] =
        co_await x::make_parallel_group(
            first.get().async_wait(first_wait, asio::deferred),
            second->get().async_wait(asio::posix::descriptor_base::wait_read, asio::deferred),
            deadline_timer.async_wait(asio::deferred))
            .async_wait(x::wait_for_one(), asio::use_awaitable);
    co_return static_cast<woken_by>(order[0]);
  }
  auto [order, e1, e2] =
      co_await x::make_parallel_group(first.get().async_wait(first_wait, asio::deferred),
                                      deadline_timer.async_wait(asio::deferred))
          .async_wait(x::wait_for_one(), asio::use_awaitable);
  co_return order[0] == 0 ? woken_by::first : woken_by::deadline;
}

}  // namespace cairn::engine
