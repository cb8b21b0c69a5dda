#include "runtime/host_paths.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace cairn::runtime {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void bad_spec(const std::string& message) {
  throw sandbox_error(sandbox_errc::bad_spec, message);
}

// A deeper tree is refused rather than walked: each level holds an fd.
constexpr int max_chown_depth = 128;

void chown_dir(int dir_fd, const fs::path& where, uid_t uid, gid_t gid, int depth) {
  if (depth > max_chown_depth)
    bad_spec(fmt::format("workspace folder {} is nested more than {} levels deep", where.string(),
                         max_chown_depth));
  if (::fchown(dir_fd, uid, gid) < 0)
    bad_spec(
        fmt::format("cannot chown {} to the sandbox uid {}: {}", where.string(), uid, std::strerror(errno)));
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
    if (::fchownat(dir_fd, entry->d_name, uid, gid, AT_SYMLINK_NOFOLLOW) < 0)
      bad_spec(fmt::format("cannot chown {} to the sandbox uid {}: {}", (where / name).string(), uid,
                           std::strerror(errno)));
    if (entry->d_type != DT_DIR && entry->d_type != DT_UNKNOWN) continue;
    // O_NOFOLLOW: a symlink to a directory is chowned itself, never walked.
    unique_fd sub(::openat(dir_fd, entry->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!sub) {
      if (errno == ENOTDIR || errno == ELOOP) continue;
      bad_spec(fmt::format("cannot open {}: {}", (where / name).string(), std::strerror(errno)));
    }
    chown_dir(sub.get(), where / name, uid, gid, depth + 1);
  }
}

// The permission class (owner, group, other) of mode bits that applies to uid/gid.
mode_t class_bits(const struct stat& st, uid_t uid, gid_t gid, mode_t owner, mode_t group, mode_t other) {
  if (st.st_uid == uid) return st.st_mode & owner;
  if (st.st_gid == gid) return st.st_mode & group;
  return st.st_mode & other;
}

bool valid_env_name(const std::string& name) {
  return !name.empty() && name.find('=') == std::string::npos && name.find('\0') == std::string::npos;
}

}  // namespace

fs::path prepare_workspace(const fs::path& workspace) {
  if (workspace.empty()) bad_spec("the sandbox spec has no workspace folder");
  std::error_code ec;
  fs::create_directories(workspace, ec);
  if (ec) bad_spec(fmt::format("cannot create workspace {}: {}", workspace.string(), ec.message()));
  fs::path canonical = fs::canonical(workspace, ec);
  if (ec || !fs::is_directory(canonical))
    bad_spec(fmt::format("workspace {} is not a folder", workspace.string()));
  return canonical;
}

void chown_tree(const fs::path& dir, uid_t uid, gid_t gid) {
  unique_fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd) bad_spec(fmt::format("cannot open workspace {}: {}", dir.string(), std::strerror(errno)));
  chown_dir(fd.get(), dir, uid, gid, 0);
}

std::optional<fs::path> first_unsearchable_dir(const fs::path& path, uid_t uid, gid_t gid) {
  fs::path dir = "/";
  auto check = [&](const fs::path& d) {
    struct stat st {};
    return ::stat(d.c_str(), &st) == 0 && class_bits(st, uid, gid, S_IXUSR, S_IXGRP, S_IXOTH) != 0;
  };
  if (!check(dir)) return dir;
  fs::path parent = path.parent_path();
  for (const auto& part : parent.relative_path()) {
    dir /= part;
    if (!check(dir)) return dir;
  }
  return std::nullopt;
}

bool may_read_and_execute(const fs::path& path, uid_t uid, gid_t gid) {
  struct stat st {};
  if (::stat(path.c_str(), &st) < 0) return false;
  mode_t r = class_bits(st, uid, gid, S_IRUSR, S_IRGRP, S_IROTH);
  mode_t x = class_bits(st, uid, gid, S_IXUSR, S_IXGRP, S_IXOTH);
  return r && x;
}

fs::path check_program(const fs::path& program) {
  std::error_code ec;
  fs::path canonical = fs::canonical(program, ec);
  if (ec) bad_spec(fmt::format("agent program {} does not exist: {}", program.string(), ec.message()));
  struct stat st {};
  if (::stat(canonical.c_str(), &st) < 0 || !S_ISREG(st.st_mode))
    bad_spec(fmt::format("agent program {} is not a regular file", program.string()));
  if ((st.st_mode & (S_IXUSR | S_IXGRP | S_IXOTH)) == 0)
    bad_spec(fmt::format("agent program {} is not executable (chmod +x it)", program.string()));
  return canonical;
}

void check_agent_args(const std::vector<std::string>& args) {
  for (const auto& arg : args)
    if (arg.find('\0') != std::string::npos) bad_spec("an agent argument contains a NUL byte");
}

unique_fd open_log(const fs::path& log_file) {
  if (log_file.empty()) bad_spec("the sandbox spec has no log file");
  std::error_code ec;
  if (log_file.has_parent_path()) fs::create_directories(log_file.parent_path(), ec);
  unique_fd fd(::open(log_file.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640));
  if (!fd) bad_spec(fmt::format("cannot open log file {}: {}", log_file.string(), std::strerror(errno)));
  return fd;
}

std::map<std::string, std::string> agent_environment(const sandbox_spec& spec,
                                                     std::map<std::string, std::string> base) {
  for (const auto& [name, value] : spec.env) {
    if (!valid_env_name(name)) bad_spec(fmt::format("invalid environment variable name '{}'", name));
    if (value.find('\0') != std::string::npos)
      bad_spec(fmt::format("environment variable {} contains a NUL byte", name));
    base[name] = value;
  }
  if (spec.run_id.find('\0') != std::string::npos) bad_spec("the run id contains a NUL byte");
  base.insert_or_assign("CAIRN_CHANNEL_FD", std::string("3"));
  base.insert_or_assign("CAIRN_RUN_ID", spec.run_id);
  return base;
}

}  // namespace cairn::runtime
