#include "runtime/limit_watch.hpp"

#include <signal.h>

#include <fmt/format.h>

namespace cairn::runtime {
namespace {

constexpr std::uint64_t mib = 1 << 20;

// "256 MiB", "1.5 MiB", "512 KiB"
std::string size_text(std::uint64_t bytes) {
  if (bytes % mib == 0) return fmt::format("{} MiB", bytes / mib);
  if (bytes >= mib) return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / mib);
  return fmt::format("{} KiB", bytes >> 10);
}

bool killed_by(const std::optional<exit_status>& exit, int signal) {
  return exit && !exit->exited && exit->signal == signal;
}

}  // namespace

limit_watch::limit_watch(resource_limits limits, std::shared_ptr<sandbox_cgroup> cgroup,
                         std::shared_ptr<const mounted_workspace> workspace)
    : limits_(limits), cgroup_(std::move(cgroup)), workspace_(std::move(workspace)) {
  // The cgroup outlives one agent (a sandbox may exec again): only what
  // happened since this one started counts against it.
  if (cgroup_) baseline_ = cgroup_->counters();
}

std::optional<limit_breach> limit_watch::check(const std::optional<exit_status>& exit) {
  std::lock_guard lock(mutex_);
  if (!breach_) breach_ = find(exit);
  return breach_;
}

std::optional<limit_breach> limit_watch::find(const std::optional<exit_status>& exit) const {
  const resource_limits& l = limits_;
  if (cgroup_) {
    cgroup_counters now = cgroup_->counters();
    bool oom_killed = now.oom_kills_counted
                          ? now.oom_kills > baseline_.oom_kills
                          : now.memory_limit_hits > baseline_.memory_limit_hits && killed_by(exit, SIGKILL);
    if (oom_killed)
      return limit_breach{"memory", fmt::format("memory limit exceeded: the sandbox reached its {} limit and the "
                                                "kernel killed a process; raise limits.memory_mb",
                                                size_text(l.max_memory_bytes))};
    if (now.fork_failures > baseline_.fork_failures)
      return limit_breach{"processes", fmt::format("process limit exceeded: the sandbox reached its limit of {} "
                                                   "processes and threads and a fork failed; raise "
                                                   "limits.processes",
                                                   l.max_processes)};
    // The cgroup's whole total, not since the baseline: what a pooled
    // sandbox used while it waited for this run is this run's (warm_pool.hpp
    // bounds it).
    if (l.max_cpu_seconds > 0 && now.cpu_ns > l.max_cpu_seconds * 1'000'000'000)
      return limit_breach{"cpu", fmt::format("cpu limit exceeded: the sandbox used {:.1f} s of CPU time, more "
                                             "than its {} s; raise limits.cpu_seconds",
                                             static_cast<double>(now.cpu_ns) / 1e9, l.max_cpu_seconds)};
  }
  if (workspace_ && workspace_->full())
    return limit_breach{"workspace", fmt::format("workspace limit exceeded: /workspace is full at its {} quota; "
                                                 "raise limits.workspace_mb",
                                                 size_text(workspace_->quota_bytes()))};
  if (killed_by(exit, SIGXFSZ))
    return limit_breach{"file_size", fmt::format("file size limit exceeded: the agent wrote past {} in one file "
                                                 "and was killed (SIGXFSZ); raise limits.file_mb",
                                                 size_text(l.max_file_bytes))};
  if (killed_by(exit, SIGXCPU))
    return limit_breach{"cpu", fmt::format("cpu limit exceeded: the agent used more than {} s of CPU time and "
                                           "was killed (SIGXCPU); raise limits.cpu_seconds",
                                           l.max_cpu_seconds)};
  return std::nullopt;
}

}  // namespace cairn::runtime
