#include "engine/io.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>
#include <system_error>

#include <boost/asio/deferred.hpp>
#include <boost/asio/experimental/parallel_group.hpp>
#include <boost/asio/this_coro.hpp>

namespace cairn::engine {
namespace {

// Enough for the blocking moments of many runs at once (a sandbox being
// made or killed, a tool running); more wait their turn.
constexpr int blocking_threads = 8;

int dup_of(int fd) {
  int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (copy < 0) throw std::system_error(errno, std::generic_category(), "dup of a descriptor the engine watches");
  return copy;
}

}  // namespace

asio::thread_pool& blocking_pool() {
  // Made again in a forked child, which has none of its parent's threads;
  // never destroyed, so that no agent outlives it (and none is killed
  // before the process ends).
  static std::mutex mutex;
  static asio::thread_pool* pool = nullptr;
  static pid_t made_by = 0;
  std::lock_guard lock(mutex);
  if (!pool || made_by != ::getpid()) {
    pool = new asio::thread_pool(blocking_threads);
    made_by = ::getpid();
  }
  return *pool;
}

watched_fd::watched_fd(const asio::any_io_executor& executor, int fd) : descriptor_(executor, dup_of(fd)) {}

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
