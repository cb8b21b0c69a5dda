#include "runtime/workspace_template.hpp"

#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "runtime/background_thread.hpp"
#include "runtime/bwrap_support.hpp"
#include "runtime/unique_fd.hpp"

namespace cairn::runtime {
namespace {

namespace fs = std::filesystem;

constexpr std::chrono::seconds tool_timeout{60};

[[noreturn]] void failed(const std::string& what) {
  throw sandbox_error(sandbox_errc::workspace_failed, fmt::format("{}: {}", what, std::strerror(errno)));
}

void sync_folder(const fs::path& folder) {
  unique_fd fd(::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd) ::fsync(fd.get());
}

// Runs an e2fsprogs tool on `image` to a zero exit.
void run_tool(const std::vector<std::string>& argv, const fs::path& image) {
  resource_limits unlimited_size;
  unlimited_size.max_file_bytes = RLIM_INFINITY;
  captured_run run;
  try {
    run = run_captured(argv, std::nullopt, tool_timeout, unlimited_size);
  } catch (const sandbox_error& e) {
    throw sandbox_error(sandbox_errc::workspace_failed, e.what());
  }
  if (!run.status || !run.status->exited || run.status->code != 0)
    throw sandbox_error(sandbox_errc::workspace_failed,
                        fmt::format("{} {} {}: {}", fs::path(argv[0]).filename().string(), image.string(),
                                    run.status ? run.status->describe() : "hung", run.output));
}

// -m 0: no blocks kept for root; -i 8192: room for many small files. A new
// sparse file reads as zeros, so nothing needs zeroing: the template takes
// under 1 MiB of disk.
void format(const ext4_tools& tools, int fd, const fs::path& file, std::uint64_t bytes, uid_t uid, gid_t gid) {
  if (::ftruncate(fd, 0) < 0 || ::ftruncate(fd, static_cast<off_t>(bytes)) < 0)
    failed("sizing " + file.string());
  run_tool({tools.mkfs.string(), "-q", "-F", "-m", "0", "-i", "8192", "-E",
            fmt::format("root_owner={}:{},lazy_itable_init=1,lazy_journal_init=1", uid, gid), file.string()},
           file);
  // fsck remakes lost+found when it needs one. Dropped here, the first mount
  // of each copy has nothing to delete, so nothing to journal and flush.
  if (!tools.debugfs.empty()) run_tool({tools.debugfs.string(), "-w", "-R", "rmdir lost+found", file.string()}, file);
}

// The template, made first when missing. The first process to want it
// makes it under an flock on the partial file; others wait for that lock,
// then find the template saved.
unique_fd open_template(const ext4_tools& tools, const fs::path& folder, std::uint64_t bytes, uid_t uid, gid_t gid) {
  fs::path made = workspace_template_path(folder, bytes, uid, gid);
  fs::path partial = made.string() + ".new";
  for (;;) {
    unique_fd found(::open(made.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (found) return found;
    if (errno != ENOENT) failed("opening " + made.string());
    unique_fd lock(::open(partial.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!lock || ::flock(lock.get(), LOCK_EX) < 0) failed("creating " + partial.string());
    struct stat held {}, named {};
    if (::fstat(lock.get(), &held) < 0) failed("creating " + partial.string());
    // Saved (renamed away) while we waited: open it.
    if (::stat(partial.c_str(), &named) < 0 || named.st_ino != held.st_ino || named.st_dev != held.st_dev) continue;
    if (::access(made.c_str(), F_OK) == 0) {
      ::unlink(partial.c_str());  // made empty by an open after the template was saved: nobody formats it
      continue;
    }
    try {
      format(tools, lock.get(), partial, bytes, uid, gid);
    } catch (const sandbox_error&) {
      ::unlink(partial.c_str());
      throw;
    }
    if (::fsync(lock.get()) < 0 || ::rename(partial.c_str(), made.c_str()) < 0) failed("saving " + made.string());
    sync_folder(folder);
  }
}

// One read and write of up to 1 MiB at `at`, where copy_file_range cannot
// (across filesystems before Linux 5.3, some network filesystems).
ssize_t copy_by_hand(int from, int to, off_t at, off_t length) {
  std::vector<char> buffer(static_cast<std::size_t>(std::min<off_t>(length, 1 << 20)));
  ssize_t n = ::pread(from, buffer.data(), buffer.size(), at);
  if (n <= 0) return n;
  ssize_t written = ::pwrite(to, buffer.data(), static_cast<std::size_t>(n), at);
  if (written == n) return n;
  if (written >= 0) errno = ENOSPC;
  return -1;
}

// Copies [at, end) of `from` to the same place in `to`.
void copy_range(int from, int to, off_t at, off_t end, const fs::path& to_name) {
  while (at < end) {
    off_t in = at, out = at;
    ssize_t n = ::copy_file_range(from, &in, to, &out, static_cast<std::size_t>(end - at), 0);
    if (n < 0 && (errno == EXDEV || errno == ENOSYS || errno == EOPNOTSUPP || errno == EINVAL))
      n = copy_by_hand(from, to, at, end - at);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) failed("copying into " + to_name.string());
    if (n == 0)
      throw sandbox_error(sandbox_errc::workspace_failed,
                          fmt::format("copying into {}: the template ended early", to_name.string()));
    at += n;
  }
}

// Makes the empty file `to` a copy of the `bytes` of `from`, holes kept.
void copy_sparse(int from, int to, std::uint64_t bytes, const fs::path& to_name) {
  if (::ioctl(to, FICLONE, from) == 0) return;
  const off_t end = static_cast<off_t>(bytes);
  for (off_t data = 0; data < end;) {
    data = ::lseek(from, data, SEEK_DATA);
    if (data < 0 && errno == ENXIO) break;  // only holes left
    off_t hole = data < 0 ? -1 : ::lseek(from, data, SEEK_HOLE);
    if (hole < 0) failed("reading the template for " + to_name.string());
    hole = std::min(hole, end);
    copy_range(from, to, data, hole, to_name);
    data = hole;
  }
  if (::ftruncate(to, end) < 0) failed("sizing " + to_name.string());
}

// Copies the template at `from` into a new file that has no name until it is
// whole and synced (O_TMPFILE), then links it as `name`: no partial file is
// ever seen, or left by a host that dies. False where the folder's
// filesystem has no O_TMPFILE.
bool copy_as_whole_file(int from, std::uint64_t bytes, const fs::path& name) {
  unique_fd to(::open(name.parent_path().c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600));
  if (!to) {
    if (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL) return false;
    failed("making an image in " + name.parent_path().string());
  }
  copy_sparse(from, to.get(), bytes, name);
  if (::fsync(to.get()) < 0) failed("saving " + name.string());
  // linkat(AT_EMPTY_PATH) needs CAP_DAC_READ_SEARCH; through /proc it does not.
  const std::string self = fmt::format("/proc/self/fd/{}", to.get());
  if (::linkat(AT_FDCWD, self.c_str(), AT_FDCWD, name.c_str(), AT_SYMLINK_FOLLOW) < 0) failed("saving " + name.string());
  return true;
}

// Images made ahead, each a whole, synced copy of its template that was
// never mounted: a new image is then a rename, not a copy and its sync on
// the path of the run that needs it. A thread keeps images_made_ahead of
// them for each folder, size and owner this process has mounted a new image
// for (make_workspace_images_ahead).
// They are named .cairn-ext4-v1-SIZE-UID-GID.ready-PID-N beside their
// template, stay for the next process, which takes them up, and go when
// their template is found broken.
class image_stock {
 public:
  struct key {
    fs::path folder;
    std::uint64_t bytes;
    uid_t uid;
    gid_t gid;
    bool operator<(const key& other) const {
      return std::tie(folder, bytes, uid, gid) < std::tie(other.folder, other.bytes, other.uid, other.gid);
    }
  };

  // One image made ahead for `k`, its name gone from the stock (the caller
  // renames it), or nullopt.
  std::optional<fs::path> take(const key& k) {
    std::lock_guard lock(mutex_);
    auto& s = shelves_[k];
    if (!s.looked) {
      s.looked = true;
      for (auto& found : on_disk(k)) s.ready.push_back(std::move(found));
    }
    if (s.ready.empty()) return std::nullopt;
    fs::path taken = std::move(s.ready.front());
    s.ready.pop_front();
    return taken;
  }

  // Makes images for `k` in the background up to images_made_ahead. Keeps
  // them for the max_shelves sizes and owners wanted last: the images of
  // another go (quotas are the runs' to choose).
  void want(const key& k) {
    std::lock_guard lock(mutex_);
    auto& s = shelves_[k];
    s.failed = false;
    s.wanted_at = ++wants_;
    if (shelves_.size() > max_shelves) {
      auto oldest = std::min_element(shelves_.begin(), shelves_.end(), [](const auto& a, const auto& b) {
        return a.second.wanted_at < b.second.wanted_at;
      });
      for (const auto& found : on_disk(oldest->first)) ::unlink(found.c_str());
      shelves_.erase(oldest);
    }
    if (s.ready.size() >= images_made_ahead) return;
    worker_.start([this] { work(); });
    wake_.notify_one();
  }

  // The template of `k` was found broken: its images go, those made now too.
  void forget(const key& k) {
    std::lock_guard lock(mutex_);
    auto& s = shelves_[k];
    ++s.generation;
    s.ready.clear();
    for (const auto& found : on_disk(k)) ::unlink(found.c_str());
  }

  ~image_stock() {
    worker_.stop(mutex_, stopping_, wake_);
  }

 private:
  struct shelf {
    std::deque<fs::path> ready;
    bool looked = false;  // on_disk() taken up
    bool failed = false;  // until the next want()
    std::uint64_t generation = 0;
    std::uint64_t wanted_at = 0;
  };
  static constexpr std::size_t max_shelves = 4;

  static std::string ready_prefix(const key& k) {
    return fmt::format(".cairn-ext4-v1-{}-{}-{}.ready-", k.bytes, k.uid, k.gid);
  }

  static std::vector<fs::path> on_disk(const key& k) {
    std::vector<fs::path> found;
    std::error_code ec;
    const std::string prefix = ready_prefix(k);
    for (const auto& entry : fs::directory_iterator(k.folder, ec))
      if (entry.path().filename().string().starts_with(prefix)) found.push_back(entry.path());
    return found;
  }

  // The shelf most in need of an image, under the lock; nullptr: none.
  std::map<key, shelf>::iterator next_wanted() {
    for (auto it = shelves_.begin(); it != shelves_.end(); ++it)
      if (!it->second.failed && it->second.ready.size() < images_made_ahead) return it;
    return shelves_.end();
  }

  void work() {
    std::unique_lock lock(mutex_);
    for (;;) {
      auto wanted = shelves_.end();
      wake_.wait(lock, [&] { return stopping_ || (wanted = next_wanted()) != shelves_.end(); });
      if (stopping_) return;
      const key k = wanted->first;
      const std::uint64_t generation = wanted->second.generation;
      const fs::path name = k.folder / fmt::format("{}{}-{}", ready_prefix(k), ::getpid(), ++made_);
      lock.unlock();
      bool made = false;
      try {
        // Only a template made already: making one is for a run that needs it (make_workspace_image).
        unique_fd from(::open(workspace_template_path(k.folder, k.bytes, k.uid, k.gid).c_str(),
                              O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
        struct stat st {};
        made = from && ::fstat(from.get(), &st) == 0 && static_cast<std::uint64_t>(st.st_size) == k.bytes &&
               copy_as_whole_file(from.get(), k.bytes, name);
      } catch (const sandbox_error&) {
        // A run making its own image says why, if it fails there too.
      }
      lock.lock();
      auto s = shelves_.find(k);
      if (s == shelves_.end() || s->second.generation != generation) {
        if (made) ::unlink(name.c_str());  // its template found broken meanwhile, or its shelf given up
      } else if (!made) {
        s->second.failed = true;
      } else {
        s->second.ready.push_back(name);
      }
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::map<key, shelf> shelves_;
  bool stopping_ = false;
  std::uint64_t made_ = 0;
  std::uint64_t wants_ = 0;
  background_thread worker_;
};

image_stock& stock() {
  static image_stock s;
  return s;
}

}  // namespace

void make_workspace_images_ahead(const fs::path& folder, std::uint64_t bytes, uid_t uid, gid_t gid) {
  try {
    stock().want({folder, bytes, uid, gid});
  } catch (const std::system_error&) {
    // No thread to make them: each image is made when it is needed.
  }
}

void forget_workspace_template(const fs::path& folder, std::uint64_t bytes, uid_t uid, gid_t gid) {
  // In this order: an image begun before the unlink is counted as made
  // before the forget, and dropped.
  ::unlink(workspace_template_path(folder, bytes, uid, gid).c_str());
  stock().forget({folder, bytes, uid, gid});
}

fs::path workspace_template_path(const fs::path& folder, std::uint64_t bytes, uid_t uid, gid_t gid) {
  // v1: made as format() makes it; other mkfs.ext4 options need another version.
  return folder / fmt::format(".cairn-ext4-v1-{}-{}-{}.template", bytes, uid, gid);
}

void make_workspace_image(const ext4_tools& tools, const fs::path& image, std::uint64_t bytes, uid_t uid,
                          gid_t gid) {
  while (auto ready = stock().take({image.parent_path(), bytes, uid, gid})) {
    if (::renameat2(AT_FDCWD, ready->c_str(), AT_FDCWD, image.c_str(), RENAME_NOREPLACE) == 0) {
      sync_folder(image.parent_path());
      return;
    }
    if (errno != ENOENT) failed("taking " + ready->string() + " as " + image.string());
    // Another process took it first.
  }
  unique_fd from = open_template(tools, image.parent_path(), bytes, uid, gid);
  struct stat st {};
  if (::fstat(from.get(), &st) < 0) failed("reading the template of " + image.string());
  if (static_cast<std::uint64_t>(st.st_size) != bytes)
    throw sandbox_error(sandbox_errc::workspace_failed,
                        fmt::format("the image template {} holds {} bytes, not {}",
                                    workspace_template_path(image.parent_path(), bytes, uid, gid).string(),
                                    st.st_size, bytes));
  fs::path partial = image.string() + ".new";
  ::unlink(partial.c_str());
  unique_fd to(::open(partial.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!to) failed("creating " + partial.string());
  try {
    copy_sparse(from.get(), to.get(), bytes, partial);
    if (::fsync(to.get()) < 0 || ::rename(partial.c_str(), image.c_str()) < 0) failed("saving " + image.string());
  } catch (const sandbox_error&) {
    ::unlink(partial.c_str());
    throw;
  }
  sync_folder(image.parent_path());
}

}  // namespace cairn::runtime
