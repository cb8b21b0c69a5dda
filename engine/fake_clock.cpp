#include "engine/fake_clock.hpp"

#include <atomic>
#include <stdexcept>

#include "storage/journal.hpp"

namespace cairn::engine {
namespace {

std::atomic<std::int64_t> fake_wall_ms{0};

std::int64_t read_fake_wall() { return fake_wall_ms.load(std::memory_order_acquire); }

}  // namespace

fake_clock::fake_clock() {
  if (clock::faked()) throw std::logic_error("a fake clock is already in use in this process");
  fake_wall_ms.store(storage::now_ms());
  storage::set_now_ms_for_testing(read_fake_wall);
  clock::fake_at(clock::time_point(std::chrono::steady_clock::now().time_since_epoch()));
}

fake_clock::~fake_clock() {
  clock::fake_at(std::nullopt);
  storage::set_now_ms_for_testing(nullptr);
}

void fake_clock::advance(std::chrono::milliseconds by) {
  // Wall time first: whoever sees the steady clock move finds the journal's moved too.
  fake_wall_ms.fetch_add(by.count(), std::memory_order_acq_rel);
  clock::advance_fake(std::chrono::duration_cast<clock::duration>(by));
}

std::int64_t fake_clock::wall_ms() const { return read_fake_wall(); }

}  // namespace cairn::engine
