// A cgroup per sandbox: totals of memory, processes and CPU time over
// everything one sandbox runs. Internal to runtime/.
//
// Layout: <hierarchy mount>/<this process's own cgroup>/cairn/<run id>-<pid>-<n>,
// once in each of the memory, pids and cpuacct hierarchies (cgroup v1) or once
// in the unified hierarchy (v2). A host holds an flock on the folders of its
// live sandboxes; a folder that nobody holds belongs to a dead host and is
// swept.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "runtime/unique_fd.hpp"

namespace cairn::runtime {

enum class cgroup_mode { none, v1, v2 };

struct cgroup_support {
  cgroup_mode mode = cgroup_mode::none;
  // The "cairn" folders new sandbox cgroups go into. v1: the memory, pids and
  // cpuacct hierarchies', in that order; v2: one.
  std::vector<std::filesystem::path> parents;
  std::string detail;  // "cgroup v1: memory, pids, cpuacct", or for none what is missing
  std::string fix;     // for none: how to get one
};

// Probed once per process; creates the "cairn" folders it finds writable.
const cgroup_support& detect_cgroups();

// Kills what still runs in the cgroups of dead hosts' sandboxes and removes
// them; returns how many folders went.
std::size_t sweep_orphaned_cgroups(const cgroup_support& support);

// What the kernel counted in one sandbox cgroup since it was made.
struct cgroup_counters {
  std::uint64_t oom_kills = 0;          // processes the OOM killer ended in it
  bool oom_kills_counted = true;        // false: a kernel older than 4.13 that only counts limit hits
  std::uint64_t memory_limit_hits = 0;  // v1 memory.failcnt, v2 memory.events "max"
  std::uint64_t fork_failures = 0;      // forks refused at pids.max
  std::uint64_t cpu_ns = 0;             // CPU time of all its processes, dead ones included
};

class sandbox_cgroup {
 public:
  // Makes the cgroup with these limits. Throws sandbox_error(spawn_failed)
  // naming the file that could not be made or written.
  sandbox_cgroup(const cgroup_support& support, const std::string& run_id, std::uint64_t memory_bytes,
                 std::uint64_t max_tasks);
  ~sandbox_cgroup() { remove(); }
  sandbox_cgroup(const sandbox_cgroup&) = delete;
  sandbox_cgroup& operator=(const sandbox_cgroup&) = delete;

  // The cgroup.procs files, open for writing (copies the caller owns): a
  // process that writes "0" to each joins the cgroup. None after remove().
  std::vector<unique_fd> join_fds() const;
  // Live, or as they were when the cgroup was removed.
  cgroup_counters counters() const;
  // Kills every process in it, waits (about 5 s at most) until none is left
  // and removes its folders, keeping the last counters. Idempotent.
  void remove() noexcept;

 private:
  cgroup_counters read_counters_locked() const;

  mutable std::mutex mutex_;
  cgroup_mode mode_;
  std::vector<std::filesystem::path> folders_;
  std::vector<unique_fd> locks_;  // each folder, flocked while the cgroup lives
  std::vector<unique_fd> procs_;  // each folder's cgroup.procs
  // The files counters() reads, open from the start: a sandbox's start reads
  // them (its baseline), and opening four files by path there cost 0.14 ms.
  // v1: memory.oom_control, memory.failcnt, pids.events, cpuacct.usage;
  // v2: memory.events, -, pids.events, cpu.stat.
  struct counter_files {
    unique_fd memory, memory_hits, pids, cpu;
  } counter_files_;
  std::optional<cgroup_counters> final_;
};

// The processes in the cgroup `folder` (none if it cannot be read).
std::vector<pid_t> cgroup_members(const std::filesystem::path& folder);

// Kills the processes of the cgroup `folder` and waits until it is empty or
// `deadline` passes; then removes it. True if it is gone.
bool empty_and_remove_cgroup(const std::filesystem::path& folder,
                             std::chrono::steady_clock::time_point deadline);

}  // namespace cairn::runtime
