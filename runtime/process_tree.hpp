// What a tree of processes has used of the CPU, as /proc shows it: for a
// sandbox without a cgroup, whose totals the kernel does not keep. Internal
// to runtime/.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <vector>

namespace cairn::runtime {

// For each of `roots`: the CPU time of the root and of every live process
// below it, and of the children those have reaped. What a process that has
// died but was not reaped yet used is missing (a sandbox's pid 1 reaps at
// once). Zero for a root that is gone. One scan of /proc for all of them.
std::vector<std::chrono::nanoseconds> tree_cpu_times(const std::vector<pid_t>& roots);

}  // namespace cairn::runtime
