// Whether a sandbox ran into one of its limits, for
// agent_process::check_limits(): judged from its cgroup's counters since the
// agent started, the free space of its workspace image and how the agent
// died. Each message names the limit and the policy key that raises it.
// Internal to runtime/.
#pragma once

#include <memory>
#include <mutex>
#include <optional>

#include "runtime/cgroup.hpp"
#include "runtime/sandbox.hpp"
#include "runtime/workspace_quota.hpp"

namespace cairn::runtime {

class limit_watch {
 public:
  // Either pointer may be empty: no cgroup (totals per process only), no
  // quota image.
  limit_watch(resource_limits limits, std::shared_ptr<sandbox_cgroup> cgroup,
              std::shared_ptr<const mounted_workspace> workspace);

  // The first breach found, and from then on always that one. `exit`: the
  // agent's status once it has ended.
  std::optional<limit_breach> check(const std::optional<exit_status>& exit);

 private:
  std::optional<limit_breach> find(const std::optional<exit_status>& exit) const;

  std::mutex mutex_;
  resource_limits limits_;
  std::shared_ptr<sandbox_cgroup> cgroup_;
  std::shared_ptr<const mounted_workspace> workspace_;
  cgroup_counters baseline_;
  std::optional<limit_breach> breach_;
};

}  // namespace cairn::runtime
