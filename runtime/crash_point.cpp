#include "runtime/crash_point.hpp"

#include <pthread.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <mutex>
#include <string>

namespace cairn::runtime {
namespace {

struct armed_point {
  std::string name;
  std::atomic<long> remaining{0};
};

armed_point point;
std::mutex reading;
// Whether `point` holds this process's CAIRN_CRASH_POINT. A test forks a
// host after its parent has passed crash points of its own and arms only the
// child (setenv after the fork): a fork's child reads the variable again at
// its first point. Not checked with getpid() at every point, as it was: that
// is a system call (about 1 us on a VM with page-table isolation), and five
// points are passed on every step's way.
std::atomic<bool> read_here{false};

void read_armed() {
  const char* spec = std::getenv("CAIRN_CRASH_POINT");
  std::string s = spec ? spec : "";
  const auto colon = s.find(':');
  point.name = s.substr(0, colon);
  point.remaining = !spec ? 0 : colon == std::string::npos ? 1 : std::strtol(s.c_str() + colon + 1, nullptr, 10);
}

armed_point& armed() {
  if (read_here.load(std::memory_order_acquire)) return point;
  std::lock_guard lock(reading);
  if (!read_here.load(std::memory_order_relaxed)) {
    // A child forked while another thread reads gets `reading` unlocked.
    static const int forgotten_by_children = pthread_atfork([] { reading.lock(); }, [] { reading.unlock(); },
                                                            [] {
                                                              read_here.store(false, std::memory_order_relaxed);
                                                              reading.unlock();
                                                            });
    (void)forgotten_by_children;
    read_armed();
    read_here.store(true, std::memory_order_release);
  }
  return point;
}

}  // namespace

void crash_point(std::string_view name) {
  auto& p = armed();
  if (p.remaining.load(std::memory_order_relaxed) <= 0 || p.name != name) return;
  if (p.remaining.fetch_sub(1) == 1) std::raise(SIGKILL);
}

}  // namespace cairn::runtime
