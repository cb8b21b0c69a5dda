#include "runtime/child_process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <thread>

namespace cairn::runtime {
namespace {

void send_sigkill(int pidfd) {
  if (pidfd >= 0) ::syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0);
}

exit_status decode(int wait_status) {
  exit_status s;
  if (WIFEXITED(wait_status)) {
    s.exited = true;
    s.code = WEXITSTATUS(wait_status);
  } else if (WIFSIGNALED(wait_status)) {
    s.signal = WTERMSIG(wait_status);
  }
  return s;
}

// Reaps `h.pid` if it has exited (or, with `block`, once it exits). Before
// reaping, kills what is left of its process group: the zombie leader keeps
// the group id from being recycled, so the signal cannot reach a stranger.
void reap_locked(child_handle& h, bool block) {
  if (h.status) return;
  siginfo_t info{};
  int flags = WEXITED | WNOWAIT | (block ? 0 : WNOHANG);
  while (::waitid(P_PID, static_cast<id_t>(h.pid), &info, flags) < 0) {
    if (errno == EINTR) continue;
    // ECHILD: someone else reaped it (the host must not ignore SIGCHLD).
    h.status = exit_status{};
    return;
  }
  if (info.si_pid == 0) return;  // still running
  ::kill(-h.pid, SIGKILL);
  int wait_status = 0;
  while (::waitpid(h.pid, &wait_status, 0) < 0 && errno == EINTR) {
  }
  h.status = decode(wait_status);
}

}  // namespace

void child_handle::kill_locked() {
  if (status) return;
  ::kill(-pid, SIGKILL);
  if (pidfd)
    send_sigkill(pidfd.get());
  else
    ::kill(pid, SIGKILL);
  send_sigkill(sandbox_init_pidfd.get());
}

void child_tracker::track(const std::shared_ptr<child_handle>& handle) {
  std::lock_guard lock(mutex_);
  std::erase_if(handles_, [](const auto& h) { return h.expired(); });
  handles_.push_back(handle);
}

void child_tracker::kill_all() {
  std::vector<std::shared_ptr<child_handle>> live;
  {
    std::lock_guard lock(mutex_);
    for (const auto& weak : handles_)
      if (auto h = weak.lock()) live.push_back(std::move(h));
  }
  for (const auto& h : live) {
    std::lock_guard lock(h->mutex);
    h->kill_locked();
  }
  // Not reaped here (the agent_process does that): a readable pidfd means exited.
  for (const auto& h : live) {
    std::lock_guard lock(h->mutex);
    if (h->status) continue;
    wait_pidfd(h->pidfd.get(), kill_grace);
    wait_pidfd(h->sandbox_init_pidfd.get(), kill_grace);
  }
}

child_process::child_process(std::shared_ptr<child_handle> handle, unique_fd channel_fd,
                             std::size_t max_frame, std::filesystem::path log_file)
    : handle_(std::move(handle)),
      channel_(channel_fd.release(), max_frame),
      log_file_(std::move(log_file)) {}

child_process::~child_process() {
  try {
    kill();
  } catch (...) {
    // Destructors never throw; kill() only allocates.
  }
}

std::optional<exit_status> child_process::poll_exit() {
  std::lock_guard lock(handle_->mutex);
  reap_locked(*handle_, false);
  return handle_->status;
}

exit_status child_process::kill() {
  std::lock_guard lock(handle_->mutex);
  handle_->kill_locked();
  reap_locked(*handle_, true);
  // Reaping bwrap is not enough: its pid 1 may still be tearing down the
  // namespace. Its pidfd turns readable only once every process there is gone.
  wait_pidfd(handle_->sandbox_init_pidfd.get(), kill_grace);
  return *handle_->status;
}

std::optional<exit_status> child_process::wait_for(std::chrono::milliseconds timeout) {
  if (auto s = poll_exit()) return s;
  if (handle_->pidfd) {
    // The pidfd is only closed by the destructor, so reading it unlocked is safe.
    wait_pidfd(handle_->pidfd.get(), timeout);
    return poll_exit();
  }
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (auto s = poll_exit()) return s;
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::string child_process::log_tail(std::size_t max_bytes) const {
  unique_fd fd(::open(log_file_.c_str(), O_RDONLY | O_CLOEXEC));
  struct stat st {};
  if (!fd || ::fstat(fd.get(), &st) < 0) return {};
  auto size = static_cast<std::size_t>(st.st_size);
  std::size_t n = std::min(size, max_bytes);
  std::string tail(n, '\0');
  ssize_t got = ::pread(fd.get(), tail.data(), n, static_cast<off_t>(size - n));
  tail.resize(got > 0 ? static_cast<std::size_t>(got) : 0);
  return tail;
}

}  // namespace cairn::runtime
