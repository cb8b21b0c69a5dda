#include "runtime/loop_mount.hpp"

#include "runtime/no_follow.hpp"

#include <fcntl.h>
#include <linux/loop.h>
#include <sys/ioctl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "runtime/sandbox.hpp"
#include "runtime/small_file.hpp"

namespace cairn::runtime {
namespace {

namespace fs = std::filesystem;

// Another process may take the free device between our asking and attaching:
// then we ask again, a little later each time.
constexpr int max_attach_attempts = 50;
// How long a sandbox that was just killed may keep its mount busy (its mount
// namespace goes with its last process) before we detach it instead.
constexpr auto busy_grace = std::chrono::seconds(3);
// How long to wait for an earlier, detached mount of the same image to go.
constexpr auto attached_grace = std::chrono::seconds(10);
constexpr auto poll_interval = std::chrono::milliseconds(5);

// Whether a loop device still holds `image`: an earlier mount of it that was
// detached while busy and whose last user has not gone yet.
bool image_attached(const fs::path& image) {
  std::error_code ec;
  const fs::path wanted = fs::weakly_canonical(image, ec);
  for (const auto& entry : fs::directory_iterator("/sys/block", ec)) {
    if (!entry.path().filename().string().starts_with("loop")) continue;
    auto backing = read_small_file(entry.path() / "loop" / "backing_file");
    if (!backing) continue;
    while (!backing->empty() && backing->back() == '\n') backing->pop_back();
    if (fs::path(*backing) == wanted || fs::path(*backing) == image) return true;
  }
  return false;
}

[[noreturn]] void failed(const std::string& what) {
  throw sandbox_error(sandbox_errc::spawn_failed, fmt::format("{}: {}", what, std::strerror(errno)));
}

// False with errno set; EBUSY: another process took the device first.
bool attach(int device, int backing, const fs::path& image, __u32 flags = 0) {
  loop_config config{};
  config.fd = static_cast<__u32>(backing);
  config.info.lo_flags = LO_FLAGS_AUTOCLEAR | flags;
  std::strncpy(reinterpret_cast<char*>(config.info.lo_file_name), image.c_str(), LO_NAME_SIZE - 1);
  if (::ioctl(device, LOOP_CONFIGURE, &config) == 0) return true;
  if (errno != EINVAL && errno != ENOTTY) return false;
  // Kernels before 5.8 know no LOOP_CONFIGURE.
  if (::ioctl(device, LOOP_SET_FD, backing) < 0) return false;
  if (::ioctl(device, LOOP_SET_STATUS64, &config.info) == 0) return true;
  int error = errno;
  ::ioctl(device, LOOP_CLR_FD, 0);
  errno = error;
  return false;
}

struct attached_device {
  unique_fd fd;  // the device goes (LO_FLAGS_AUTOCLEAR) when this closes, unless mounted by then
  std::string path;
};

// Attaches `image` to a free loop device with `flags` besides LO_FLAGS_AUTOCLEAR.
attached_device attach_free_device(const fs::path& image, __u32 flags) {
  const bool read_only = flags & LO_FLAGS_READ_ONLY;
  unique_fd backing(::open(image.c_str(), (read_only ? O_RDONLY : O_RDWR) | O_NOFOLLOW | O_CLOEXEC));
  if (!backing) failed("opening " + image.string());
  unique_fd control(::open("/dev/loop-control", O_RDWR | O_CLOEXEC));
  if (!control) failed("opening /dev/loop-control");
  // The threads of this process take turns: asked together, the kernel names
  // the same free device to all of them (256 sandboxes starting at once
  // failed on EBUSY after ten tries).
  static std::mutex attaching;
  std::lock_guard turn(attaching);
  for (int attempt = 1;; ++attempt) {
    int number = ::ioctl(control.get(), LOOP_CTL_GET_FREE);
    if (number < 0) failed("finding a free loop device");
    std::string device_path = "/dev/loop" + std::to_string(number);
    unique_fd device(::open(device_path.c_str(), (read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC));
    if (!device) failed("opening " + device_path);
    if (attach(device.get(), backing.get(), image, flags)) return {std::move(device), device_path};
    if (errno != EBUSY || attempt == max_attach_attempts)
      failed(fmt::format("attaching {} to {}", image.string(), device_path));
    std::this_thread::sleep_for(attempt * std::chrono::milliseconds(1));
  }
}

}  // namespace

fs::path attached_marker(const fs::path& image) { return fs::path(image) += ".attached"; }

loop_mount::loop_mount(const fs::path& image, const fs::path& target) : image_(image), target_(target) {
  // Two live filesystems on one image would corrupt it: an earlier mount
  // (detached while its sandbox was dying, or left by a host that died)
  // must be gone, its writes flushed. Only an image whose marker says so
  // may still be attached: the search costs a read per loop device.
  const fs::path marker = attached_marker(image);
  if (::access(marker.c_str(), F_OK) == 0) {
    for (auto deadline = std::chrono::steady_clock::now() + attached_grace; image_attached(image);) {
      if (std::chrono::steady_clock::now() > deadline) {
        errno = EBUSY;
        failed(fmt::format("{} is still attached to a loop device by an earlier sandbox", image.string()));
      }
      std::this_thread::sleep_for(poll_interval);
    }
  }
  unique_fd marked(::open(marker.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!marked) failed("marking " + image.string() + " attached");
  const auto device = attach_free_device(image, 0);
  // From here the mount holds the device; once ours is closed and the mount
  // is gone, LO_FLAGS_AUTOCLEAR detaches it. A failed mount frees it at once.
  // Onto the folder as opened without following a link, not its path resolved again.
  const unique_fd folder = open_folder_no_follow(fs::absolute(target).lexically_normal());
  const std::string at = "/proc/self/fd/" + std::to_string(folder.get());
  if (::mount(device.path.c_str(), at.c_str(), "ext4", MS_NOSUID | MS_NODEV, nullptr) < 0)
    failed(fmt::format("mounting {} ({}) at {}", image.string(), device.path, target.string()));
}

void mount_image_read_only(const fs::path& image, const fs::path& target) {
  const auto device = attach_free_device(image, LO_FLAGS_READ_ONLY);
  // noload: a read-only ext4 mount would still replay its journal, a write.
  if (::mount(device.path.c_str(), target.c_str(), "ext4", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "noload") < 0)
    failed(fmt::format("mounting {} ({}) read-only at {}", image.string(), device.path, target.string()));
}

void enter_private_mount_namespace() {
  if (::unshare(CLONE_NEWNS) < 0) failed("entering a mount namespace of this process's own");
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) < 0) failed("making its mounts private");
}

namespace {

// Busy while the killed sandbox's mount namespace is torn down: waits for
// it, so the unmount (and its flush) is done when this returns true.
bool unmount_when_free(const fs::path& folder) {
  for (auto deadline = std::chrono::steady_clock::now() + busy_grace;;) {
    if (::umount2(folder.c_str(), UMOUNT_NOFOLLOW) == 0) return true;
    if (errno != EBUSY || std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(poll_interval);
  }
}

// Still busy: detach it now; the kernel unmounts it, and frees the loop
// device, when its last user goes. loop_mount waits for that before it
// mounts the image again.
bool detach_busy(const fs::path& folder) {
  return errno == EBUSY && ::umount2(folder.c_str(), MNT_DETACH | UMOUNT_NOFOLLOW) == 0;
}

}  // namespace

loop_mount::loop_mount(const fs::path& image, const fs::path& target, const fs::path& source)
    : image_(image), target_(target) {
  if (::mount(source.c_str(), target.c_str(), nullptr, MS_BIND, nullptr) < 0)
    failed(fmt::format("mounting {} (mounted at {}) at {}", image.string(), source.string(), target.string()));
}

void loop_mount::give_away(const fs::path& image) {
  if (::rename(image_.c_str(), image.c_str()) < 0) failed(fmt::format("renaming {} to {}", image_.string(), image.string()));
  ::rename(attached_marker(image_).c_str(), attached_marker(image).c_str());
  target_.clear();
}

unique_fd loop_mount::detach() {
  unique_fd root(::open(target_.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!root) failed("opening " + target_.string());
  if (::umount2(target_.c_str(), MNT_DETACH | UMOUNT_NOFOLLOW) < 0) failed("detaching " + target_.string());
  target_.clear();
  return root;
}

loop_mount::~loop_mount() {
  if (target_.empty()) return;  // given away
  // Detached, the image stays marked until a later mount finds it free.
  if (unmount_when_free(target_))
    ::unlink(attached_marker(image_).c_str());
  else
    detach_busy(target_);
}

bool unmount_folder(const fs::path& folder) { return unmount_when_free(folder) || detach_busy(folder); }

std::optional<fs::path> loop_backing_file(const fs::path& folder) {
  struct stat here {}, parent {};
  if (::stat(folder.c_str(), &here) < 0 || ::stat((folder / "..").c_str(), &parent) < 0) return std::nullopt;
  if (here.st_dev == parent.st_dev) return std::nullopt;
  auto backing = read_small_file(
      fmt::format("/sys/dev/block/{}:{}/loop/backing_file", major(here.st_dev), minor(here.st_dev)));
  if (!backing) return std::nullopt;
  while (!backing->empty() && backing->back() == '\n') backing->pop_back();
  return fs::path(*backing);
}

bool is_loop_mount_of(const fs::path& folder, const fs::path& image) { return loop_backing_file(folder) == image; }

}  // namespace cairn::runtime
