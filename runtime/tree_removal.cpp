#include "runtime/tree_removal.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "runtime/no_follow.hpp"
#include "runtime/sandbox.hpp"
#include "runtime/tree_copy.hpp"

namespace cairn::runtime {
namespace fs = std::filesystem;

namespace {

std::uint64_t freed_by(const struct stat& st) {
  return S_ISDIR(st.st_mode) || st.st_nlink <= 1 ? static_cast<std::uint64_t>(st.st_blocks) * 512 : 0;
}

[[noreturn]] void cannot(const std::string& what, const fs::path& where) {
  throw sandbox_error(sandbox_errc::workspace_failed,
                      fmt::format("cannot {} {}: {}", what, where.string(), std::strerror(errno)));
}

}  // namespace

std::uint64_t remove_no_follow(const fs::path& path) {
  const unique_fd parent = open_folder_no_follow(path.parent_path());
  const std::string name = path.filename().string();
  struct stat st {};
  if (::fstatat(parent.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) < 0) {
    if (errno == ENOENT) return 0;
    cannot("stat", path);
  }
  std::uint64_t bytes = freed_by(st);
  if (!S_ISDIR(st.st_mode)) {
    if (::unlinkat(parent.get(), name.c_str(), 0) < 0 && errno != ENOENT) cannot("remove", path);
    return bytes;
  }
  unique_fd dir(::openat(parent.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dir) cannot("open", path);
  // Counted first, and any mount found, before anything goes.
  walk_tree_no_follow(dir.get(), path, [&](int at, const char* entry, const fs::path& where) {
    struct stat e {};
    if (::fstatat(at, entry, &e, AT_SYMLINK_NOFOLLOW) < 0) return;
    if (e.st_dev != st.st_dev)
      throw sandbox_error(sandbox_errc::bad_spec,
                          fmt::format("{} is a mount point (a workspace image still mounted?); unmount it first, then "
                                      "remove again",
                                      where.string()));
    bytes += freed_by(e);
  });
  clear_tree(dir.get(), path);
  if (::unlinkat(parent.get(), name.c_str(), AT_REMOVEDIR) < 0 && errno != ENOENT) cannot("remove", path);
  return bytes;
}

}  // namespace cairn::runtime
