#include "runtime/cgroup.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "runtime/sandbox.hpp"
#include "runtime/small_file.hpp"
#include "runtime/spawn.hpp"

namespace cairn::runtime {
namespace {

namespace fs = std::filesystem;

constexpr std::chrono::milliseconds poll_step{5};
constexpr std::chrono::seconds removal_grace{5};
constexpr int max_name_attempts = 100;

[[noreturn]] void failed(const std::string& what) {
  throw sandbox_error(sandbox_errc::spawn_failed, fmt::format("{}: {}", what, std::strerror(errno)));
}

// The run id as a folder name: at most 64 of [A-Za-z0-9._-], others as '_'.
std::string folder_name(const std::string& run_id) {
  std::string name = run_id.substr(0, 64);
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') c = '_';
  return name.empty() ? "run" : name;
}

std::uint64_t number_in(const unique_fd& file) {
  return std::strtoull(read_small_fd(file.get()).value_or("0").c_str(), nullptr, 10);
}

std::string text_of(const unique_fd& file) { return read_small_fd(file.get()).value_or(""); }

unique_fd open_in(const unique_fd& folder, const char* name) {
  return unique_fd(::openat(folder.get(), name, O_RDONLY | O_CLOEXEC));
}

void write_limit(const fs::path& file, std::uint64_t value) {
  if (!write_small_file(file, std::to_string(value))) failed("setting " + file.string());
}

bool file_exists(const fs::path& file) { return ::access(file.c_str(), F_OK) == 0; }

}  // namespace

std::vector<pid_t> cgroup_members(const fs::path& folder) {
  std::vector<pid_t> pids;
  std::istringstream in(read_small_file(folder / "cgroup.procs").value_or(""));
  for (pid_t pid; in >> pid;) pids.push_back(pid);
  return pids;
}

bool empty_and_remove_cgroup(const fs::path& folder, std::chrono::steady_clock::time_point deadline) {
  // cgroup v2 since Linux 5.14 kills them all at once; v1 has no such file.
  write_small_file(folder / "cgroup.kill", "1");
  for (;;) {
    auto pids = cgroup_members(folder);
    if (pids.empty()) {
      if (::rmdir(folder.c_str()) == 0 || errno == ENOENT) return true;
      if (errno != EBUSY) return false;
    }
    std::vector<unique_fd> pidfds;
    for (pid_t pid : pids) pidfds.push_back(open_pidfd(pid));
    // Only those still listed once their pidfd is open: a pid that left
    // before may be a stranger's by now.
    auto still = cgroup_members(folder);
    for (std::size_t i = 0; i < pids.size(); ++i)
      if (pidfds[i] && std::find(still.begin(), still.end(), pids[i]) != still.end())
        ::syscall(SYS_pidfd_send_signal, pidfds[i].get(), SIGKILL, nullptr, 0);
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(poll_step);
  }
}

sandbox_cgroup::sandbox_cgroup(const cgroup_support& support, const std::string& run_id,
                               std::uint64_t memory_bytes, std::uint64_t max_tasks)
    : mode_(support.mode) {
  if (mode_ == cgroup_mode::none)
    throw sandbox_error(sandbox_errc::spawn_failed, "no cgroup hierarchy is usable: " + support.detail);
  static std::atomic<unsigned> counter{0};
  const std::string base = folder_name(run_id) + "-" + std::to_string(::getpid()) + "-";
  try {
    for (const auto& parent : support.parents) {
      for (int attempt = 0;; ++attempt) {
        if (attempt == max_name_attempts) failed("creating a cgroup in " + parent.string());
        fs::path folder = parent / (base + std::to_string(counter++));
        if (::mkdir(folder.c_str(), 0755) < 0) {
          if (errno == EEXIST) continue;
          failed("creating cgroup " + folder.string());
        }
        // Between mkdir and flock another host's sweep may take the folder
        // for a dead host's and remove it: then make another.
        unique_fd lock(::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        if (!lock || ::flock(lock.get(), LOCK_EX | LOCK_NB) < 0) continue;
        unique_fd procs(::openat(lock.get(), "cgroup.procs", O_WRONLY | O_CLOEXEC));
        if (!procs) continue;
        folders_.push_back(folder);
        locks_.push_back(std::move(lock));
        procs_.push_back(std::move(procs));
        break;
      }
    }
    const fs::path& first = folders_.front();
    if (mode_ == cgroup_mode::v1) {
      write_limit(first / "memory.limit_in_bytes", memory_bytes);
      // Without it swapping would let the sandbox hold more than its limit.
      if (file_exists(first / "memory.memsw.limit_in_bytes"))
        write_limit(first / "memory.memsw.limit_in_bytes", memory_bytes);
      write_limit(folders_[1] / "pids.max", max_tasks);
      counter_files_ = {open_in(locks_[0], "memory.oom_control"), open_in(locks_[0], "memory.failcnt"),
                        open_in(locks_[1], "pids.events"), open_in(locks_[2], "cpuacct.usage")};
    } else {
      write_limit(first / "memory.max", memory_bytes);
      if (file_exists(first / "memory.swap.max")) write_limit(first / "memory.swap.max", 0);
      write_limit(first / "pids.max", max_tasks);
      counter_files_ = {open_in(locks_[0], "memory.events"), {}, open_in(locks_[0], "pids.events"),
                        open_in(locks_[0], "cpu.stat")};
    }
  } catch (...) {
    remove();
    throw;
  }
}

std::vector<unique_fd> sandbox_cgroup::join_fds() const {
  std::lock_guard lock(mutex_);
  std::vector<unique_fd> fds;
  for (const auto& fd : procs_) {
    fds.emplace_back(::fcntl(fd.get(), F_DUPFD_CLOEXEC, 0));
    if (!fds.back()) failed("duplicating a cgroup.procs fd");
  }
  return fds;
}

cgroup_counters sandbox_cgroup::counters() const {
  std::lock_guard lock(mutex_);
  return final_ ? *final_ : read_counters_locked();
}

cgroup_counters sandbox_cgroup::read_counters_locked() const {
  cgroup_counters c;
  if (folders_.empty()) return c;
  const auto& f = counter_files_;
  c.fork_failures = keyed_value(text_of(f.pids), "max").value_or(0);
  if (mode_ == cgroup_mode::v1) {
    auto oom = keyed_value(text_of(f.memory), "oom_kill");
    c.oom_kills_counted = oom.has_value();
    c.oom_kills = oom.value_or(0);
    c.memory_limit_hits = number_in(f.memory_hits);
    c.cpu_ns = number_in(f.cpu);
  } else {
    std::string events = text_of(f.memory);
    c.oom_kills = keyed_value(events, "oom_kill").value_or(0);
    c.memory_limit_hits = keyed_value(events, "max").value_or(0);
    c.cpu_ns = 1000 * keyed_value(text_of(f.cpu), "usage_usec").value_or(0);
  }
  return c;
}

void sandbox_cgroup::remove() noexcept {
  std::lock_guard lock(mutex_);
  if (folders_.empty()) return;
  try {
    final_ = read_counters_locked();
    procs_.clear();
    counter_files_ = {};
    auto deadline = std::chrono::steady_clock::now() + removal_grace;
    // One left behind (a process stuck in the kernel) is swept once its lock is gone.
    for (const auto& folder : folders_) empty_and_remove_cgroup(folder, deadline);
  } catch (...) {
    // Destructors call this; it only allocates.
  }
  locks_.clear();
  folders_.clear();
}

}  // namespace cairn::runtime
