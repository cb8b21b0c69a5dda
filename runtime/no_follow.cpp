#include "runtime/no_follow.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include <fmt/format.h>

#include "runtime/sandbox.hpp"

namespace cairn::runtime {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void bad_spec(const std::string& message) { throw sandbox_error(sandbox_errc::bad_spec, message); }

// A deeper tree is refused rather than walked: each level holds an fd.
constexpr int max_depth = 128;

// What close_to_others() takes from everything under the folder.
constexpr mode_t open_to_others = S_ISUID | S_ISGID | S_ISVTX | S_IWGRP | S_IWOTH;

// `fd`'s mode less `taken`, through /proc: fchmod does not take an O_PATH
// descriptor, and fchmodat follows a link that replaced the file meanwhile.
void take_mode_bits(int fd, mode_t taken, const fs::path& where) {
  struct stat st {};
  if (::fstat(fd, &st) < 0 || !(st.st_mode & taken) || S_ISLNK(st.st_mode)) return;
  auto proc = fmt::format("/proc/self/fd/{}", fd);
  if (::chmod(proc.c_str(), st.st_mode & 07777 & ~taken) < 0)
    bad_spec(fmt::format("cannot close {} to other users: {}", where.string(), std::strerror(errno)));
}

// Makes `name` in `dir` with exactly `mode` unless it exists. It is made
// under another name and renamed into place once it has its mode: another
// thread never finds it with less (the umask narrows mkdir's mode, and a
// sandbox uid refused the way through a folder made 0700 a moment ago
// failed a run), nor with more.
void make_folder_with_mode(int dir, const std::string& name, mode_t mode, const fs::path& where) {
  struct stat st {};
  if (::fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) return;
  const std::string making = fmt::format(".{}.making-{}-{}", name, ::getpid(), ::gettid());
  if (::mkdirat(dir, making.c_str(), 0700) < 0)
    bad_spec(fmt::format("cannot create {}: {}", where.string(), std::strerror(errno)));
  unique_fd made(::openat(dir, making.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!made || ::fchmod(made.get(), mode) < 0) {
    ::unlinkat(dir, making.c_str(), AT_REMOVEDIR);
    bad_spec(fmt::format("cannot set the mode of {}: {}", where.string(), std::strerror(errno)));
  }
  if (::renameat2(dir, making.c_str(), dir, name.c_str(), RENAME_NOREPLACE) < 0) {
    const int error = errno;
    ::unlinkat(dir, making.c_str(), AT_REMOVEDIR);
    if (error != EEXIST) bad_spec(fmt::format("cannot create {}: {}", where.string(), std::strerror(error)));
  }
}

// The folder at `path`, if no component of it is a link (openat2, Linux
// 5.6); else, or on an older kernel, an empty descriptor and errno set.
unique_fd open_without_links(const fs::path& path) {
  open_how how{};
  how.flags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
  how.resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  return unique_fd(static_cast<int>(::syscall(SYS_openat2, AT_FDCWD, path.c_str(), &how, sizeof how)));
}

}  // namespace

unique_fd open_folder_no_follow(const fs::path& path, std::optional<mode_t> create_mode) {
  if (!path.is_absolute()) bad_spec(fmt::format("{} is not an absolute path", path.string()));
  for (const auto& part : path.relative_path())
    if (part == "..") bad_spec(fmt::format("{} holds \"..\"", path.string()));
  // A folder that exists, reached without a link anywhere on the way: one
  // system call (Linux 5.6) instead of two per folder on the way. Only the
  // last folder missing (a new run's workspace), it is made in its parent,
  // reached so. Anything else (folders to make higher up, a link to name,
  // an older kernel) takes the walk.
  if (unique_fd found = open_without_links(path); found) return found;
  const std::string name = path.filename().string();
  if (create_mode && errno == ENOENT && !name.empty() && name != "." && path.has_relative_path())
    if (unique_fd parent = open_without_links(path.parent_path()); parent) {
      make_folder_with_mode(parent.get(), name, *create_mode, path);
      if (unique_fd made(::openat(parent.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)); made)
        return made;
    }
  unique_fd dir(::open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  fs::path reached = "/";
  for (const auto& part : path.relative_path()) {
    if (part.empty() || part == ".") continue;
    if (part == "..") bad_spec(fmt::format("{} holds \"..\"", path.string()));
    reached /= part;
    if (create_mode) make_folder_with_mode(dir.get(), part.string(), *create_mode, reached);
    unique_fd next(::openat(dir.get(), part.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!next) {
      if (errno == ELOOP || errno == ENOTDIR)
        bad_spec(fmt::format("{} is a symbolic link or not a folder; cairn does not follow links in the folders "
                             "it keeps runs in (remove it, or point CAIRN_HOME / --workspace at the real folder)",
                             reached.string()));
      bad_spec(fmt::format("cannot open {}: {}", reached.string(), std::strerror(errno)));
    }
    dir = std::move(next);
  }
  return dir;
}

unique_fd open_append_no_follow(int folder_fd, const fs::path& name) {
  unique_fd fd(::openat(folder_fd, name.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
  struct stat st {};
  if (!fd || ::fstat(fd.get(), &st) < 0)
    bad_spec(fmt::format("cannot open {}: {}", name.string(), std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) bad_spec(fmt::format("{} is not a regular file", name.string()));
  if ((st.st_mode & 07777) != 0600 && ::fchmod(fd.get(), 0600) < 0)
    bad_spec(fmt::format("cannot set the mode of {}: {}", name.string(), std::strerror(errno)));
  return fd;
}

void walk_tree_no_follow(int dir_fd, const fs::path& where, const tree_visitor& visit, int depth) {
  if (depth > max_depth)
    bad_spec(fmt::format("workspace folder {} is nested more than {} levels deep", where.string(), max_depth));
  int listing_fd = ::dup(dir_fd);
  DIR* listing = listing_fd < 0 ? nullptr : ::fdopendir(listing_fd);
  if (!listing) {
    if (listing_fd >= 0) ::close(listing_fd);
    bad_spec(fmt::format("cannot list {}: {}", where.string(), std::strerror(errno)));
  }
  std::unique_ptr<DIR, int (*)(DIR*)> guard(listing, ::closedir);
  while (dirent* entry = ::readdir(listing)) {
    std::string_view name = entry->d_name;
    if (name == "." || name == "..") continue;
    visit(dir_fd, entry->d_name, where / name);
    if (entry->d_type != DT_DIR && entry->d_type != DT_UNKNOWN) continue;
    // O_NOFOLLOW: a symlink to a directory is visited itself, never walked.
    unique_fd sub(::openat(dir_fd, entry->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!sub) {
      if (errno == ENOTDIR || errno == ELOOP) continue;
      // What a normal user's agent locked itself out of: nothing in there
      // runs with more than this user's rights (no root to walk for).
      if (errno == EACCES && ::geteuid() != 0) continue;
      bad_spec(fmt::format("cannot open {}: {}", (where / name).string(), std::strerror(errno)));
    }
    walk_tree_no_follow(sub.get(), where / name, visit, depth + 1);
  }
}

void close_to_others(const fs::path& dir) {
  unique_fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd) {
    if (errno == ENOENT) return;
    bad_spec(fmt::format("cannot open workspace {}: {}", dir.string(), std::strerror(errno)));
  }
  close_to_others(fd.get(), dir);
}

void close_to_others(int dir_fd, const fs::path& where) {
  // The folder first: while the walk goes on, no one else may enter it.
  if (::fchmod(dir_fd, 0700) < 0)
    bad_spec(fmt::format("cannot close {} to other users: {}", where.string(), std::strerror(errno)));
  walk_tree_no_follow(dir_fd, where, [](int parent, const char* name, const fs::path& at) {
    unique_fd entry(::openat(parent, name, O_PATH | O_NOFOLLOW | O_CLOEXEC));
    if (entry) take_mode_bits(entry.get(), open_to_others, at);
  });
}

std::optional<std::string> swappable_ancestor(const std::filesystem::path& path) {
  std::filesystem::path at = "/";
  auto judge = [&](const std::filesystem::path& folder) -> std::optional<std::string> {
    struct stat st {};
    if (::lstat(folder.c_str(), &st) < 0) return std::nullopt;  // made later, by cairn, as its own
    if (S_ISLNK(st.st_mode)) return fmt::format("{} is a symbolic link", folder.string());
    if (st.st_uid != 0 && st.st_uid != ::geteuid())
      return fmt::format("{} belongs to uid {}, who could put another folder in its place", folder.string(),
                         st.st_uid);
    const bool sticky = st.st_mode & S_ISVTX;
    if ((st.st_mode & S_IWOTH) && !sticky)
      return fmt::format("{} may be written by every user (mode {:04o}), who could put another folder in its place",
                         folder.string(), st.st_mode & 07777);
    if ((st.st_mode & S_IWGRP) && !sticky && st.st_gid != ::getegid())
      return fmt::format("{} may be written by its group {} (mode {:04o}), whose members could put another folder "
                         "in its place",
                         folder.string(), st.st_gid, st.st_mode & 07777);
    return std::nullopt;
  };
  if (auto why = judge(at)) return why;
  for (const auto& part : path.lexically_normal().parent_path().relative_path()) {
    if (part.empty()) continue;
    at /= part;
    if (auto why = judge(at)) return why;
  }
  return std::nullopt;
}

}  // namespace cairn::runtime
