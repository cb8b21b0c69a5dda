#include "runtime/tree_copy.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
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

void remove_entry(int dir, const std::string& name, const fs::path& where, int depth) {
  if (::unlinkat(dir, name.c_str(), 0) == 0 || errno == ENOENT) return;
  if (errno != EISDIR && errno != EPERM) failed("cannot remove", where);
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

void copy_contents(int from, int to, const fs::path& where) {
  for (;;) {
    ssize_t n = ::copy_file_range(from, nullptr, to, nullptr, 1 << 30, 0);
    if (n == 0) return;
    if (n > 0) continue;
    if (errno == EINTR) continue;
    if (errno != EXDEV && errno != ENOSYS && errno != EINVAL && errno != EOPNOTSUPP) failed("cannot copy", where);
    break;  // no copy_file_range between these filesystems: read and write
  }
  char buffer[65536];
  for (;;) {
    ssize_t n = ::read(from, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) failed("cannot read", where);
    if (n == 0) return;
    for (ssize_t off = 0; off < n;) {
      ssize_t w = ::write(to, buffer + off, static_cast<std::size_t>(n - off));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) failed("cannot write", where);
      off += w;
    }
  }
}

void copy_entry(int from, int to, const std::string& name, const fs::path& from_path, const fs::path& to_path,
                int depth) {
  struct stat st {};
  if (::fstatat(from, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) < 0) failed("cannot stat", from_path);
  if (S_ISDIR(st.st_mode)) {
    if (depth > max_depth) failed("too deeply nested:", from_path);
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
      copy_entry(source.get(), target.get(), child, from_path / child, to_path / child, depth + 1);
    copy_attributes(target.get(), st, 01777, to_path);
  } else if (S_ISREG(st.st_mode)) {
    unique_fd source(::openat(from, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (!source) failed("cannot open", from_path);
    remove_entry(to, name, to_path, 0);
    unique_fd target(::openat(to, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!target) failed("cannot create", to_path);
    copy_contents(source.get(), target.get(), to_path);
    copy_attributes(target.get(), st, 0777, to_path);
  } else if (S_ISLNK(st.st_mode)) {
    std::string link(static_cast<std::size_t>(st.st_size) + 1, '\0');
    ssize_t n = ::readlinkat(from, name.c_str(), link.data(), link.size());
    if (n < 0) failed("cannot read the link", from_path);
    link.resize(static_cast<std::size_t>(n));
    remove_entry(to, name, to_path, 0);
    if (::symlinkat(link.c_str(), to, name.c_str()) < 0) failed("cannot create", to_path);
    ::fchownat(to, name.c_str(), st.st_uid, st.st_gid, AT_SYMLINK_NOFOLLOW);
  }
}

}  // namespace

void copy_tree(int from, int to, const fs::path& from_name, const fs::path& to_name) {
  for (const auto& name : entries(from, from_name)) copy_entry(from, to, name, from_name / name, to_name / name, 1);
}

void clear_tree(int dir, const fs::path& name) {
  for (const auto& child : entries(dir, name)) remove_entry(dir, child, name / child, 1);
}

bool has_entries(int dir) { return !entries(dir, "").empty(); }

}  // namespace cairn::runtime
