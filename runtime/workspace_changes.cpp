#include "runtime/workspace_changes.hpp"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "runtime/no_follow.hpp"
#include "runtime/sandbox.hpp"

namespace cairn::runtime {
namespace fs = std::filesystem;

namespace {

constexpr std::uint32_t watched = IN_CREATE | IN_DELETE | IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM |
                                  IN_MOVED_TO | IN_DELETE_SELF | IN_ONLYDIR | IN_EXCL_UNLINK;

std::string joined(const std::string& folder, const char* name) {
  return folder.empty() ? std::string(name) : folder + "/" + name;
}

}  // namespace

unique_fd open_beneath(int dir_fd, const std::string& path, int flags, unsigned mode) {
  open_how how{};
  how.flags = static_cast<std::uint64_t>(flags | O_NOFOLLOW | O_CLOEXEC);
  how.mode = (flags & O_CREAT) ? mode : 0;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  const char* at = path.empty() ? "." : path.c_str();
  return unique_fd(static_cast<int>(::syscall(SYS_openat2, dir_fd, at, &how, sizeof how)));
}

workspace_changes::workspace_changes(const fs::path& root)
    : root_(open_folder_no_follow(root)), inotify_(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) {
  if (!inotify_)
    throw sandbox_error(sandbox_errc::workspace_failed,
                        fmt::format("cannot watch workspace {} for its checkpoints: inotify_init1: {} (raise "
                                    "fs.inotify.max_user_instances, or set checkpoints false in the run's policy)",
                                    root.string(), std::strerror(errno)));
  watch_tree("");
}

void workspace_changes::watch(const std::string& path) {
  unique_fd dir = open_beneath(root_.get(), path, O_PATH | O_DIRECTORY);
  if (!dir) return;  // gone already (its removal is an event), or a link
  // Through the descriptor's magic link, which inotify follows to the folder it opened.
  const std::string proc = fmt::format("/proc/self/fd/{}", dir.get());
  const int wd = ::inotify_add_watch(inotify_.get(), proc.c_str(), watched);
  if (wd < 0) {
    if (errno == ENOSPC || errno == ENOMEM) pending_.everything = true;  // fs.inotify.max_user_watches
    return;
  }
  paths_[wd] = path;
}

void workspace_changes::watch_tree(const std::string& path) {
  watch(path);
  unique_fd dir = open_beneath(root_.get(), path, O_RDONLY | O_DIRECTORY);
  if (!dir) return;
  try {
    walk_tree_no_follow(dir.get(), path, [&](int at, const char* name, const fs::path& where) {
      struct stat st {};
      if (::fstatat(at, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode)) watch(where.string());
    });
  } catch (const sandbox_error&) {
    pending_.everything = true;  // a folder it could not walk: the checkpoint looks at all
  }
}

void workspace_changes::forget_tree(const std::string& path) {
  const std::string under = path + "/";
  for (auto it = paths_.begin(); it != paths_.end();) {
    if (it->second == path || it->second.starts_with(under)) {
      ::inotify_rm_watch(inotify_.get(), it->first);
      it = paths_.erase(it);
    } else {
      ++it;
    }
  }
}

workspace_changes::changes workspace_changes::take() {
  alignas(inotify_event) char buffer[64 * 1024];
  for (;;) {
    const ssize_t n = ::read(inotify_.get(), buffer, sizeof buffer);
    if (n < 0) {
      if (errno == EINTR) continue;
      break;  // EAGAIN: the queue is empty
    }
    if (n == 0) break;
    for (ssize_t at = 0; at < n;) {
      const auto* e = reinterpret_cast<const inotify_event*>(buffer + at);
      at += static_cast<ssize_t>(sizeof(inotify_event) + e->len);
      if (e->mask & IN_Q_OVERFLOW) {
        pending_.everything = true;
        continue;
      }
      auto folder = paths_.find(e->wd);
      if (folder == paths_.end()) continue;
      if (e->mask & IN_IGNORED) {
        paths_.erase(folder);
        continue;
      }
      if (e->len == 0) {
        // The watched folder itself went, or was moved: its parent's event names it.
        continue;
      }
      const std::string path = joined(folder->second, e->name);
      pending_.paths.insert(path);
      if (!(e->mask & IN_ISDIR)) continue;
      if (e->mask & (IN_CREATE | IN_MOVED_TO)) watch_tree(path);  // what it held came with it, unseen
      else if (e->mask & IN_MOVED_FROM) forget_tree(path);        // watched again where it went
    }
  }
  changes out = std::move(pending_);
  pending_ = {};
  return out;
}

}  // namespace cairn::runtime
