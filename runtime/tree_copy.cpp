#include "runtime/tree_copy.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "runtime/sandbox.hpp"
#include "runtime/unique_fd.hpp"

namespace cairn::runtime {
namespace {

namespace fs = std::filesystem;

// A deeper tree is refused rather than walked: each level holds two fds.
constexpr int max_depth = 128;

[[noreturn]] void failed(const std::string& what, const fs::path& where) {
  throw sandbox_error(sandbox_errc::workspace_failed,
                      fmt::format("{} {}: {}", what, where.string(), std::strerror(errno)));
}

std::vector<std::string> entries(int dir, const fs::path& where) {
  int copy = ::dup(dir);
  DIR* listing = copy < 0 ? nullptr : ::fdopendir(copy);
  if (!listing) {
    if (copy >= 0) ::close(copy);
    failed("cannot list", where);
  }
  std::unique_ptr<DIR, int (*)(DIR*)> guard(listing, ::closedir);
  ::rewinddir(listing);  // the dup shares its position with `dir`
  std::vector<std::string> names;
  while (dirent* entry = ::readdir(listing)) {
    std::string_view name = entry->d_name;
    if (name != "." && name != "..") names.emplace_back(name);
  }
  return names;
}

// Gives `name` in `dir` (a folder or a regular file, as `st` says) the
// owner's permissions in `needed` when this process owns it (not root: its
// sandboxes' files are another uid's, and root needs none): an agent may
// have made its own files and folders unreadable, unsearchable or
// unwritable, mode 0 even, and the trees copied or cleared here are
// emptied or deleted afterwards.
void let_owner_in(int dir, const std::string& name, const struct stat& st, mode_t needed) {
  if (st.st_uid == ::geteuid() && ::geteuid() != 0 && (st.st_mode & needed) != needed)
    ::fchmodat(dir, name.c_str(), (st.st_mode | needed) & 07777, 0);
}

void remove_entry(int dir, const std::string& name, const fs::path& where, int depth) {
  if (::unlinkat(dir, name.c_str(), 0) == 0 || errno == ENOENT) return;
  if (errno != EISDIR && errno != EPERM) failed("cannot remove", where);
  // To list it, enter it and remove what it holds.
  if (struct stat st {}; ::fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode))
    let_owner_in(dir, name, st, S_IRWXU);
  unique_fd sub(::openat(dir, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!sub) failed("cannot open", where);
  if (depth > max_depth) failed("too deeply nested:", where);
  for (const auto& child : entries(sub.get(), where)) remove_entry(sub.get(), child, where / child, depth + 1);
  if (::unlinkat(dir, name.c_str(), AT_REMOVEDIR) < 0) failed("cannot remove", where);
}

// Owner, permissions and modification time of `st` onto the open `fd`.
void copy_attributes(int fd, const struct stat& st, mode_t keep, const fs::path& where) {
  if (::fchown(fd, st.st_uid, st.st_gid) < 0 || ::fchmod(fd, st.st_mode & keep) < 0)
    failed("cannot set the owner and mode of", where);
  const timespec times[2] = {st.st_atim, st.st_mtim};
  ::futimens(fd, times);
}

std::uint64_t allocated(const struct stat& st) { return static_cast<std::uint64_t>(st.st_blocks) * 512; }

// One copy_tree() call: what it has written so far, and where the first
// copy of each multiply linked file went, so its other names become links.
struct copy_state {
  int to_root;
  std::uint64_t max_bytes;
  std::uint64_t written = 0;
  std::map<std::pair<dev_t, ino_t>, fs::path> linked;  // source inode -> path under to_root

