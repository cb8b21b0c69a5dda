#include "engine/io.hpp"

#include <unistd.h>

#include <mutex>

#include <boost/asio/deferred.hpp>
#include <boost/asio/experimental/parallel_group.hpp>
#include <boost/asio/this_coro.hpp>

namespace cairn::engine {
namespace {

// Enough for the blocking moments of many runs at once (sandboxes being made
// or killed, tools running); more wait their turn.
constexpr int start_threads = 8;
constexpr int other_threads = 8;
// Sandboxes starting at once: as many as can be made at once.
constexpr std::size_t starting_at_once = start_threads;

// A channel whose buffered messages are the taken places: a send waits
// while all are taken, a receive frees one.
using places = asio::experimental::concurrent_channel<void(boost::system::error_code)>;

// What the engine keeps once per process.
struct per_process {
  asio::thread_pool starts{start_threads};
  asio::thread_pool other{other_threads};
  places start_places{other.get_executor(), starting_at_once};
};

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

std::atomic<int> live_attempts{0};
std::atomic<int> begun_attempts{0};

asio::thread_pool& blocking_pool(pool which) {
  return which == pool::starts ? this_process().starts : this_process().other;
}

task<start_slot> start_slot::take() {
  co_await this_process().start_places.async_send(boost::system::error_code{}, asio::use_awaitable);
  co_return start_slot{};
}

start_slot::~start_slot() {
  if (held_) this_process().start_places.try_receive([](boost::system::error_code) {});
}

task<woken_by> wait_any(watched_fd& first, asio::posix::descriptor_base::wait_type first_wait, watched_fd* second,
                        std::chrono::steady_clock::time_point deadline) {
  // One parallel group of plain waits: the first to complete cancels the
  // others, whose operation_aborted is a value here, not an exception (this
  // runs for every frame an agent sends).
  namespace x = asio::experimental;
  asio::steady_timer timer(co_await asio::this_coro::executor, deadline);
  if (second) {
    auto [order, e1, e2, e3] =
        co_await x::make_parallel_group(
            first.get().async_wait(first_wait, asio::deferred),
            second->get().async_wait(asio::posix::descriptor_base::wait_read, asio::deferred),
            timer.async_wait(asio::deferred))
            .async_wait(x::wait_for_one(), asio::use_awaitable);
    co_return static_cast<woken_by>(order[0]);
  }
  auto [order, e1, e2] =
      co_await x::make_parallel_group(first.get().async_wait(first_wait, asio::deferred),
                                      timer.async_wait(asio::deferred))
          .async_wait(x::wait_for_one(), asio::use_awaitable);
  co_return order[0] == 0 ? woken_by::first : woken_by::deadline;
}

}  // namespace cairn::engine
