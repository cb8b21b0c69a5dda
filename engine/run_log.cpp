#include "engine/run_log.hpp"

#include <sys/inotify.h>
#include <unistd.h>

#include "storage/journal.hpp"

namespace cairn::engine {

log_change_watch::log_change_watch(const std::filesystem::path& home, const std::filesystem::path& db)
    : fd_(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) {
  if (!fd_) return;
  constexpr auto mask = IN_MODIFY | IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE | IN_DONT_FOLLOW | IN_ONLYDIR;
  for (const auto& folder : {home / "logs", home}) ::inotify_add_watch(fd_.get(), folder.c_str(), mask);
  if (!storage::is_postgres_url(db.string()))
    ::inotify_add_watch(fd_.get(), db.parent_path().c_str(), IN_MODIFY | IN_DONT_FOLLOW | IN_ONLYDIR);
}

void log_change_watch::drain() const {
  char buffer[4096];
  while (::read(fd_.get(), buffer, sizeof buffer) > 0) {
  }
}

}  // namespace cairn::engine
