#include "engine/attempt_events.hpp"

#include <sys/epoll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

namespace cairn::engine {
namespace {

void add(int epoll, int fd) {
  epoll_event e{};
  e.events = EPOLLIN;
  e.data.fd = fd;
  if (::epoll_ctl(epoll, EPOLL_CTL_ADD, fd, &e) != 0)
    throw std::system_error(errno, std::generic_category(), "epoll_ctl for an attempt's wake-ups");
}

}  // namespace

attempt_events::attempt_events(const std::string& run_id, const std::filesystem::path& db)
    : listening_(db),
      registration_(run_id, wake_), epoll_(::epoll_create1(EPOLL_CLOEXEC)) {
  if (epoll_ < 0) throw std::system_error(errno, std::generic_category(), "epoll_create1 for an attempt's wake-ups");
  add(epoll_, wake_.fd());
}

attempt_events::~attempt_events() {
  for (int fd : {epoll_, process_})
    if (fd >= 0) ::close(fd);
}

void attempt_events::watch_process(pid_t pid) {
  process_ = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (process_ >= 0) add(epoll_, process_);
}

}  // namespace cairn::engine
