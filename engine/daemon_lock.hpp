// One `cairn serve` per journal: the daemon holds an exclusive flock on
// JOURNAL.serve.lock, a file that names it (pid, host, start time). The lock
// goes with the process however it ends, so a killed daemon never blocks the
// next one.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

namespace cairn::engine {

class daemon_lock {
 public:
  // Takes the lock, or throws engine_error(busy) naming the daemon that has it.
  explicit daemon_lock(const std::filesystem::path& journal);
  ~daemon_lock();
  daemon_lock(const daemon_lock&) = delete;
  daemon_lock& operator=(const daemon_lock&) = delete;

 private:
  int fd_ = -1;
};

// The daemon serving `journal` now ("pid 4121 on host1, since 2026-12-02
// 16:20:11 UTC"), or nullopt when none does.
std::optional<std::string> daemon_holder(const std::filesystem::path& journal);

}  // namespace cairn::engine
