// An ext4 image file mounted at a folder through FUSE, by fuse2fs, for a
// cairn that does not run as root: the workspace quota of a normal user
// (the image bounds what fits, as the loop mount does under root). fuse2fs
// runs as this user, outside every sandbox, in the foreground as a child of
// this process, and mounts through the set-uid fusermount of fuse3. A host
// that dies leaves the daemon serving its mount until the next start's sweep
// unmounts it (as a loop mount stays until then). Internal to runtime/.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <optional>
#include <string>

namespace cairn::runtime {

struct fuse_tools {
  std::filesystem::path fuse2fs;     // from e2fsprogs' fuse2fs package
  std::filesystem::path fusermount;  // fusermount3 (fuse3), or fusermount
};

// fuse2fs and fusermount on this machine, and /dev/fuse open to this user;
// nullopt with `why` set (an actionable sentence) when not.
std::optional<fuse_tools> find_fuse_tools(std::string& why);

class fuse_mount {
 public:
  // Starts fuse2fs on `image` at `target` (nosuid, nodev, as every FUSE
  // mount of a normal user) and returns once the mount is there. Throws
  // sandbox_error(spawn_failed) with fuse2fs's own words when it is not
  // within 30 s.
  fuse_mount(const fuse_tools& tools, const std::filesystem::path& image, const std::filesystem::path& target,
             bool read_only = false);
  // Unmounts (detaching a mount still busy after 3 s), then waits for
  // fuse2fs to write what it holds into the image and exit.
  ~fuse_mount();
  fuse_mount(const fuse_mount&) = delete;
  fuse_mount& operator=(const fuse_mount&) = delete;

 private:
  fuse_tools tools_;
  std::filesystem::path target_;
  pid_t daemon_ = -1;
};

// Whether `folder` is the root of a FUSE mount of `image` (one left behind
// by a host that died, or a live one).
bool is_fuse_mount_of(const std::filesystem::path& folder, const std::filesystem::path& image);

// Unmounts the FUSE mount at `folder` with fusermount -u (-z when busy);
// its daemon then ends by itself. False when it could not.
bool fuse_unmount(const fuse_tools& tools, const std::filesystem::path& folder);

}  // namespace cairn::runtime
