#include "runtime/child_process.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <sstream>
#include <thread>

namespace cairn::runtime {
namespace {

void send_sigkill(int pidfd) {
  if (pidfd >= 0) ::syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0);
}

// Whether a live (not zombie) process has process group `pgid`; from /proc.
bool group_alive(pid_t pgid) {
  DIR* proc = ::opendir("/proc");
  if (!proc) return false;
  std::unique_ptr<DIR, int (*)(DIR*)> guard(proc, ::closedir);
  while (dirent* entry = ::readdir(proc)) {
    if (entry->d_name[0] < '1' || entry->d_name[0] > '9') continue;
    // Plain read(): the process may vanish mid-read, which iostreams turn into a throw.
    unique_fd fd(::open((std::string("/proc/") + entry->d_name + "/stat").c_str(), O_RDONLY | O_CLOEXEC));
    char buffer[512];
    ssize_t n = fd ? ::read(fd.get(), buffer, sizeof buffer) : -1;
    if (n <= 0) continue;
    std::string stat(buffer, static_cast<std::size_t>(n));
    // "pid (comm) state ppid pgrp ...": comm may hold anything, so parse from the last ')'.
    auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(stat.substr(close + 1));
    char state = 0;
    long ppid = 0, pgrp = 0;
    if (fields >> state >> ppid >> pgrp && pgrp == pgid && state != 'Z' && state != 'X') return true;
  }
  return false;
}

exit_status decode(int wait_status, bool exit_codes_carry_signals) {
  exit_status s;
  if (WIFEXITED(wait_status)) {
    s.exited = true;
    s.code = WEXITSTATUS(wait_status);
    if (exit_codes_carry_signals && s.code > 128 && s.code - 128 < NSIG) {
      s.exited = false;
      s.signal = s.code - 128;
      s.code = 0;
    }
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
  h.status = decode(wait_status, h.exit_codes_carry_signals);
}

// P_PIDFD (Linux 5.4), which glibc's idtype_t does not name.
constexpr auto by_pidfd = static_cast<idtype_t>(3);

// bwrap exits with the status its sandbox's pid 1 reports without waiting
// for that pid 1, which the kernel then hands to the host's nearest reaper:
// init, or this process when it is a container's pid 1 or a subreaper, which
// must reap it or keep a zombie per sandbox. Reaps it when it is ours and
// dead; otherwise (ECHILD: init's) leaves it.
void reap_sandbox_init(const child_handle& h) {
  if (!h.sandbox_init_pidfd) return;
  siginfo_t info{};
  while (::waitid(by_pidfd, static_cast<id_t>(h.sandbox_init_pidfd.get()), &info, WEXITED | WNOHANG) < 0 &&
         errno == EINTR) {
  }
}

}  // namespace

void child_handle::wait_dead_locked(std::chrono::milliseconds limit) const {
  auto deadline = std::chrono::steady_clock::now() + limit;
  if (!status) wait_pidfd(pidfd.get(), limit);
  if (sandbox_init_pidfd) {
    // A sandbox's pid 1 ends only after every other process of its pid
    // namespace has: its end is theirs. (Scanning /proc instead costs O(all
    // processes) per kill, which a thousand live sandboxes made minutes.)
    wait_pidfd(sandbox_init_pidfd.get(), limit);
    return;
  }
  // A SIGKILLed process dies when it next runs; the group (the process
  // backend's only boundary) is gone once no member is still running.
  while (!status && group_alive(pid) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

void child_handle::kill_locked() {
  // Through its pidfd the sandbox's pid 1 can be signalled even after bwrap
  // was reaped (say, killed by its parent's death): a recycled pid is safe.
  send_sigkill(sandbox_init_pidfd.get());
  if (status) return;
  // bwrap reaps a pid 1 that was killed, and exits: given a moment, no
  // zombie is left to a pid 1 of the host that may never reap it (a
  // container's, often). One that ended by itself it leaves: end_child reaps it.
  if (sandbox_init_pidfd) wait_pidfd(pidfd.get(), bwrap_exit_grace);
  ::kill(-pid, SIGKILL);
  if (pidfd)
    send_sigkill(pidfd.get());
  else
    ::kill(pid, SIGKILL);
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
    h->wait_dead_locked(kill_grace);
  }
}

child_process::child_process(std::shared_ptr<child_handle> handle, unique_fd channel_fd,
                             std::size_t max_frame, std::unique_ptr<output_log> log,
                             std::unique_ptr<limit_watch> limits)
    : handle_(std::move(handle)),
      channel_(channel_fd.release(), max_frame),
      log_(std::move(log)),
      limits_(std::move(limits)) {}

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

exit_status end_child(child_handle& h) {
  std::lock_guard lock(h.mutex);
  h.kill_locked();
  // Before reaping: reaping bwrap is not enough, its pid 1 may still be
  // tearing down the namespace, and the reaped leader's group id could be
  // recycled.
  h.wait_dead_locked(kill_grace);
  reap_locked(h, true);
  // bwrap reaped, its dead pid 1 has been handed to its new parent.
  reap_sandbox_init(h);
  return *h.status;
}

exit_status child_process::kill() { return end_child(*handle_); }

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

std::string child_process::log_tail(std::size_t max_bytes) const { return log_->tail(max_bytes); }

std::optional<limit_breach> child_process::check_limits() {
  auto status = poll_exit();
  auto breach = limits_->check(status);
  if (breach && !status) kill();
  return breach;
}

}  // namespace cairn::runtime
