#include "runtime/bwrap_support.hpp"

#include "runtime/agent_sdks.hpp"

#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "runtime/own_records.hpp"

namespace cairn::runtime {
namespace {

namespace fs = std::filesystem;

constexpr uid_t default_sandbox_uid = 61000;

bool is_executable_file(const fs::path& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
}

std::optional<long> read_sysctl(const char* path) {
  std::ifstream in(path);
  long value;
  if (in >> value) return value;
  return std::nullopt;
}

// The whole of a small /proc file; empty when it cannot be read.
std::string read_proc(const std::string& path) {
  unique_fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  std::string content;
  char buffer[4096];
  ssize_t n;
  while (fd && (n = ::read(fd.get(), buffer, sizeof buffer)) > 0 && content.size() < 65536)
    content.append(buffer, static_cast<std::size_t>(n));
  return content;
}

bool is_sandbox_bwrap(pid_t pid) {
  std::string cmdline = read_proc("/proc/" + std::to_string(pid) + "/cmdline");
  std::vector<std::string_view> argv;
  for (std::string_view rest = cmdline; !rest.empty() && argv.size() < 5;) {
    auto nul = rest.find('\0');
    argv.push_back(rest.substr(0, nul));
    rest = nul == std::string_view::npos ? std::string_view() : rest.substr(nul + 1);
  }
  return argv.size() == 5 && fs::path(argv[0]).filename() == "bwrap" && argv[1] == "--args" &&
         argv[2] == std::to_string(bwrap_args_fd) && argv[3] == "--" &&
         (argv[4] == sandbox_agent_path || argv[4].starts_with(std::string(sandbox_app_folder) + "/"));
}

// From /proc/PID/status: the parent, and whether PID is pid 1 of a pid
// namespace below ours ("NSpid: 8487 1").
struct proc_status {
  pid_t parent = 0;
  bool namespace_init = false;
};
proc_status read_status(pid_t pid) {
  proc_status st;
  std::istringstream lines(read_proc("/proc/" + std::to_string(pid) + "/status"));
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    std::string key;
    fields >> key;
    if (key == "PPid:") fields >> st.parent;
    if (key == "NSpid:") {
      std::vector<long> ids;
      for (long id; fields >> id;) ids.push_back(id);
      st.namespace_init = ids.size() >= 2 && ids.back() == 1;
    }
  }
  return st;
}

// Field 22 of /proc/PID/stat; empty when the process is gone.
std::string start_time(pid_t pid) {
  std::string stat = read_proc("/proc/" + std::to_string(pid) + "/stat");
  auto close = stat.rfind(')');  // comm may hold anything
  if (close == std::string::npos) return {};
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i) {
  }
  return field;
}

// The record token in the environment of `pid`, if any.
std::string record_token_of(pid_t pid) {
  const std::string wanted = std::string(sandbox_record_env) + "=";
  std::string environ = read_proc("/proc/" + std::to_string(pid) + "/environ");
  for (std::string_view rest = environ; !rest.empty();) {
    auto nul = rest.find('\0');
    std::string_view entry = rest.substr(0, nul);
    if (entry.starts_with(wanted)) return std::string(entry.substr(wanted.size()));
    rest = nul == std::string_view::npos ? std::string_view() : rest.substr(nul + 1);
  }
  return {};
}

bool is_orphaned_sandbox(pid_t pid) {
  if (!is_sandbox_bwrap(pid)) return false;
  proc_status st = read_status(pid);
  // While bwrap lives, its child's parent is bwrap itself.
  return st.namespace_init && !is_sandbox_bwrap(st.parent);
}

}  // namespace

std::string host_identity() { return fmt::format("{} {}", ::getpid(), start_time(::getpid())); }

bool host_alive(const std::string& identity) {
  std::istringstream fields(identity);
  pid_t pid = 0;
  std::string start;
  return fields >> pid >> start && pid > 0 && start_time(pid) == start;
}

