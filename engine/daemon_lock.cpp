#include "engine/daemon_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include <fmt/chrono.h>
#include <fmt/format.h>

#include "engine/engine.hpp"
#include "engine/owner.hpp"

namespace cairn::engine {
namespace {

std::filesystem::path lock_path(const std::filesystem::path& journal) { return journal.string() + ".serve.lock"; }

std::string read_all(int fd) {
  std::string text;
  char buf[512];
  ssize_t n;
  while ((n = ::pread(fd, buf, sizeof buf, static_cast<off_t>(text.size()))) > 0) text.append(buf, n);
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

}  // namespace

daemon_lock::daemon_lock(const std::filesystem::path& journal) {
  const auto path = lock_path(journal);
  std::error_code ec;
  if (journal.has_parent_path()) std::filesystem::create_directories(journal.parent_path(), ec);
  // O_NOFOLLOW and a check before the truncate below: a link or another
  // user's file planted under this name is never cut through.
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd_ < 0)
    throw engine_error(errc::bad_request, fmt::format("cannot open the daemon lock {}: {}{}", path.string(),
                                                      std::strerror(errno),
                                                      errno == ELOOP ? " (it is a symbolic link: remove it)" : ""));
  struct stat st {};
  if (::fstat(fd_, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid() || st.st_nlink != 1) {
    ::close(fd_);
    fd_ = -1;
    throw engine_error(errc::bad_request, fmt::format("the daemon lock {} is not a plain file of yours; remove it",
                                                      path.string()));
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) < 0) {
    std::string holder = read_all(fd_);
    ::close(fd_);
    fd_ = -1;
    throw engine_error(errc::busy, fmt::format("journal {} is already served by {}; stop that daemon first "
                                               "(SIGTERM lets its runs finish their step) or use another --db",
                                               journal.string(), holder.empty() ? "another cairn serve" : holder));
  }
  const auto& me = current_owner();
  std::string text = fmt::format("cairn serve pid {} on {}, since {:%Y-%m-%d %H:%M:%S} UTC\n", me.pid, me.hostname,
                                 fmt::gmtime(std::time(nullptr)));
  if (::ftruncate(fd_, 0) < 0 || ::pwrite(fd_, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size()))
    throw engine_error(errc::bad_request, fmt::format("cannot write the daemon lock {}: {}", path.string(),
                                                      std::strerror(errno)));
}

daemon_lock::~daemon_lock() {
  if (fd_ < 0) return;
  if (::ftruncate(fd_, 0) < 0) {
    // the lock goes with the descriptor either way
  }
  ::close(fd_);
}

std::optional<std::string> daemon_holder(const std::filesystem::path& journal) {
  int fd = ::open(lock_path(journal).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::optional<std::string> holder;
  if (::flock(fd, LOCK_SH | LOCK_NB) < 0) {
    auto text = read_all(fd);
    holder = text.empty() ? "a cairn serve" : text;
  }
  ::close(fd);
  return holder;
}

}  // namespace cairn::engine
