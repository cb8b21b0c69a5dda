#include "runtime/workspace_quota.hpp"

#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "runtime/background_thread.hpp"
#include "runtime/crash_point.hpp"
#include "runtime/no_follow.hpp"
#include "runtime/sandbox.hpp"
#include "runtime/small_file.hpp"
#include "runtime/tree_copy.hpp"

namespace cairn::runtime {
namespace {

namespace fs = std::filesystem;

constexpr std::uint64_t full_below_bytes = 128 << 10;
constexpr auto lock_patience = std::chrono::seconds(5);

constexpr std::uint64_t min_margin = 8ull << 20;
constexpr const char* mount_record_kind = "mount";

// The quota an image of `image_bytes` was made for (workspace_image_size inverted).
std::uint64_t quota_of_image(std::uint64_t image_bytes) {
  return image_bytes < 9 * min_margin ? image_bytes - std::min(image_bytes, min_margin) : image_bytes / 9 * 8;
}

// flock(LOCK_EX) that gives up after `patience`.
bool lock_within(int fd, std::chrono::milliseconds patience) {
  for (auto deadline = std::chrono::steady_clock::now() + patience;;) {
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return true;
    if (errno != EWOULDBLOCK || std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

[[noreturn]] void locked_elsewhere(const fs::path& workspace, const fs::path& image) {
  throw sandbox_error(sandbox_errc::workspace_busy,
                      fmt::format("workspace {} is in use by another cairn process (its image {} is locked)",
                                  workspace.string(), image.string()));
}

[[noreturn]] void failed(sandbox_errc code, const std::string& what) {
  throw sandbox_error(code, fmt::format("{}: {}", what, std::strerror(errno)));
}

std::uint64_t mib(std::uint64_t bytes) { return bytes >> 20; }

void sync_folder(const fs::path& folder) {
  unique_fd fd(::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd) ::fsync(fd.get());
}

unique_fd open_folder(const fs::path& folder) {
  unique_fd fd(::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd) failed(sandbox_errc::workspace_failed, "opening " + folder.string());
  return fd;
}

// Where a release keeps its copy of an image's files, beside the workspace
// folder: WS.released while it is made (never trusted, removed on sight),
// then .WS.released (hidden: never a run's name) once it is synced whole.
// From then on that copy holds the run's files, not the image, which is
// never flushed again.
fs::path staging_of(const fs::path& workspace) { return workspace.string() + ".released"; }
fs::path whole_copy_of(const fs::path& workspace) {
  return workspace.parent_path() / ("." + workspace.filename().string() + ".released");
}

// A whole copy is adopted only when it is the one a release of the image
// made: before the copy gets its name, the release writes its device and
// inode into IMAGE.released, beside the image in cairn's own folder, where
// no one else writes. A folder of that name that someone else put beside
// the workspace (a shared parent folder) is never taken for the run's files.
fs::path copy_record_of(const fs::path& image) { return fs::path(image) += ".released"; }

// Writes the record of the copy open as `copy_fd`; returns whether a
// syncfs() of the copy, which `syncfs_follows`, makes it durable too (the
// image's folder on the copy's filesystem), else sync_whole_copy_record()
// must, before the copy is named.
bool record_whole_copy(const fs::path& image, int copy_fd, bool syncfs_follows) {
  struct stat st {}, folder {};
  if (::fstat(copy_fd, &st) < 0) failed(sandbox_errc::workspace_failed, "reading the copy of " + image.string());
  const fs::path record = copy_record_of(image);
  unique_fd out(::open(record.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600));
  const std::string text = fmt::format("{} {}\n", st.st_dev, st.st_ino);
  if (!out || ::write(out.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()) ||
      ::fstat(out.get(), &folder) < 0)
    failed(sandbox_errc::workspace_failed, "writing " + record.string());
  return syncfs_follows && folder.st_dev == st.st_dev;
}

void sync_whole_copy_record(const fs::path& image) {
  const fs::path record = copy_record_of(image);
  unique_fd in(::open(record.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!in || ::fsync(in.get()) < 0) failed(sandbox_errc::workspace_failed, "syncing " + record.string());
  sync_folder(image.parent_path());
}

bool is_whole_copy_of(const fs::path& whole, const fs::path& image) {
  struct stat st {};
  if (::lstat(whole.c_str(), &st) < 0 || !S_ISDIR(st.st_mode)) return false;
  unique_fd in(::open(copy_record_of(image).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  char text[64] = {};
  if (!in || ::read(in.get(), text, sizeof text - 1) <= 0) return false;
  unsigned long long dev = 0, ino = 0;
  return std::sscanf(text, "%llu %llu", &dev, &ino) == 2 && dev == st.st_dev && ino == st.st_ino;
}

// The name an image takes when its run is over and its files are copied
// out, until it is deleted: nothing mounts or reads it any more.
fs::path doomed_name(const fs::path& image) {
  return image.parent_path() / ("." + image.filename().string() + ".doomed");
}

// Unmounts the image's mount at `folder` that a host left when it died (we
// hold the image's lock, so nobody else uses it).
void unmount_stale(const fs::path& folder, const fs::path& image, const std::optional<fuse_tools>& fuse) {
  if (fuse ? is_fuse_mount_of(folder, image) && !fuse_unmount(*fuse, folder)
           : is_loop_mount_of(folder, image) && !unmount_folder(folder))
    failed(sandbox_errc::workspace_failed, "unmounting the stale workspace image at " + folder.string());
}

// The mounts of this process, by workspace folder. registry_mutex guards the
// maps only (held for moments); the slow work on one workspace (copy, mount,
// unmount, release) is serialized by that folder's own lock, so sandboxes of
// different runs start and end in parallel. A sweep excludes all of them.
struct registry_entry {
  std::shared_ptr<mounted_workspace> mount;
  int leases = 0;
};
std::mutex registry_mutex;
std::map<fs::path, registry_entry> registry;
std::map<fs::path, std::shared_ptr<std::mutex>> folder_locks;
std::map<fs::path, workspace_upkeep> upkeeps;
std::shared_mutex sweep_mutex;

// Holds the lock of one workspace folder (and keeps sweeps out) while alive.
class folder_guard {
 public:
  explicit folder_guard(fs::path folder) : sweep_(sweep_mutex), folder_(std::move(folder)) {
    {
      std::lock_guard lock(registry_mutex);
      auto& slot = folder_locks[folder_];
      if (!slot) slot = std::make_shared<std::mutex>();
      mutex_ = slot;
    }
    mutex_->lock();
  }
  ~folder_guard() {
    mutex_->unlock();
    std::lock_guard lock(registry_mutex);
    mutex_.reset();
    auto it = folder_locks.find(folder_);
    if (it != folder_locks.end() && it->second.use_count() == 1) folder_locks.erase(it);
  }
  folder_guard(const folder_guard&) = delete;
  folder_guard& operator=(const folder_guard&) = delete;

 private:
  std::shared_lock<std::shared_mutex> sweep_;
  fs::path folder_;
  std::shared_ptr<std::mutex> mutex_;
};

std::chrono::nanoseconds thread_cpu() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return std::chrono::seconds(t.tv_sec) + std::chrono::nanoseconds(t.tv_nsec);
}

// Bytes written so far to the block device that holds `folder` (a loop
// device: to its image); field 7 of /sys/dev/block/M:m/stat counts sectors.
std::uint64_t device_bytes_written(const fs::path& folder) {
  struct stat st {};
  if (::stat(folder.c_str(), &st) < 0) return 0;
  auto text = read_small_file(fmt::format("/sys/dev/block/{}:{}/stat", major(st.st_dev), minor(st.st_dev)));
  std::uint64_t fields[7] = {};
  if (!text || std::sscanf(text->c_str(), "%lu %lu %lu %lu %lu %lu %lu", &fields[0], &fields[1], &fields[2],
                           &fields[3], &fields[4], &fields[5], &fields[6]) != 7)
    return 0;
  return fields[6] * 512;
}

// Counts one mount or unmount of `folder` that began at `cpu`/`wall`.
void charge_upkeep(const fs::path& folder, std::uint64_t mounts, std::uint64_t bytes, std::chrono::nanoseconds cpu,
                   std::chrono::steady_clock::time_point wall) {
  std::lock_guard lock(registry_mutex);
  auto& u = upkeeps[folder];
  u.mounts += mounts;
  u.bytes_written += bytes;
  u.cpu += thread_cpu() - cpu;
  u.wall += std::chrono::steady_clock::now() - wall;
}

std::optional<std::string> size_warning(const fs::path& image, std::uint64_t quota) {
  struct stat st {};
  if (::stat(image.c_str(), &st) < 0 || static_cast<std::uint64_t>(st.st_size) == workspace_image_size(quota))
    return std::nullopt;
  return fmt::format(
      "the workspace image {} was made for a {} MiB quota; limits.workspace_mb asks for {} MiB, which applies to "
      "new workspaces only: this run keeps its image",
      image.string(), mib(quota_of_image(static_cast<std::uint64_t>(st.st_size))), mib(quota));
}

}  // namespace

std::uint64_t workspace_image_size(std::uint64_t quota) { return quota + std::max(min_margin, quota / 8); }

std::vector<fs::path> run_file_paths(const fs::path& workspace, const fs::path& image) {
  const fs::path w = fs::absolute(workspace).lexically_normal();
  return {w, whole_copy_of(w), image, copy_record_of(image)};
}

std::optional<fs::path> cut_short_release(const fs::path& workspace, const fs::path& image) {
  fs::path whole = whole_copy_of(fs::absolute(workspace).lexically_normal());
  if (!is_whole_copy_of(whole, image)) return std::nullopt;
  return whole;
}

std::optional<std::string> adopt_image(const fs::path& from, const fs::path& to) {
  struct stat st {};
  if (::lstat(to.c_str(), &st) == 0 || ::lstat(from.c_str(), &st) < 0) return std::nullopt;
  if (!S_ISREG(st.st_mode)) return fmt::format("{} is not an image file; move the run's files to {}", from.string(), to.string());
  unique_fd lock(::open(from.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!lock) return fmt::format("its quota image {} cannot be opened ({})", from.string(), std::strerror(errno));
  // A live sandbox of another process uses it: moved later, never from under it.
  if (!lock_within(lock.get(), lock_patience))
    return fmt::format("its quota image {} is in use by another cairn process", from.string());
  if (::rename(from.c_str(), to.c_str()) < 0)
    return fmt::format("its files are in the quota image {}, where an earlier cairn kept it, and it cannot be "
                       "moved to {}, where every worker of the shared root finds it ({}); move it there (cp "
                       "--sparse=always, then delete the old one) and `cairn resume` the run",
                       from.string(), to.string(), std::strerror(errno));
  sync_folder(to.parent_path());
  ::rename(attached_marker(from).c_str(), attached_marker(to).c_str());
  return std::nullopt;
}

workspace_upkeep workspace_upkeep_of(const fs::path& workspace) {
  // As the mount and the release name it (no link is followed on a workspace's path).
  const fs::path folder = fs::absolute(workspace).lexically_normal();
  std::lock_guard lock(registry_mutex);
  auto it = upkeeps.find(folder);
  return it == upkeeps.end() ? workspace_upkeep{} : it->second;
}

quota_support detect_workspace_quota() {
  quota_support s;
  const bool root = ::geteuid() == 0;
  s.fix = root ? "make loop devices available (modprobe loop) and install mkfs.ext4 (apt-get install e2fsprogs); "
                 "without them files are bounded one by one (limits.file_mb), not in total"
               : "install fuse2fs, fuse3 and mkfs.ext4 (apt-get install fuse2fs fuse3 e2fsprogs) and let this user "
                 "open /dev/fuse (Debian's udev makes it 0666), or run cairn as root; without them files are "
                 "bounded one by one (limits.file_mb), not in total";
  for (const char* folder : {"/usr/sbin", "/sbin", "/usr/bin"}) {
    fs::path mkfs = fs::path(folder) / "mkfs.ext4", debugfs = fs::path(folder) / "debugfs";
    if (s.tools.mkfs.empty() && ::access(mkfs.c_str(), X_OK) == 0) s.tools.mkfs = mkfs;
    if (s.tools.debugfs.empty() && ::access(debugfs.c_str(), X_OK) == 0) s.tools.debugfs = debugfs;
  }
  if (s.tools.mkfs.empty()) {
    s.detail = "unavailable: mkfs.ext4 is not installed";
    return s;
  }
  if (!root) {
    std::string why;
    s.fuse = find_fuse_tools(why);
    if (!s.fuse) {
      s.detail = "unavailable: cairn does not run as root and FUSE " + why;
      return s;
    }
    s.available = true;
    s.fix.clear();
    s.detail = fmt::format("ext4 image per run (made with {}, mounted through FUSE by {})", s.tools.mkfs.string(),
                           s.fuse->fuse2fs.string());
    return s;
  }
  unique_fd control(::open("/dev/loop-control", O_RDWR | O_CLOEXEC));
  if (!control) {
    s.detail = fmt::format("unavailable: needs root and loop devices (/dev/loop-control: {})", std::strerror(errno));
    return s;
  }
  s.available = true;
  s.fix.clear();
  s.detail = fmt::format("ext4 image per run (made with {}, mounted through a loop device)", s.tools.mkfs.string());
  return s;
}

mounted_workspace::mounted_workspace(const fs::path& folder, const fs::path& image, std::uint64_t quota_bytes,
                                     const fs::path& premounted, const std::optional<fuse_tools>& fuse)
    : folder_(folder), quota_bytes_(quota_bytes) {
  const auto cpu = thread_cpu();
  const auto wall = std::chrono::steady_clock::now();
  image_lock_.reset(::open(image.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  struct stat image_stat {};
  if (!image_lock_ || ::fstat(image_lock_.get(), &image_stat) < 0)
    failed(sandbox_errc::workspace_failed, "opening " + image.string());
  // Another host's sweep of stale mounts holds the lock for a moment; only a
  // lock held on and on means a live sandbox of another process.
  if (!lock_within(image_lock_.get(), lock_patience))
    locked_elsewhere(folder, image);
  // Left mounted by a host that died: nobody else can be using it, we hold the lock.
  unmount_stale(folder, image, fuse);
  struct stat here {}, parent {};
  if (::stat(folder.c_str(), &here) == 0 && ::stat((folder / "..").c_str(), &parent) == 0 &&
      here.st_dev != parent.st_dev)
    throw sandbox_error(sandbox_errc::workspace_failed,
                        fmt::format("{} is a mount point of another filesystem", folder.string()));
  unique_fd plain = open_folder(folder);  // the folder beneath, once the image covers it
  record_ = std::make_unique<own_record>(mount_record_kind, folder.string() + "\n" + image.string());
  try {
    if (fuse)
      fuse_mount_.emplace(*fuse, image, folder);
    else if (premounted.empty())
      mount_.emplace(image, folder);
    else
      mount_.emplace(image, folder, premounted);
  } catch (const sandbox_error& e) {
    throw sandbox_error(sandbox_errc::workspace_failed, e.what());
  }
  mounted_ = true;
  // The loop device may have served other images before: count from here.
  const std::uint64_t written_before = device_bytes_written(folder_);
  if (premounted.empty()) ready_image_mount(folder);
  unique_fd root = open_folder(folder);
  if (!has_entries(plain.get())) {
    charge_upkeep(folder_, 1, device_bytes_written(folder_) - written_before, cpu, wall);
    return;
  }
  try {
    // No budget: the image, a mounted filesystem, bounds what fits in it.
    copy_tree(plain.get(), root.get(), folder, image, UINT64_MAX);
  } catch (const sandbox_error& e) {
    if (!full()) throw;
    throw sandbox_error(sandbox_errc::bad_spec,
                        fmt::format("the files in workspace {} do not fit its quota image {}; raise "
                                    "limits.workspace_mb, or delete both and start afresh",
                                    folder.string(), image.string()));
  }
  ::syncfs(root.get());
  clear_tree(plain.get(), folder);
  charge_upkeep(folder_, 1, device_bytes_written(folder_) - written_before, cpu, wall);
}

void mounted_workspace::unmount() {
  std::lock_guard lock(unmount_mutex_);
  if (mount_ || fuse_mount_) {
    const auto cpu = thread_cpu();
    const auto wall = std::chrono::steady_clock::now();
    // Flushed here rather than by umount, to count what the flush writes.
    std::uint64_t before = device_bytes_written(folder_);
    if (unique_fd root{::open(folder_.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)}) ::syncfs(root.get());
    std::uint64_t flushed = device_bytes_written(folder_) - before;
    mounted_ = false;
    mount_.reset();
    fuse_mount_.reset();
    charge_upkeep(folder_, 0, flushed, cpu, wall);
  }
  record_.reset();
  mounted_ = false;
  image_lock_.reset();
}

struct mounted_workspace::retired {
  unique_fd root;  // O_PATH: the detached filesystem, flushed and unmounted once this closes
  unique_fd image_lock;
  std::unique_ptr<own_record> record;
};

std::shared_ptr<mounted_workspace::retired> mounted_workspace::retire() {
  std::lock_guard lock(unmount_mutex_);
  auto gone = std::make_shared<retired>();
  if (mount_) {
    try {
      gone->root = mount_->detach();
    } catch (const sandbox_error&) {
      // Unmounted below as ever, flush included.
    }
  }
  mounted_ = false;
  mount_.reset();
  fuse_mount_.reset();  // fuse2fs writes the image out and ends
  gone->image_lock = std::move(image_lock_);
  gone->record = std::move(record_);
  return gone;
}

bool mounted_workspace::full() const {
  if (!mounted_) return false;
  struct statvfs st {};
  if (::statvfs(folder_.c_str(), &st) < 0) return false;
  const std::uint64_t used = static_cast<std::uint64_t>(st.f_blocks - st.f_bfree) * st.f_frsize;
  return used > quota_bytes_ || static_cast<std::uint64_t>(st.f_bavail) * st.f_frsize < full_below_bytes ||
         st.f_favail == 0;
}

namespace {

// Deletes the images of runs that ended, off their path: closing the last
// hold on a detached filesystem flushes and unmounts it and frees its loop
// device, and unlinking an image frees its extents, a few milliseconds of
// I/O each that nobody waits for. A host that dies first leaves the image
// under its doomed name with its mount record, and the next sweep deletes it.
class image_reaper {
 public:
  struct job {
    std::shared_ptr<mounted_workspace::retired> filesystem;  // may be null
    fs::path doomed;
  };

  void add(job j) {
    {
      std::lock_guard lock(mutex_);
      if (jobs_.size() < max_queued) {
        jobs_.push_back(std::move(j));
        worker_.start([this] { work(); });
        wake_.notify_one();
        return;
      }
    }
    finish(j);  // so far behind: done here, as if there were no reaper
  }

  ~image_reaper() {
    worker_.stop(mutex_, stopping_, wake_);
  }

 private:
  static constexpr std::size_t max_queued = 64;

  static void finish(job& j) {
    if (j.filesystem) j.filesystem->root.reset();  // the flush and the unmount happen here
    if (!j.doomed.empty()) ::unlink(j.doomed.c_str());
    j.filesystem.reset();  // its lock and record last: until now a sweep would find it
  }

  void work() {
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      job j = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      finish(j);
      lock.lock();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<job> jobs_;
  bool stopping_ = false;
  background_thread worker_;
};

image_reaper& reaper() {
  static image_reaper r;
  return r;
}

// From a whole copy on (whole_copy_of): the image is renamed away for good,
// then the copy takes the folder's place. Each step is durable before the
// next, so a crash anywhere leaves either the image and maybe a whole copy,
// or a whole copy alone, or the released folder; the next release, or the
// next mount, finishes from there.
void take_whole_copy(const fs::path& workspace, const fs::path& image, const std::optional<fuse_tools>& fuse,
                     std::shared_ptr<mounted_workspace::retired> filesystem) {
  const fs::path whole = whole_copy_of(workspace), staging = staging_of(workspace), doomed = doomed_name(image);
  unique_fd image_lock;  // a release a crash cut short: the image is nobody's, unless another host mounted it since
  if (::access(image.c_str(), F_OK) == 0) {
    if (!filesystem) {
      image_lock.reset(::open(image.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
      if (image_lock && !lock_within(image_lock.get(), lock_patience))
        locked_elsewhere(workspace, image);
    }
    unmount_stale(workspace, image, fuse);
    if (::rename(image.c_str(), doomed.c_str()) < 0)
      failed(sandbox_errc::workspace_failed, "renaming " + image.string() + " for deletion");
    // Else a power cut could bring the image back, older than the copy, and
    // `cairn workspace` would read the run's files from it.
    sync_folder(image.parent_path());
    crash_point("image_doomed");
  }
  ::unlink(attached_marker(image).c_str());
  // The image's mount point (left empty when it was mounted) goes aside.
  std::error_code ec;
  fs::remove_all(staging, ec);
  if (::rename(workspace.c_str(), staging.c_str()) < 0 && errno != ENOENT)
    failed(sandbox_errc::workspace_failed, "moving " + workspace.string() + " aside");
  crash_point("workspace_moved_aside");
  if (::rename(whole.c_str(), workspace.c_str()) < 0)
    failed(sandbox_errc::workspace_failed, "moving the released files into " + workspace.string());
  sync_folder(workspace.parent_path());
  ::unlink(copy_record_of(image).c_str());  // its copy is the folder now
  fs::remove_all(staging, ec);  // left over, the next call removes it
  reaper().add({std::move(filesystem), doomed});
}

}  // namespace

void workspace_lease::release() noexcept {
  if (!mount_) return;
  folder_guard busy(folder_);
  release_locked();
}

void workspace_lease::release_locked() noexcept {
  if (!mount_) return;
  std::shared_ptr<mounted_workspace> last;
  {
    std::lock_guard lock(registry_mutex);
    auto entry = registry.find(folder_);
    if (entry != registry.end() && --entry->second.leases == 0) {
      last = entry->second.mount;
      registry.erase(entry);
    }
  }
  if (last) last->unmount();
  mount_.reset();
}

workspace_lease& workspace_lease::operator=(workspace_lease&& other) noexcept {
  if (this != &other) {
    release();
    folder_ = std::move(other.folder_);
    mount_ = std::move(other.mount_);
  }
  return *this;
}

void ready_image_mount(const fs::path& folder) {
  // Only speed is at stake in noatime: a kernel without mount_setattr goes without.
  mount_attr noatime{};
  noatime.attr_set = MOUNT_ATTR_NOATIME;
  noatime.attr_clr = MOUNT_ATTR__ATIME;
  ::mount_setattr(AT_FDCWD, folder.c_str(), AT_SYMLINK_NOFOLLOW, &noatime, sizeof noatime);
  // Templates made with debugfs have none already.
  ::unlinkat(open_folder(folder).get(), "lost+found", AT_REMOVEDIR);
}

workspace_mount_result mount_workspace_image(const quota_support& support, const fs::path& workspace,
                                             const fs::path& image, std::uint64_t bytes, uid_t uid, gid_t gid,
                                             const fs::path& premounted) {
  folder_guard busy(workspace);
  workspace_mount_result result;
  {
    std::lock_guard lock(registry_mutex);
    if (auto entry = registry.find(workspace); entry != registry.end()) {
      ++entry->second.leases;
      result.lease = workspace_lease(workspace, entry->second.mount);
      return result;
    }
  }
  // A release that a crash cut short after its copy was whole: that copy,
  // not the image, holds the files; they move into a new image from the folder.
  if (is_whole_copy_of(whole_copy_of(workspace), image)) take_whole_copy(workspace, image, support.fuse, nullptr);
  bool fresh = !fs::exists(image);
  const std::uint64_t image_bytes = workspace_image_size(bytes);
  if (!fresh)
    if (auto warning = size_warning(image, bytes)) result.warnings.push_back(*warning);
  std::shared_ptr<mounted_workspace> mount;
  try {
    if (fresh) make_workspace_image(support.tools, image, image_bytes, uid, gid);
    mount = std::make_shared<mounted_workspace>(workspace, image, bytes, premounted, support.fuse);
  } catch (const sandbox_error& e) {
    if (!fresh) throw;
    ::unlink(image.c_str());  // it holds nothing yet
    ::unlink(attached_marker(image).c_str());
    if (e.code() != sandbox_errc::workspace_failed) throw;
    // A bad template would spoil every later image too; the next run makes another.
    forget_workspace_template(image.parent_path(), image_bytes, uid, gid);
    result.warnings.push_back(fmt::format(
        "workspace {} has no size quota ({}): it is a plain folder, files are bounded one by one "
        "(limits.file_mb)",
        workspace.string(), e.what()));
    return result;
  }
  if (fresh) make_workspace_images_ahead(image.parent_path(), image_bytes, uid, gid);
  {
    std::lock_guard lock(registry_mutex);
    registry[workspace] = {mount, 1};
  }
  result.lease = workspace_lease(workspace, mount);
  return result;
}

std::size_t sweep_orphaned_workspace_mounts() {
  std::unique_lock lock(sweep_mutex);
  std::size_t swept = 0;
  std::string no_fuse;
  const auto fuse = ::geteuid() == 0 ? std::nullopt : find_fuse_tools(no_fuse);
  for (const auto& record : own_records(mount_record_kind)) {
    auto newline = record.subject.find('\n');
    if (newline == std::string::npos) {
      forget_record(record);
      continue;
    }
    fs::path folder = record.subject.substr(0, newline), image = record.subject.substr(newline + 1);
    // Held: a live host's, mounted or about to be (it records before it mounts).
    unique_fd image_lock(::open(image.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (image_lock && ::flock(image_lock.get(), LOCK_EX | LOCK_NB) < 0) continue;
    if (is_loop_mount_of(folder, image)) {
      if (!unmount_folder(folder)) continue;
      ++swept;
    } else if (is_fuse_mount_of(folder, image)) {
      // Its fuse2fs, left serving it, writes what it holds and ends.
      if (!fuse || !fuse_unmount(*fuse, folder)) continue;
      ++swept;
    }
    // An image its host renamed for deletion and did not live to delete.
    ::unlink(doomed_name(image).c_str());
    forget_record(record);
  }
  return swept;
}

void release_workspace_image(const fs::path& given, const fs::path& image, workspace_lease* mounted) {
  fs::path workspace = fs::absolute(given).lexically_normal();
  folder_guard busy(workspace);
  // Whatever happens below, the sandbox's lease goes (under this lock).
  struct lease_guard {
    workspace_lease* lease;
    ~lease_guard() {
      if (lease) lease->release_locked();
    }
  } held{mounted && *mounted && mounted->folder_ == workspace ? mounted : nullptr};
  if (mounted && !held.lease) mounted->release_locked();  // another folder's, or none: not used here
  const fs::path staging = staging_of(workspace), whole = whole_copy_of(workspace);
  std::error_code ec;
  bool in_use;
  {
    std::lock_guard lock(registry_mutex);
    auto entry = registry.find(workspace);
    in_use = entry != registry.end() && entry->second.leases > (held.lease ? 1 : 0);
  }
  if (in_use)
    throw sandbox_error(sandbox_errc::bad_spec,
                        fmt::format("workspace {} is still used by a sandbox; destroy it first", workspace.string()));
  struct forget_upkeep {
    fs::path workspace;
    ~forget_upkeep() {
      std::lock_guard lock(registry_mutex);
      upkeeps.erase(workspace);  // the run is over
    }
  } over{workspace};
  fs::remove_all(staging, ec);  // a copy cut short
  if (is_whole_copy_of(whole, image)) {
    if (held.lease) std::exchange(held.lease, nullptr)->release_locked();
    take_whole_copy(workspace, image, detect_workspace_quota().fuse, nullptr);
    return;
  }
  if (!fs::exists(image)) return;  // a run without a quota: no tools to look for
  const auto support = detect_workspace_quota();
  // Copied next to the folder, synced, then marked whole by a rename: from
  // then on the copy holds the files and the image can go unflushed.
  fs::create_directories(workspace, ec);
  if (::mkdir(staging.c_str(), 0700) < 0) failed(sandbox_errc::workspace_failed, "creating " + staging.string());
  if (!held.lease && ::geteuid() != 0 && !support.fuse)
    throw sandbox_error(sandbox_errc::workspace_failed,
                        fmt::format("the files of workspace {} are in its quota image {}, which cannot be mounted "
                                    "here ({}): {}",
                                    workspace.string(), image.string(), support.detail, support.fix));
  std::shared_ptr<mounted_workspace::retired> filesystem;
  {
    // Only read: no quota to enforce.
    std::shared_ptr<mounted_workspace> mount =
        held.lease ? held.lease->mount_
                   : std::make_shared<mounted_workspace>(workspace, image, UINT64_MAX, fs::path{}, support.fuse);
    unique_fd root = open_folder(workspace), copy = open_folder(staging);
    struct stat image_stat {};
    if (::stat(image.c_str(), &image_stat) < 0) failed(sandbox_errc::workspace_failed, "reading " + image.string());
    // No more than the image could hold: links and holes are kept, so the
    // copy of a full image fits; anything else stops with an error and the image stays.
    copy_tree(root.get(), copy.get(), workspace, staging, static_cast<std::uint64_t>(image_stat.st_size));
    // Closed before it takes the folder's place: the modes the agent chose
    // for its files never reach the host folder, even if a crash follows.
    close_to_others(copy.get(), staging);
    // Copied files are made durable by one sync of the whole filesystem
    // rather than one per file; an empty workspace's folder by its own.
    std::error_code empty_ec;
    const bool nothing_copied = fs::is_empty(staging, empty_ec) && !empty_ec;
    struct stat st {};
    if (::fstat(root.get(), &st) < 0 || ::fchown(copy.get(), st.st_uid, st.st_gid) < 0)
      failed(sandbox_errc::workspace_failed, "finishing " + staging.string());
    // The record goes before the sync, which makes it durable too when it
    // syncs the record's filesystem (the usual layouts: the image beside).
    const bool record_synced = record_whole_copy(image, copy.get(), !nothing_copied);
    if ((nothing_copied ? ::fsync(copy.get()) : ::syncfs(copy.get())) < 0)
      failed(sandbox_errc::workspace_failed, "finishing " + staging.string());
    if (!record_synced) sync_whole_copy_record(image);
    // Never over a folder of that name that cairn did not make.
    if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, whole.c_str(), RENAME_NOREPLACE) < 0) {
      if (errno == EEXIST)
        throw sandbox_error(sandbox_errc::workspace_failed,
                            fmt::format("{} sits beside workspace {}, and cairn did not make it: the run's files stay "
                                        "in its image {} until it is removed",
                                        whole.string(), workspace.string(), image.string()));
      failed(sandbox_errc::workspace_failed, "saving " + whole.string());
    }
    sync_folder(workspace.parent_path());
    crash_point("workspace_copied");
    root.reset();
    filesystem = mount->retire();
    if (held.lease) std::exchange(held.lease, nullptr)->release_locked();  // the last lease: nothing left to unmount
  }
  take_whole_copy(workspace, image, support.fuse, std::move(filesystem));
}

}  // namespace cairn::runtime
