// clone/exec of a sandbox's first process, shared by both backends. Internal
// to runtime/.
//
// The child gets: its own session and process group; SIGKILL when the thread
// that spawned it dies (PR_SET_PDEATHSIG); fd 0 = /dev/null, fds 1 and 2 =
// `log_fd`, fd 3 = its end of a new socketpair (the channel), fds 4, 5, ... =
// `extra_fds` in order, nothing else; default signal dispositions and an empty
// signal mask; membership of the cgroups in `join_cgroups`, joined before
// anything else so that nothing it starts escapes them; rlimits from
// `limits` (see spawn.cpp) plus RLIMIT_CORE 0; optionally an unprivileged
// uid/gid (no supplementary groups); exactly `env` as environment.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "runtime/sandbox.hpp"
#include "runtime/unique_fd.hpp"

namespace cairn::runtime {

struct spawn_identity {
  uid_t uid;
  gid_t gid;
};

struct spawn_request {
  std::vector<std::string> argv;  // argv[0] is executed as given: an absolute path
  std::vector<std::string> env;   // "NAME=value", the whole environment
  std::filesystem::path cwd;      // empty: inherit the host's
  int log_fd = -1;                // stdout and stderr; stays owned by the caller
  std::vector<int> extra_fds;     // stay owned by the caller; at most 8
  // cgroup.procs files open for writing (sandbox_cgroup::join_fds); stay
  // owned by the caller. Nonempty: the cgroup counts processes, so
  // RLIMIT_NPROC (which counts all of the uid's, across sandboxes) is not set.
  std::vector<int> join_cgroups;
  resource_limits limits;
  std::optional<spawn_identity> run_as;  // requires root
};

struct spawned_child {
  pid_t pid = -1;
  unique_fd channel;  // the parent's end of the socketpair
  unique_fd pidfd;    // empty when the kernel lacks pidfd_open
};

// Returns once argv[0] has been exec'd. Throws sandbox_error(spawn_failed)
// naming the step that failed ("exec /usr/bin/bwrap: No such file or
// directory"); the failed child is reaped before the throw.
spawned_child spawn_child(const spawn_request& request);

// A pidfd for `pid` (any process), or an empty fd when unsupported or gone.
unique_fd open_pidfd(pid_t pid);

// Waits until `pidfd` is readable (its process has exited) or `timeout`
// passes; true if it exited. An empty fd counts as exited.
bool wait_pidfd(int pidfd, std::chrono::milliseconds timeout);

}  // namespace cairn::runtime
