// What one bwrap sandbox holds on the host besides its processes: a cgroup
// for its totals and the mount of its workspace image; and the warnings for
// what this machine does not allow it to hold. Internal to runtime/.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "runtime/cgroup.hpp"
#include "runtime/sandbox.hpp"
#include "runtime/workspace_quota.hpp"

namespace cairn::runtime {

// bwrap itself and the sandbox's pid 1 run in the cgroup beside the agent.
inline constexpr std::uint64_t bwrap_own_processes = 2;

class sandbox_resources {
 public:
  // `workspace`: canonical. `user`: the sandbox uid when cairn runs as root;
  // the quota image needs it (and root). `quota`: detect_workspace_quota().
  sandbox_resources(sandbox_spec spec, std::filesystem::path workspace, std::optional<sandbox_user> user,
                    quota_support quota);
  ~sandbox_resources() { release(); }

  // Before the first acquire(), for a pooled sandbox: its processes are in
  // `cgroup` already (made with the same limits); `premounted`, when not
  // empty, is where the workspace's image is mounted already.
  void adopt(std::shared_ptr<sandbox_cgroup> cgroup, std::filesystem::path premounted);
  // Makes the cgroup, mounts the workspace image and gives the workspace's
  // files to the sandbox uid; nothing when held already. Throws sandbox_error.
  void acquire();
  // Kills what runs in the cgroup, removes it and unmounts the workspace.
  // Idempotent.
  void release() noexcept;
  // Before release(), for a sandbox whose attempt ends its run, with no
  // process left in it: the workspace's image is released into its folder
  // (release_workspace_image) from the mount this sandbox holds, which goes
  // with it. Throws sandbox_error as that does; the mount goes in any case.
  void release_ending_run();

  // Empty when there is none (or after release()).
  std::shared_ptr<sandbox_cgroup> cgroup() const;
  std::shared_ptr<const mounted_workspace> workspace() const;
  std::vector<std::string> warnings() const;

 private:
  mutable std::mutex mutex_;
  sandbox_spec spec_;
  std::filesystem::path workspace_;
  std::optional<sandbox_user> user_;
  const cgroup_support& cgroups_;
  quota_support quota_;
  std::shared_ptr<sandbox_cgroup> cgroup_;
  workspace_lease lease_;
  std::filesystem::path premounted_;  // for the first acquire() only
  bool held_ = false;
  std::vector<std::string> warnings_;
};

}  // namespace cairn::runtime
