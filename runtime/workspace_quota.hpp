// The size quota of a workspace: the run's files live in an ext4 image the
// engine names (CAIRN_HOME/images/RUN_ID.img, out of every workspace;
// sparse, copied once from a template kept in the same folder, its root
// owned by the sandbox uid), mounted at the folder while a sandbox uses it
// (through a loop device as root, through FUSE by fuse2fs otherwise), and turned back into
// a plain folder by release_workspace_image() once the run is over. The image
// stays out of the sandbox's sight: only the folder is mounted into it.
//
// Files found in the plain folder when the image is mounted (a workspace the
// user filled before the first run, files put there between attempts) are
// moved into the image; where both hold a name, the folder's file wins.
// Internal to runtime/.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "runtime/fuse_mount.hpp"
#include "runtime/loop_mount.hpp"
#include "runtime/own_records.hpp"
#include "runtime/sandbox.hpp"
#include "runtime/unique_fd.hpp"
#include "runtime/workspace_template.hpp"

namespace cairn::runtime {

struct quota_support {
  bool available = false;
  std::string detail;  // "ext4 image per run (...)" or "unavailable: <why>"
  std::string fix;     // when unavailable
  ext4_tools tools;
  std::optional<fuse_tools> fuse;  // set: images are mounted through FUSE (not root)
};
// Needs mkfs.ext4, and as root /dev/loop-control, as another user fuse2fs,
// fusermount and /dev/fuse (fuse_mount.hpp); uses debugfs when installed.
// Cheap: no image is made.
quota_support detect_workspace_quota();

// An image mounted at its workspace folder; unmounted when destroyed.
class mounted_workspace {
 public:
  // Throws sandbox_error: bad_spec (another process holds the image, the
  // folder's files do not fit), workspace_failed (another filesystem is
  // mounted at the folder, no loop device, mount(2) failed).
  // `premounted`: the image is mounted there already (a pooled sandbox's
  // folder); the folder becomes another mount of it, no loop device taken.
  // `fuse`: mount through fuse2fs (premounted is then empty).
  mounted_workspace(const std::filesystem::path& folder, const std::filesystem::path& image,
                    std::uint64_t quota_bytes, const std::filesystem::path& premounted = {},
                    const std::optional<fuse_tools>& fuse = std::nullopt);
  mounted_workspace(const mounted_workspace&) = delete;
  mounted_workspace& operator=(const mounted_workspace&) = delete;

  ~mounted_workspace() { unmount(); }

  std::uint64_t quota_bytes() const { return quota_bytes_; }  // limits.max_workspace_bytes
  // While mounted: more than the quota in use, no room left for data (under
  // 128 KiB) or no free inode. The image is a margin larger than the quota,
  // so a filling agent passes the quota before it sees ENOSPC.
  bool full() const;
  // Idempotent; afterwards full() is false.
  void unmount();
  // For an image whose files are copied out, about to be deleted: leaves
  // the folder at once, without the flush an unmount does. The filesystem
  // lives on (its lock and record held) in what this returns, until that is
  // handed to discard_image(). Through FUSE, unmounts as unmount() does.
  struct retired;
  std::shared_ptr<retired> retire();

 private:
  std::filesystem::path folder_;
  unique_fd image_lock_;  // flocked: one process at a time mounts an image
  std::unique_ptr<own_record> record_;  // from before the mount until after the unmount (or the discard)
  std::optional<loop_mount> mount_;
  std::optional<fuse_mount> fuse_mount_;
  std::uint64_t quota_bytes_ = 0;
  std::atomic<bool> mounted_{false};
  std::mutex unmount_mutex_;  // the flush and its count happen once
};

// What a sandbox holds while it uses a workspace's image. The sandboxes of
// one workspace in this process share one mount, unmounted when the last
// lease goes.
class workspace_lease {
 public:
  workspace_lease() = default;  // no image: the plain folder
  workspace_lease(std::filesystem::path folder, std::shared_ptr<mounted_workspace> mount)
      : folder_(std::move(folder)), mount_(std::move(mount)) {}
  ~workspace_lease() { release(); }
  workspace_lease(workspace_lease&& other) noexcept = default;
  workspace_lease& operator=(workspace_lease&& other) noexcept;

  explicit operator bool() const { return mount_ != nullptr; }
  // Outlives the lease; once unmounted it reports nothing.
  std::shared_ptr<const mounted_workspace> mount() const { return mount_; }

 private:
  friend void release_workspace_image(const std::filesystem::path&, const std::filesystem::path&, workspace_lease*);
  void release() noexcept;
  void release_locked() noexcept;  // release(), the folder's lock held

