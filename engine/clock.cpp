#include "engine/clock.hpp"

#include <algorithm>
#include <atomic>
#include <stdexcept>

#include "storage/journal.hpp"

namespace cairn::engine {
namespace {

std::atomic<bool> faking{false};
std::atomic<clock::rep> fake_steady{0};  // ticks of clock::duration
std::atomic<std::int64_t> fake_wall_ms{0};

std::int64_t read_fake_wall() { return fake_wall_ms.load(std::memory_order_acquire); }

}  // namespace

clock::time_point clock::now() noexcept {
  if (faking.load(std::memory_order_acquire)) return time_point(duration(fake_steady.load(std::memory_order_acquire)));
  return time_point(std::chrono::steady_clock::now().time_since_epoch());
}

bool clock::faked() noexcept { return faking.load(std::memory_order_acquire); }

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

fake_clock::fake_clock() {
  if (faking.load()) throw std::logic_error("a fake clock is already in use in this process");
  fake_steady.store(std::chrono::steady_clock::now().time_since_epoch().count());
  fake_wall_ms.store(storage::now_ms());
  storage::set_now_ms_for_testing(read_fake_wall);
  faking.store(true, std::memory_order_release);
}

fake_clock::~fake_clock() {
  faking.store(false, std::memory_order_release);
  storage::set_now_ms_for_testing(nullptr);
}

void fake_clock::advance(std::chrono::milliseconds by) {
  // Wall time first: whoever sees the steady clock move finds the journal's moved too.
  fake_wall_ms.fetch_add(by.count(), std::memory_order_acq_rel);
  fake_steady.fetch_add(std::chrono::duration_cast<clock::duration>(by).count(), std::memory_order_acq_rel);
}

std::int64_t fake_clock::wall_ms() const { return read_fake_wall(); }

}  // namespace cairn::engine