std::size_t kill_orphaned_sandboxes() {
  auto records = own_records(sandbox_record_kind);
  std::set<std::string> recorded, running;
  for (const auto& r : records) recorded.insert(r.token);
  std::vector<unique_fd> killed;
  std::error_code ec;
  for (fs::directory_iterator it("/proc", ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    pid_t pid = std::stoi(name);
    if (!is_sandbox_bwrap(pid)) continue;
    const std::string token = record_token_of(pid);
    if (token.empty() || !recorded.count(token)) continue;  // not one cairn started
    running.insert(token);
    if (!is_orphaned_sandbox(pid)) continue;
    // Checked again through the pidfd, so a recycled pid is never signalled.
    unique_fd pidfd = open_pidfd(pid);
    if (!pidfd || !is_orphaned_sandbox(pid) || record_token_of(pid) != token) continue;
    if (::syscall(SYS_pidfd_send_signal, pidfd.get(), SIGKILL, nullptr, 0) == 0) {
      killed.push_back(std::move(pidfd));
      running.erase(token);
    }
  }
  for (const auto& pidfd : killed) wait_pidfd(pidfd.get(), std::chrono::seconds(5));
  // A live host may be about to start the sandbox it recorded.
  for (const auto& r : records)
    if (!running.count(r.token) && !host_alive(r.subject)) forget_record(r);
  return killed.size();
}

std::optional<fs::path> find_bwrap(const fs::path& configured) {
  if (configured.string().find('/') != std::string::npos) {
    fs::path p = fs::absolute(configured);
    return is_executable_file(p) ? std::optional(p) : std::nullopt;
  }
  const char* env_path = std::getenv("PATH");
  std::string_view dirs = env_path && *env_path ? env_path : "/usr/local/bin:/usr/bin:/bin";
  while (!dirs.empty()) {
    auto colon = dirs.find(':');
    std::string_view dir = dirs.substr(0, colon);
    dirs = colon == std::string_view::npos ? std::string_view() : dirs.substr(colon + 1);
    if (dir.empty() || dir.front() != '/') continue;  // a relative PATH entry could be planted
    fs::path candidate = fs::path(dir) / configured;
    if (is_executable_file(candidate)) return candidate;
  }
  return std::nullopt;
}

std::optional<std::string> bwrap_version(const fs::path& bwrap) {
  captured_run run = run_captured({bwrap.string(), "--version"}, std::nullopt, std::chrono::seconds(5));
  if (!run.status || !run.status->exited || run.status->code != 0) return std::nullopt;
  // "bubblewrap 0.8.0\n"
  auto space = run.output.rfind(' ');
  std::string version = run.output.substr(space == std::string::npos ? 0 : space + 1);
  while (!version.empty() && std::isspace(static_cast<unsigned char>(version.back()))) version.pop_back();
  return version;
}

bwrap_features bwrap_features_of(const std::string& version) {
  unsigned major = 0, minor = 0;
  auto end = version.data() + version.size();
  auto [dot, ec] = std::from_chars(version.data(), end, major);
  if (ec != std::errc() || dot == end || *dot != '.') return {};
  std::from_chars(dot + 1, end, minor);
  return {major > 0 || minor >= 8, major > 0 || minor >= 7};
}

bwrap_features detect_bwrap_features(const fs::path& bwrap) {
  auto version = bwrap_version(bwrap);
  bwrap_features features = version ? bwrap_features_of(*version) : bwrap_features{};
  struct stat st {};
  if (::stat(bwrap.c_str(), &st) == 0 && (st.st_mode & S_ISUID)) features.tmpfs_size = false;
  return features;
}

std::vector<std::string> bwrap_isolation_args(const bwrap_features& features, std::uint64_t tmp_bytes) {
  std::vector<std::string> args = {"--unshare-all", "--unshare-user"};
  if (features.disable_userns) args.push_back("--disable-userns");
  args.insert(args.end(), {"--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv",
                           "--ro-bind", "/usr", "/usr"});
  // Merged-usr systems (Debian 12) have /bin -> usr/bin: recreate the link.
  for (const char* dir : {"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}) {
    std::error_code ec;
    if (fs::is_symlink(dir, ec))
      args.insert(args.end(), {"--symlink", fs::read_symlink(dir, ec).string(), dir});
    else
      args.insert(args.end(), {"--ro-bind-try", dir, dir});
  }
  args.insert(args.end(), {"--ro-bind-try", "/etc/alternatives", "/etc/alternatives", "--ro-bind-try",
                           "/etc/ld.so.cache", "/etc/ld.so.cache", "--proc", "/proc", "--dev", "/dev"});
  for (const char* tmpfs : {"/dev/shm", "/tmp"}) {
    if (features.tmpfs_size) args.insert(args.end(), {"--size", std::to_string(tmp_bytes)});
    args.insert(args.end(), {"--tmpfs", tmpfs});
  }
  // --dev makes /dev a tmpfs the sandbox could fill: only /dev/shm stays writable.
  args.insert(args.end(), {"--remount-ro", "/dev", "--hostname", "cairn"});
  return args;
}

std::vector<userns_blocker> userns_blockers() {
  std::vector<userns_blocker> blockers;
  if (auto max = read_sysctl("/proc/sys/user/max_user_namespaces"); max && *max <= 0)
    blockers.push_back(
        {fmt::format("user.max_user_namespaces = {}", *max), "sysctl -w user.max_user_namespaces=15000"});
  if (auto clone = read_sysctl("/proc/sys/kernel/unprivileged_userns_clone"); clone && *clone != 1)
    blockers.push_back({fmt::format("kernel.unprivileged_userns_clone = {}", *clone),
                        "sysctl -w kernel.unprivileged_userns_clone=1"});
  if (auto aa = read_sysctl("/proc/sys/kernel/apparmor_restrict_unprivileged_userns"); aa && *aa != 0)
    blockers.push_back({fmt::format("kernel.apparmor_restrict_unprivileged_userns = {}", *aa),
                        "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0"});
  return blockers;
}

// Started by spawn_child, not Boost.Process: the command gets what a
// sandbox's first process gets (its own session, the rlimits of `limits`,
// the drop to `run_as` by raw system calls, PDEATHSIG, default signal
// dispositions, none of the host's other descriptors), which spawn.cpp does
// in one place without copying the host's memory. Boost.Process v2 could
// apply each as a launcher initializer, but only by repeating spawn.cpp's
// child steps over a fork of the whole host.
captured_run run_captured(const std::vector<std::string>& argv, std::optional<spawn_identity> run_as,
                          std::chrono::milliseconds timeout, const resource_limits& limits) {
  unique_fd output(::memfd_create("cairn-captured-output", MFD_CLOEXEC));
  if (!output)
    throw sandbox_error(sandbox_errc::spawn_failed, fmt::format("memfd_create: {}", std::strerror(errno)));
  spawn_request request;
  request.argv = argv;
  request.env = {"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"};
  request.cwd = "/";
  request.log_fd = output.get();
  request.run_as = run_as;
  request.limits = limits;
  spawned_child child = spawn_child(request);

  captured_run run;
  bool exited = wait_pidfd(child.pidfd.get(), timeout);
  if (!exited) {
    ::kill(-child.pid, SIGKILL);
    ::kill(child.pid, SIGKILL);
  }
  int status = 0;
  while (::waitpid(child.pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (exited) {
    exit_status s;
    s.exited = WIFEXITED(status);
    s.code = s.exited ? WEXITSTATUS(status) : 0;
    s.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    run.status = s;
  }
  struct stat st {};
  if (::fstat(output.get(), &st) == 0 && st.st_size > 0) {
    run.output.resize(static_cast<std::size_t>(std::min<off_t>(st.st_size, 64 * 1024)));
    ssize_t n = ::pread(output.get(), run.output.data(), run.output.size(), 0);
    run.output.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
  }
  return run;
}

std::optional<sandbox_user> resolve_sandbox_user(const bwrap_options& options) {
  if (::geteuid() != 0) return std::nullopt;
  if (options.sandbox_uid != 0)
    return sandbox_user{options.sandbox_uid, options.sandbox_uid, "bwrap_options"};
  if (const char* env = std::getenv("CAIRN_SANDBOX_UID"); env && *env) {
    std::string_view text = env;
    std::uint32_t uid = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), uid);
    if (ec != std::errc() || end != text.data() + text.size() || uid == 0 || uid == ~std::uint32_t{0})
      throw sandbox_error(sandbox_errc::bad_spec,
                          fmt::format("CAIRN_SANDBOX_UID='{}' is not a valid nonzero uid", text));
    return sandbox_user{uid, uid, "CAIRN_SANDBOX_UID"};
  }
  passwd entry{}, *found = nullptr;
  char buffer[4096];
  if (::getpwnam_r("cairn-sandbox", &entry, buffer, sizeof buffer, &found) == 0 && found) {
    if (found->pw_uid == 0 || found->pw_gid == 0)
      throw sandbox_error(sandbox_errc::bad_spec, "user cairn-sandbox has uid or gid 0; give it its own ids");
    return sandbox_user{found->pw_uid, found->pw_gid, "user cairn-sandbox"};
  }
  return sandbox_user{default_sandbox_uid, default_sandbox_uid, "default"};
}

}  // namespace cairn::runtime