  // Counts what `fd` occupies now; past max_bytes the copy stops.
  void charge(int fd, const fs::path& where) {
    struct stat st {};
    if (::fstat(fd, &st) < 0) failed("cannot stat", where);
    written += allocated(st);
    check(0, where);
  }
  void check(std::uint64_t more, const fs::path& where) const {
    if (written + more <= max_bytes) return;
    throw sandbox_error(sandbox_errc::workspace_failed,
                        fmt::format("copying the workspace stopped at {}: its files take more than {} MiB on "
                                    "disk, the most its quota image can hold",
                                    where.string(), max_bytes >> 20));
  }
};

void copy_range(int from, int to, off_t offset, off_t end, const fs::path& where) {
  while (offset < end) {
    off_t in = offset, out = offset;
    ssize_t n = ::copy_file_range(from, &in, to, &out, static_cast<std::size_t>(end - offset), 0);
    if (n > 0) {
      offset += n;
      continue;
    }
    if (n == 0) return;  // the file shrank meanwhile
    if (errno == EINTR) continue;
    if (errno != EXDEV && errno != ENOSYS && errno != EINVAL && errno != EOPNOTSUPP) failed("cannot copy", where);
    break;  // no copy_file_range between these filesystems: read and write
  }
  char buffer[65536];
  while (offset < end) {
    ssize_t n = ::pread(from, buffer, static_cast<std::size_t>(std::min<off_t>(end - offset, sizeof buffer)), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) failed("cannot read", where);
    if (n == 0) return;
    for (ssize_t off = 0; off < n;) {
      ssize_t w = ::pwrite(to, buffer + off, static_cast<std::size_t>(n - off), offset + off);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) failed("cannot write", where);
      off += w;
    }
    offset += n;
  }
}

// Only the data: a hole of `from` stays a hole of `to` (SEEK_DATA/SEEK_HOLE),
// so a sparse file takes no more room in the copy than in the original.
void copy_contents(int from, int to, off_t size, const fs::path& where) {
  for (off_t data = 0; data < size;) {
    data = ::lseek(from, data, SEEK_DATA);
    if (data < 0 && errno == ENXIO) break;  // only a hole is left
    if (data < 0) failed("cannot seek in", where);
    off_t hole = ::lseek(from, data, SEEK_HOLE);
    if (hole < 0) failed("cannot seek in", where);
    copy_range(from, to, data, std::min(hole, size), where);
    data = hole;
  }
  if (::ftruncate(to, size) < 0) failed("cannot size", where);
}

void copy_entry(copy_state& state, int from, int to, const std::string& name, const fs::path& from_path,
                const fs::path& to_path, const fs::path& relative, int depth) {
  struct stat st {};
  if (::fstatat(from, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) < 0) failed("cannot stat", from_path);
  if (S_ISDIR(st.st_mode)) {
    if (depth > max_depth) failed("too deeply nested:", from_path);
    let_owner_in(from, name, st, S_IRUSR | S_IXUSR);
    unique_fd source(::openat(from, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!source) failed("cannot open", from_path);
    unique_fd target(::openat(to, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!target) {
      remove_entry(to, name, to_path, 0);
      if (::mkdirat(to, name.c_str(), 0700) < 0) failed("cannot create", to_path);
      target.reset(::openat(to, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!target) failed("cannot open", to_path);
    }
    for (const auto& child : entries(source.get(), from_path))
      copy_entry(state, source.get(), target.get(), child, from_path / child, to_path / child, relative / child,
                 depth + 1);
    copy_attributes(target.get(), st, 01777, to_path);
    state.charge(target.get(), to_path);
  } else if (S_ISREG(st.st_mode)) {
    remove_entry(to, name, to_path, 0);
    if (st.st_nlink > 1) {
      auto [first, fresh] = state.linked.try_emplace({st.st_dev, st.st_ino}, relative);
      // Every path below to_root is a folder this copy made or opened without following links.
      if (!fresh && ::linkat(state.to_root, first->second.c_str(), to, name.c_str(), 0) == 0) return;
    }
    state.check(allocated(st), from_path);
    let_owner_in(from, name, st, S_IRUSR);
    unique_fd source(::openat(from, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (!source) failed("cannot open", from_path);
    unique_fd target(::openat(to, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!target) failed("cannot create", to_path);
    copy_contents(source.get(), target.get(), st.st_size, to_path);
    copy_attributes(target.get(), st, 0777, to_path);
    state.charge(target.get(), to_path);
  } else if (S_ISLNK(st.st_mode)) {
    std::string link(static_cast<std::size_t>(st.st_size) + 1, '\0');
    ssize_t n = ::readlinkat(from, name.c_str(), link.data(), link.size());
    if (n < 0) failed("cannot read the link", from_path);
    link.resize(static_cast<std::size_t>(n));
    remove_entry(to, name, to_path, 0);
    if (::symlinkat(link.c_str(), to, name.c_str()) < 0) failed("cannot create", to_path);
    ::fchownat(to, name.c_str(), st.st_uid, st.st_gid, AT_SYMLINK_NOFOLLOW);
    state.written += link.size() > 60 ? 4096 : 0;  // ext4 keeps short targets in the inode
    state.check(0, to_path);
  }
}

}  // namespace

void copy_tree(int from, int to, const fs::path& from_name, const fs::path& to_name, std::uint64_t max_bytes) {
  copy_state state{to, max_bytes, 0, {}};
  for (const auto& name : entries(from, from_name))
    copy_entry(state, from, to, name, from_name / name, to_name / name, name, 1);
}

void clear_tree(int dir, const fs::path& name) {
  for (const auto& child : entries(dir, name)) remove_entry(dir, child, name / child, 1);
}

bool has_entries(int dir) { return !entries(dir, "").empty(); }

}  // namespace cairn::runtime
