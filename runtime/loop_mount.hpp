// An ext4 image file mounted at a folder through a loop device. Done with
// the loop ioctls and mount(2) rather than `mount -o loop`: no helper to
// find, and every failure comes back as an errno naming the step. Internal
// to runtime/.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <optional>

#include "runtime/unique_fd.hpp"

namespace cairn::runtime {

class loop_mount {
 public:
  // Attaches `image` to a free loop device (freed by the kernel once
  // unmounted: LO_FLAGS_AUTOCLEAR) and mounts it nosuid,nodev at `target`.
  // First waits (up to 10 s) until no earlier mount of `image` is left: one
  // image never has two live filesystems. The file IMAGE.attached marks the
  // image from before it is attached until a clean unmount, so only a marked
  // image is searched for among the loop devices. Requires root. Throws
  // sandbox_error(spawn_failed) naming the step.
  loop_mount(const std::filesystem::path& image, const std::filesystem::path& target);
  // `image` is mounted already, through a loop device, at `source` (a pooled
  // sandbox's folder): `target` becomes another mount of that filesystem.
  loop_mount(const std::filesystem::path& image, const std::filesystem::path& target,
             const std::filesystem::path& source);
  // Unmounts; a mount still busy is detached and goes once its last user does.
  ~loop_mount();
  // The image (renamed to `image`, with its marker) and its mount belong to
  // someone else now: the destructor leaves them.
  void give_away(const std::filesystem::path& image);
  // Takes the mount out of every tree at once, without its flush, for an
  // image about to be deleted: the filesystem lives on, held by the
  // returned descriptor (O_PATH, its root), and is flushed, unmounted and
  // its loop device freed when that is closed. The destructor then leaves
  // the image as it is, marker included. Throws sandbox_error(spawn_failed).
  unique_fd detach();
  loop_mount(const loop_mount&) = delete;
  loop_mount& operator=(const loop_mount&) = delete;

 private:
  std::filesystem::path image_;
  std::filesystem::path target_;
};

// Mounts `image` read-only at `target` through a read-only loop device,
// without replaying its journal (noload): nothing is ever written to it, so
// a sandbox may mount it at the same time. Call it inside
// enter_private_mount_namespace(): the mount, and with it the device, goes
// with the process. Requires root. Throws sandbox_error(spawn_failed).
void mount_image_read_only(const std::filesystem::path& image, const std::filesystem::path& target);
// Puts this (single-threaded) process in a mount namespace of its own whose
// mounts propagate nowhere. Throws sandbox_error(spawn_failed).
void enter_private_mount_namespace();

// IMAGE.attached: see loop_mount. Whoever deletes an image deletes it too.
std::filesystem::path attached_marker(const std::filesystem::path& image);

// Whether `folder` is the root of a mount of `image` through a loop device
// (a mount left behind by a host that died).
bool is_loop_mount_of(const std::filesystem::path& folder, const std::filesystem::path& image);

// The image file behind the loop device mounted at `folder`; nullopt when
// `folder` is no mount root of a loop device.
std::optional<std::filesystem::path> loop_backing_file(const std::filesystem::path& folder);

// Unmounts whatever is mounted at `folder`, waiting up to 3 s while it is busy
// (a sandbox's namespace still going), then detaching it; false with errno set
// on failure.
bool unmount_folder(const std::filesystem::path& folder);

}  // namespace cairn::runtime
