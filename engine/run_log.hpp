// A run's log as `cairn logs` follows it: the reader of HOME/logs/ID.log
// (runtime/log_reader.hpp) and a watch that wakes a follower when the log
// or the journal may have changed.
#pragma once

#include <filesystem>

#include "runtime/log_reader.hpp"
#include "runtime/unique_fd.hpp"

namespace cairn::engine {

using run_log_reader = runtime::log_reader;

// An inotify descriptor that becomes readable when the logs folder (or the
// home, before that folder exists) or, for a SQLite journal `db`, the
// journal's folder changes. It follows no link it is given; false when
// inotify is not available (a follower then only looks at its pace).
class log_change_watch {
 public:
  log_change_watch(const std::filesystem::path& home, const std::filesystem::path& db);
  explicit operator bool() const { return static_cast<bool>(fd_); }
  int fd() const { return fd_.get(); }
  // Reads away what woke it.
  void drain() const;

 private:
  runtime::unique_fd fd_;
};

}  // namespace cairn::engine
