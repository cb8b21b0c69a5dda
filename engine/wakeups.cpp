#include "engine/wakeups.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <memory>
#include <mutex>
#include <system_error>

namespace cairn::engine {
namespace {

std::mutex registry_mutex;
std::multimap<std::string, const wake_event*> registry;

struct shared_listener {
  int holders = 0;
  std::unique_ptr<storage::wake_listener> listener;
};
std::mutex listeners_mutex;
std::map<std::filesystem::path, shared_listener> listeners;

}  // namespace

wake_event::wake_event() : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (fd_ < 0) throw std::system_error(errno, std::generic_category(), "eventfd for wake-ups");
}

wake_event::~wake_event() {
  if (fd_ >= 0) ::close(fd_);
}

wake_event::wake_event(wake_event&& other) noexcept
    : fd_(other.fd_), signalled_(other.signalled_.load(std::memory_order_acquire)) {
  other.fd_ = -1;
}

void wake_event::signal() const noexcept {
  const std::uint64_t one = 1;
  // Fails only when the counter would overflow: it is signalled then anyway.
  [[maybe_unused]] auto n = ::write(fd_, &one, sizeof one);
  // After the write: a take() that sees the flag finds the counter set.
  signalled_.store(true, std::memory_order_release);
}

bool wake_event::take() const noexcept {
  // A signal still between its write and its flag is taken by the next
  // take(), which the readable eventfd brings about.
  if (!signalled_.exchange(false, std::memory_order_acq_rel)) return false;
  std::uint64_t count = 0;
  return ::read(fd_, &count, sizeof count) == sizeof count;
}

bool wake_event::wait_until(clock::time_point until) const {
  for (;;) {
    if (take()) return true;
    const int timeout = poll_timeout(until);
    if (timeout == 0) return false;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, timeout) < 0 && errno != EINTR)
      throw std::system_error(errno, std::generic_category(), "poll on a wake-up");
  }
}

wake_registration::wake_registration(std::string run_id, const wake_event& event)
    : run_id_(std::move(run_id)), event_(event) {
  std::lock_guard lock(registry_mutex);
  registry.emplace(run_id_, &event_);
}

wake_registration::~wake_registration() {
  std::lock_guard lock(registry_mutex);
  auto [first, last] = registry.equal_range(run_id_);
  for (auto it = first; it != last; ++it)
    if (it->second == &event_) {
      registry.erase(it);
      return;
    }
}

void wake_run(const std::string& run_id) {
  std::lock_guard lock(registry_mutex);
  for (const auto& key : {run_id, std::string()}) {
    auto [first, last] = registry.equal_range(key);
    for (auto it = first; it != last; ++it) it->second->signal();
  }
}

void wake_all() {
  std::lock_guard lock(registry_mutex);
  for (const auto& [id, event] : registry) event->signal();
}

wake_listening::wake_listening(std::filesystem::path db) : db_(std::move(db)) {
  std::lock_guard lock(listeners_mutex);
  auto& shared = listeners[db_];
  if (!shared.listener) {
    try {
      shared.listener = std::make_unique<storage::wake_listener>(
          db_, [](const std::string& run_id, storage::change) {
            // No run id: the listener may have missed hints (PostgreSQL's
            // LISTEN reconnected after a restart): everyone re-reads.
            if (run_id.empty()) wake_all();
            else wake_run(run_id);
          });
    } catch (...) {
      listeners.erase(db_);
      throw;
    }
  }
  ++shared.holders;
}

wake_listening::~wake_listening() {
  std::lock_guard lock(listeners_mutex);
  auto it = listeners.find(db_);
  if (it != listeners.end() && --it->second.holders == 0) listeners.erase(it);
}

void announce(const std::filesystem::path& db, const std::string& run_id, storage::change what) {
  wake_run(run_id);
  storage::notify(db, run_id, what);
}

void stop_flag::wait() const {
  pollfd p{fd(), POLLIN, 0};
  while (!raised())
    if (::poll(&p, 1, -1) < 0 && errno != EINTR)
      throw std::system_error(errno, std::generic_category(), "poll on a stop flag");
}

}  // namespace cairn::engine