  std::filesystem::path folder_;
  std::shared_ptr<mounted_workspace> mount_;
};

struct workspace_mount_result {
  workspace_lease lease;  // empty: the plain folder is used, a warning says why
  std::vector<std::string> warnings;
};

// Readies the image just mounted at `folder` for an agent: noatime (else
// reads, the agent's or a release's copy, update atimes, and committing
// them costs the unmount several flushes) and no lost+found (mkfs makes it
// for fsck; kept when fsck filled it). A mount made from this one (a bind)
// has it ready: a pool readies its image when it mounts it, before its
// sandbox copies the mount, and the run that takes it need not.
void ready_image_mount(const std::filesystem::path& folder);

// Mounts the image of `workspace` (a canonical folder), making it first if
// missing (make_workspace_image) with `bytes` and its root owned by uid:gid.
// An existing image keeps its size (a warning says so when `bytes` differs).
// When a new image cannot be made or mounted (mkfs.ext4 fails, no free loop
// device) it is dropped, with its template, and the plain folder used, with
// a warning. Throws sandbox_error as mounted_workspace does; for an existing
// image always: its files are in there. `premounted`: where the image is
// mounted already, readied (a pooled sandbox's); bound from there.
workspace_mount_result mount_workspace_image(const quota_support& support, const std::filesystem::path& workspace,
                                             const std::filesystem::path& image, std::uint64_t bytes, uid_t uid,
                                             gid_t gid, const std::filesystem::path& premounted = {});

// Leaves `workspace` a plain folder holding the image's files, then deletes
// the image. The files are copied beside the folder and synced; from then on
// that copy holds them, and the image is never flushed: its mount is
// detached at once, and a background thread flushes, unmounts and deletes
// it, off the path of the run that ends. Nothing to do without an image. A
// crash at any point leaves the image, or the synced copy (which wins over
// the image), or the released folder: calling it again, or mounting the
// workspace again, finishes the job.
// `mounted`: the lease of the sandbox that used the image, whose processes
// are gone: the files are copied from its mount, which then goes, rather
// than from a mount made for the copy (one mount and unmount fewer); it is
// released in any case. Throws sandbox_error: bad_spec while another
// sandbox of this process still uses the workspace, workspace_failed when
// copying fails.
void release_workspace_image(const std::filesystem::path& workspace, const std::filesystem::path& image,
                             workspace_lease* mounted = nullptr);

// The copy of the files a release of `image` synced whole beside
// `workspace` and a crash kept from taking its place (the next release or
// mount finishes that): until then it, not the folder or the image, holds
// the run's files. nullopt when there is none; a folder of that name which
// no release of `image` made (its record beside the image names another)
// is not one.
std::optional<std::filesystem::path> cut_short_release(const std::filesystem::path& workspace,
                                                       const std::filesystem::path& image);

// Every path that may hold files of the run whose workspace is `workspace`
// and quota image `image`: those two, and what a release that a crash cut
// short leaves beside them (its synced copy, the record of that copy). What
// removing an ended run deletes. Not the staging folder WS.released: that
// name may be another run's workspace (a run id may end in ".released").
std::vector<std::filesystem::path> run_file_paths(const std::filesystem::path& workspace,
                                                  const std::filesystem::path& image);

// Moves the image `from` (where an earlier layout kept it) to `to`, when
// there is one and `to` does not exist yet; the lock of a live mount is
// waited for as a mount waits. Why it could not (another filesystem, held
// by a live process), or nullopt once done or when there was nothing to move.
std::optional<std::string> adopt_image(const std::filesystem::path& from, const std::filesystem::path& to);

// What mounting and unmounting the image of `workspace` has cost so far.
workspace_upkeep workspace_upkeep_of(const std::filesystem::path& workspace);

// The size of the image for a quota of `quota` bytes: a margin larger, since
// ext4 keeps room for metadata and pending allocations, so "no space left"
// comes at an uncertain distance before the image's end. Passing the quota is
// what ends the sandbox; the margin makes sure a filling agent gets there
// before it sees ENOSPC.
std::uint64_t workspace_image_size(std::uint64_t quota);

// Unmounts the workspace images that dead hosts left mounted (a mount cairn
// recorded, own_records.hpp, whose image nobody holds locked), freeing their
// loop devices; returns how many. The files stay in the images. Deletes the
// images those hosts had renamed for deletion (their runs over, the files
// copied out) and did not live to delete. A mount cairn did not record is
// never touched, whatever its names.
std::size_t sweep_orphaned_workspace_mounts();

}  // namespace cairn::runtime
