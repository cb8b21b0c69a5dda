#include "engine/workspace_files.hpp"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <optional>

#include <fmt/format.h>

#include "engine/engine.hpp"
#include "engine/run_paths.hpp"
#include "runtime/fuse_mount.hpp"
#include "runtime/loop_mount.hpp"
#include "runtime/no_follow.hpp"
#include "runtime/workspace_quota.hpp"

namespace cairn::engine {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void not_found(const std::string& what) { throw engine_error(errc::not_found, what); }

// "a/b" from "a/b", "/workspace/a/b", "./a//b/"; refuses "..".
std::vector<std::string> components(const std::string& path) {
  std::vector<std::string> parts;
  for (const auto& part : fs::path(path).lexically_normal()) {
    const std::string name = part.string();
    if (name.empty() || name == "/" || name == ".") continue;
    if (name == "..") not_found(fmt::format("'{}' leaves the workspace", path));
    parts.push_back(name);
  }
  if (!parts.empty() && parts.front() == "workspace" && path.starts_with("/")) parts.erase(parts.begin());
  return parts;
}

workspace_entry entry_at(int dir_fd, const char* name, const std::string& path) {
  workspace_entry e;
  e.path = path;
  struct stat st {};
  if (::fstatat(dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) return e;
  if (S_ISDIR(st.st_mode)) {
    e.type = 'd';
  } else if (S_ISREG(st.st_mode)) {
    e.type = 'f';
    e.size = static_cast<std::uint64_t>(st.st_size);
  } else if (S_ISLNK(st.st_mode)) {
    e.type = 'l';
    std::string target(4096, '\0');
    ssize_t n = ::readlinkat(dir_fd, name, target.data(), target.size());
    target.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
    e.target = target;
  }
  return e;
}

}  // namespace

struct workspace_files::fuse_view {
  fs::path folder;
  std::optional<runtime::fuse_mount> mount;
  ~fuse_view() {
    mount.reset();
    ::rmdir(folder.c_str());
  }
};

workspace_files::~workspace_files() {
  root_.reset();
  fuse_.reset();
}

workspace_files::workspace_files(const fs::path& home, const storage::run_record& run) {
  const fs::path folder = run.workspace, image = find_run_image(home, run.id, run.workspace);
  if (auto whole = runtime::cut_short_release(folder, image)) {
    root_.reset(::open(whole->c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!root_) not_found(fmt::format("run {}: opening {} ({})", run.id, whole->string(), std::strerror(errno)));
    source_ = "the copy of its files at " + whole->string() + ", which a crash kept from taking its folder's place";
    return;
  }
  std::error_code ec;
  // A live run's image is mounted at its folder: read there.
  const bool in_image = fs::exists(image, ec) && !runtime::is_loop_mount_of(folder, image) &&
                        !runtime::is_fuse_mount_of(folder, image);
  if (!in_image) {
    root_.reset(::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!root_) not_found(fmt::format("run {} has no workspace at {} ({})", run.id, folder.string(), std::strerror(errno)));
    source_ = "its folder " + folder.string();
    return;
  }
  if (::geteuid() != 0) {
    std::string why;
    const auto tools = runtime::find_fuse_tools(why);
    if (!tools)
      throw engine_error(errc::bad_request,
                         fmt::format("the files of run {} are in its quota image {}, which this user mounts through "
                                     "FUSE: it {}",
                                     run.id, image.string(), why));
    char mount_point[] = "/tmp/cairn-workspace-XXXXXX";
    if (!::mkdtemp(mount_point))
      throw engine_error(errc::bad_request, fmt::format("mkdtemp: {}", std::strerror(errno)));
    fuse_ = std::make_unique<fuse_view>();
    fuse_->folder = mount_point;
    try {
      fuse_->mount.emplace(*tools, image, mount_point, true);
    } catch (const runtime::sandbox_error& e) {
      throw engine_error(errc::bad_request, fmt::format("run {}'s quota image {}: {}", run.id, image.string(), e.what()));
    }
    root_.reset(::open(mount_point, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!root_) throw engine_error(errc::bad_request, fmt::format("opening {}: {}", image.string(), std::strerror(errno)));
    source_ = "its quota image " + image.string() + ", mounted read-only through FUSE";
    return;
  }
  try {
    runtime::enter_private_mount_namespace();
    char mount_point[] = "/tmp/cairn-workspace-XXXXXX";
    if (!::mkdtemp(mount_point))
      throw engine_error(errc::bad_request, fmt::format("mkdtemp: {}", std::strerror(errno)));
    runtime::mount_image_read_only(image, mount_point);
    root_.reset(::open(mount_point, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    // Detached at once: it stays reachable through root_ and goes with the process.
    ::umount2(mount_point, MNT_DETACH);
    ::rmdir(mount_point);
  } catch (const runtime::sandbox_error& e) {
    throw engine_error(errc::bad_request, fmt::format("run {}'s quota image {}: {}", run.id, image.string(), e.what()));
  }
  if (!root_) throw engine_error(errc::bad_request, fmt::format("opening {}: {}", image.string(), std::strerror(errno)));
  source_ = "its quota image " + image.string() + ", mounted read-only";
}

runtime::unique_fd workspace_files::open(const std::string& path, int flags) const {
  const auto parts = components(path);
  runtime::unique_fd dir(::dup(root_.get()));
  std::string walked;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    walked += (walked.empty() ? "" : "/") + parts[i];
    const bool last = i + 1 == parts.size();
    runtime::unique_fd next(
        ::openat(dir.get(), parts[i].c_str(), (last ? flags : O_RDONLY | O_DIRECTORY) | O_NOFOLLOW | O_CLOEXEC));
    if (!next) {
      const int error = errno;
      struct stat st {};
      if (::fstatat(dir.get(), parts[i].c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode))
        not_found(fmt::format("'{}' is a link: cairn never follows a link in a workspace", walked));
      not_found(fmt::format("'{}': {}", walked, std::strerror(error)));
    }
    dir = std::move(next);
  }
  return dir;
}

std::vector<workspace_entry> workspace_files::list(const std::string& path) const {
  const auto parts = components(path);
  std::string base;
  for (const auto& p : parts) base += (base.empty() ? "" : "/") + p;
  std::vector<workspace_entry> entries;
  if (!parts.empty()) {
    runtime::unique_fd parent = open(fs::path(base).has_parent_path() ? fs::path(base).parent_path().string() : "",
                                     O_RDONLY | O_DIRECTORY);
    entries.push_back(entry_at(parent.get(), fs::path(base).filename().c_str(), base));
    if (entries.back().type != 'd') return entries;
  }
  runtime::unique_fd dir = open(base, O_RDONLY | O_DIRECTORY);
  try {
    runtime::walk_tree_no_follow(dir.get(), base, [&](int dir_fd, const char* name, const fs::path& where) {
      entries.push_back(entry_at(dir_fd, name, where.string()));
    });
  } catch (const runtime::sandbox_error& e) {
    not_found(e.what());
  }
  return entries;
}

bool workspace_files::is_file(const std::string& path) const {
  const auto parts = components(path);
  if (parts.empty()) return false;
  fs::path joined;
  for (const auto& p : parts) joined /= p;
  runtime::unique_fd parent = open(joined.parent_path().string(), O_RDONLY | O_DIRECTORY);
  return entry_at(parent.get(), parts.back().c_str(), joined.string()).type == 'f';
}

void workspace_files::read(const std::string& path, std::uint64_t max_bytes,
                           const std::function<void(const char*, std::size_t)>& take) const {
  // O_NONBLOCK: a fifo the agent put in the file's place since is_file()
  // would hold the open until someone writes; it returns at once instead.
  runtime::unique_fd file = open(path, O_RDONLY | O_NONBLOCK);
  struct stat st {};
  if (::fstat(file.get(), &st) < 0 || !S_ISREG(st.st_mode))
    not_found(fmt::format("'{}' is not a regular file (the run's agent may have replaced it): nothing was read", path));
  if (::fcntl(file.get(), F_SETFL, ::fcntl(file.get(), F_GETFL) & ~O_NONBLOCK) < 0)
    not_found(fmt::format("reading '{}': {}", path, std::strerror(errno)));
  char buffer[1 << 16];
  for (std::uint64_t taken = 0; taken < max_bytes;) {
    ssize_t n = ::read(file.get(), buffer, static_cast<std::size_t>(std::min<std::uint64_t>(sizeof buffer, max_bytes - taken)));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) not_found(fmt::format("reading '{}': {}", path, std::strerror(errno)));
    if (n == 0) return;
    taken += static_cast<std::uint64_t>(n);
    take(buffer, static_cast<std::size_t>(n));
  }
}

}  // namespace cairn::engine
