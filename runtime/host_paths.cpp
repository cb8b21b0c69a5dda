#include "runtime/host_paths.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include "runtime/no_follow.hpp"

namespace cairn::runtime {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void bad_spec(const std::string& message) {
  throw sandbox_error(sandbox_errc::bad_spec, message);
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

fs::path prepare_workspace_parent(const fs::path& workspace) {
  if (workspace.empty()) bad_spec("the sandbox spec has no workspace folder");
  fs::path path = fs::absolute(workspace).lexically_normal();
  // Root chowns, mounts and binds the folder by its path after this: no
  // other user may be able to put another folder in its place meanwhile.
  if (::geteuid() == 0)
    if (auto why = swappable_ancestor(path))
      bad_spec(fmt::format("workspace {} is refused: {}; cairn runs as root and would then act on that folder "
                           "instead. Keep workspaces where only root may change the folders above them (chown "
                           "root, chmod go-w)",
                           path.string(), *why));
  // Under root the sandbox uid passes through the folders above (search, never list).
  open_folder_no_follow(path.parent_path(), ::geteuid() == 0 ? 0711 : 0700);
  return path;
}

fs::path prepare_workspace(const fs::path& workspace) {
  fs::path path = prepare_workspace_parent(workspace);
  open_folder_no_follow(path, 0700);
  return path;
}

void chown_tree(const fs::path& dir, uid_t uid, gid_t gid) {
  // Walked from "/" without links: no component of the path leads elsewhere.
  unique_fd fd = open_folder_no_follow(fs::absolute(dir).lexically_normal());
  auto failed = [&](const fs::path& where) {
    bad_spec(fmt::format("cannot chown {} to the sandbox uid {}: {}", where.string(), uid, std::strerror(errno)));
  };
  if (::fchown(fd.get(), uid, gid) < 0) failed(dir);
  walk_tree_no_follow(fd.get(), dir, [&](int dir_fd, const char* name, const fs::path& where) {
    if (::fchownat(dir_fd, name, uid, gid, AT_SYMLINK_NOFOLLOW) < 0) failed(where);
  });
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

fs::path script_folder(const fs::path& program) {
  fs::path canonical = check_program(program);
  unique_fd file(::open(canonical.c_str(), O_RDONLY | O_CLOEXEC));
  char head[2] = {};
  if (!file || ::read(file.get(), head, sizeof head) != sizeof head || head[0] != '#' || head[1] != '!') return {};
  return canonical.parent_path();
}

void check_agent_args(const std::vector<std::string>& args) {
  for (const auto& arg : args)
    if (arg.find('\0') != std::string::npos) bad_spec("an agent argument contains a NUL byte");
}

unique_fd open_log(const fs::path& log_file) {
  if (log_file.empty()) bad_spec("the sandbox spec has no log file");
  fs::path path = fs::absolute(log_file).lexically_normal();
  unique_fd folder = open_folder_no_follow(path.parent_path(), 0700);
  try {
    return open_append_no_follow(folder.get(), path.filename());
  } catch (const sandbox_error& e) {
    bad_spec(fmt::format("log file {}: {}", path.string(), e.what()));
  }
}

namespace {

// Whether the node on PATH takes --disable-wasm-trap-handler in NODE_OPTIONS:
// Node 20.15 and 22.2 on. An older one (Debian 12's is 18) refuses to start
// with it ("not allowed in NODE_OPTIONS", exit 9), and reserves no 10 GiB
// for WebAssembly either. Asked once per process; no node: not set.
bool node_takes_wasm_trap_flag() {
  static const bool takes = [] {
    FILE* p = ::popen("node --version 2>/dev/null", "r");
    if (!p) return false;
    char line[64] = {};
    const bool read = std::fgets(line, sizeof line, p) != nullptr;
    ::pclose(p);
    int major = 0, minor = 0;
    if (!read || std::sscanf(line, "v%d.%d", &major, &minor) != 2) return false;
    return (major == 20 && minor >= 15) || (major == 22 && minor >= 2) || major > 22;
  }();
  return takes;
}

}  // namespace

void add_address_space_environment(std::map<std::string, std::string>& base) {
  base["MALLOC_ARENA_MAX"] = "2";
  if (node_takes_wasm_trap_flag()) base["NODE_OPTIONS"] = "--disable-wasm-trap-handler";
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
