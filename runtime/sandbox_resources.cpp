#include "runtime/sandbox_resources.hpp"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "runtime/host_paths.hpp"
#include "runtime/no_follow.hpp"

namespace cairn::runtime {

sandbox_resources::sandbox_resources(sandbox_spec spec, std::filesystem::path workspace,
                                     std::optional<sandbox_user> user, quota_support quota)
    : spec_(std::move(spec)),
      workspace_(std::move(workspace)),
      user_(std::move(user)),
      cgroups_(detect_cgroups()),
      quota_(std::move(quota)) {
  if (cgroups_.mode == cgroup_mode::none)
    warnings_.push_back(fmt::format("resource totals are per process only, {}: to bound the sandbox as a whole, {}",
                                    cgroups_.detail, cgroups_.fix));
  // What acquire() decides: root mounts the image for the sandbox uid,
  // another user through FUSE; none asked (workspace_mb 0), none missed.
  const bool quota_kept = quota_.available && (user_ || quota_.fuse);
  if (!quota_kept && !spec_.workspace_image.empty())
    warnings_.push_back(fmt::format("workspace {} has no size quota ({}): files are bounded one by one "
                                    "(limits.file_mb); {}",
                                    workspace_.string(), quota_.detail, quota_.fix));
}

void sandbox_resources::adopt(std::shared_ptr<sandbox_cgroup> cgroup, std::filesystem::path premounted) {
  std::lock_guard lock(mutex_);
  cgroup_ = std::move(cgroup);
  premounted_ = std::move(premounted);
}

void sandbox_resources::acquire() {
  std::lock_guard lock(mutex_);
  if (held_) return;
  if (!cgroup_ && cgroups_.mode != cgroup_mode::none) {
    try {
      cgroup_ = std::make_shared<sandbox_cgroup>(cgroups_, spec_.run_id, spec_.limits.max_memory_bytes,
                                                 spec_.limits.max_processes + bwrap_own_processes);
    } catch (const sandbox_error& e) {
      // Without it the spawn falls back to rlimits (RLIMIT_NPROC included).
      std::string warning = fmt::format("resource totals are per process only for this sandbox: {}", e.what());
      if (std::find(warnings_.begin(), warnings_.end(), warning) == warnings_.end())
        warnings_.push_back(std::move(warning));
    }
  }
  const auto& image = spec_.workspace_image;
  // Root mounts it for the sandbox uid; another user, through FUSE, for itself.
  const bool quota = quota_.available && (user_ || quota_.fuse) && !image.empty();
  if (!quota && !image.empty() && std::filesystem::exists(image))
    throw sandbox_error(sandbox_errc::workspace_failed,
                        fmt::format("the files of workspace {} are in its quota image {}, which cannot be mounted "
                                    "here ({}): {}",
                                    workspace_.string(), image.string(), quota_.detail,
                                    quota_.fix.empty() ? "run cairn as root, as when the run began" : quota_.fix));
  if (!lease_ && quota) {
    open_folder_no_follow(image.parent_path(), 0700);
    auto mounted = mount_workspace_image(quota_, workspace_, image, spec_.limits.max_workspace_bytes,
                                         user_ ? user_->uid : ::getuid(), user_ ? user_->gid : ::getgid(),
                                         std::exchange(premounted_, {}));
    lease_ = std::move(mounted.lease);
    for (auto& warning : mounted.warnings)
      if (std::find(warnings_.begin(), warnings_.end(), warning) == warnings_.end())
        warnings_.push_back(std::move(warning));
  }
  // Again after each release(): the host may have put files into the folder.
  if (user_) chown_tree(workspace_, user_->uid, user_->gid);
  held_ = true;
}

void sandbox_resources::release() noexcept {
  std::lock_guard lock(mutex_);
  if (cgroup_) cgroup_->remove();
  cgroup_.reset();
  lease_ = workspace_lease();
  held_ = false;
}

void sandbox_resources::release_ending_run() {
  std::lock_guard lock(mutex_);
  if (lease_) release_workspace_image(workspace_, spec_.workspace_image, &lease_);
}

std::shared_ptr<sandbox_cgroup> sandbox_resources::cgroup() const {
  std::lock_guard lock(mutex_);
  return cgroup_;
}

std::shared_ptr<const mounted_workspace> sandbox_resources::workspace() const {
  std::lock_guard lock(mutex_);
  return lease_.mount();
}

std::vector<std::string> sandbox_resources::warnings() const {
  std::lock_guard lock(mutex_);
  return warnings_;
}

}  // namespace cairn::runtime
