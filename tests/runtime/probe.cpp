// sandbox_probe: runs inside a sandbox under test and reports what it could
// do as one frame on fd 3: {"t":"probe","action":...,"ok":bool,"detail":...}.
// Usage: sandbox_probe ACTION [ARGS...]; see the dispatch in main(). Or
// sandbox_probe ahead: the action and its arguments come in the first frame.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <signal.h>
#include <sched.h>
#include <linux/io_uring.h>
#include <linux/keyctl.h>
#include <linux/perf_event.h>
#include <linux/reboot.h>
#include <sys/mman.h>
#include <sys/quota.h>
#include <sys/timex.h>
#include <sys/uio.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/socket.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "protocol/frame.hpp"

extern char** environ;

namespace {

using json = nlohmann::json;
constexpr int channel_fd = 3;

void send_frame(const json& message) {
  std::string frame = cairn::protocol::encode_frame(message);
  for (std::size_t off = 0; off < frame.size();) {
    ssize_t n = ::write(channel_fd, frame.data() + off, frame.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) std::_Exit(90);
    off += static_cast<std::size_t>(n);
  }
}

void report(const std::string& action, bool ok, const json& detail) {
  send_frame({{"t", "probe"}, {"action", action}, {"ok", ok}, {"detail", detail}});
}

std::string error_text() { return std::strerror(errno); }

std::string slurp(const std::string& path, bool* ok = nullptr) {
  std::ifstream in(path, std::ios::binary);
  if (ok) *ok = static_cast<bool>(in);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> list_dir(const char* path, bool numeric_only, int skip_fd = -1) {
  std::vector<std::string> names;
  DIR* d = ::opendir(path);
  if (!d) return names;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    if (numeric_only && !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    if (skip_fd >= 0 && name == std::to_string(::dirfd(d))) continue;
    names.push_back(name);
  }
  ::closedir(d);
  return names;
}

// Where `needle` appears in this process's environment or in any /proc/*/environ
// or /proc/*/cmdline it can read.
json find_needle(const std::string& needle) {
  json places = json::array();
  for (char** e = environ; *e; ++e)
    if (std::strstr(*e, needle.c_str())) places.push_back("environ");
  for (const auto& pid : list_dir("/proc", true))
    for (const char* file : {"environ", "cmdline"}) {
      std::string path = "/proc/" + pid + "/" + file;
      if (slurp(path).find(needle) != std::string::npos) places.push_back(path);
    }
  if (slurp("/proc/self/environ").find(needle) != std::string::npos) places.push_back("/proc/self/environ");
  return places;
}

// "CapEff:\t0000000000000000" -> "0000000000000000"
std::string status_field(const std::string& status, const std::string& key) {
  std::istringstream lines(status);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind(key + ":", 0) == 0) return line.substr(line.find_first_not_of(" \t", key.size() + 1));
  return "";
}

json status() {
  std::string proc_status = slurp("/proc/self/status");
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  char cwd[4096] = {};
  if (!::getcwd(cwd, sizeof cwd)) cwd[0] = '\0';
  json env = json::array();
  for (char** e = environ; *e; ++e) env.push_back(*e);
  return {{"uid", ::getuid()},
          {"euid", ::geteuid()},
          {"gid", ::getgid()},
          {"cap_eff", status_field(proc_status, "CapEff")},
          {"cap_prm", status_field(proc_status, "CapPrm")},
          {"cap_bnd", status_field(proc_status, "CapBnd")},
          {"cap_amb", status_field(proc_status, "CapAmb")},
          {"no_new_privs", status_field(proc_status, "NoNewPrivs")},
          {"seccomp", status_field(proc_status, "Seccomp")},
          {"hostname", host},  {"cwd", cwd},
          {"env", env},        {"fds", list_dir("/proc/self/fd", false, 0)}};
}

// Interface names from /proc/net/dev: no socket needed (seccomp denies them).
json interfaces() {
  json out = json::array();
  std::ifstream in("/proc/net/dev");
  std::string line;
  for (int skip = 0; skip < 2 && std::getline(in, line); ++skip) {
  }
  while (std::getline(in, line)) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    auto name = line.substr(0, colon);
    name.erase(0, name.find_first_not_of(' '));
    out.push_back({{"name", name}});
  }
  return out;
}

// Each call the seccomp filter denies (named as seccomp_denials() names
// them), made with arguments that are valid for the probe itself, so that
// without the filter it would succeed or fail otherwise than with EPERM
// wherever no missing capability stands in the way; and a few variants
// (every socket family, other namespaces). Each entry: did the call
// succeed, and its errno.
json forbidden_syscalls() {
  auto attempt = [](long rc) {
    return json{{"ok", rc >= 0}, {"errno", rc >= 0 ? 0 : errno}};
  };
  // A clone that must not work; its child, should it exist, leaves at once.
  auto try_clone = [&](unsigned long flags) {
    long child = ::syscall(SYS_clone, flags | SIGCHLD, 0, 0, 0, 0);
    if (child == 0) ::_exit(0);
    json result = attempt(child);
    if (child > 0) ::waitpid(static_cast<pid_t>(child), nullptr, 0);
    return result;
  };
  const pid_t self = ::getpid();
  const int self_pidfd = static_cast<int>(::syscall(SYS_pidfd_open, self, 0));
  const int devnull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  const int workspace = ::open("/workspace", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  char local[16] = "cairn", copy[16] = {};
  iovec local_iov{local, sizeof local}, copy_iov{copy, sizeof copy};
  json out;

  pid_t tracee = ::fork();
  if (tracee == 0)
    for (;;) ::pause();
  out["ptrace"] = attempt(::syscall(SYS_ptrace, PTRACE_SEIZE, tracee, 0, 0));
  ::kill(tracee, SIGKILL);
  ::waitpid(tracee, nullptr, 0);
  out["process_vm_readv"] = attempt(::syscall(SYS_process_vm_readv, self, &copy_iov, 1, &local_iov, 1, 0));
  out["process_vm_writev"] = attempt(::syscall(SYS_process_vm_writev, self, &local_iov, 1, &copy_iov, 1, 0));
  out["kcmp"] = attempt(::syscall(SYS_kcmp, self, self, 0 /* KCMP_FILE */, devnull, devnull));
  out["pidfd_getfd"] = attempt(::syscall(SYS_pidfd_getfd, self_pidfd, devnull, 0));
  out["process_madvise"] = attempt(::syscall(SYS_process_madvise, self_pidfd, &local_iov, 1, 20 /* MADV_COLD */, 0));

  out["mount"] = attempt(::syscall(SYS_mount, "none", "/tmp", "tmpfs", 0, nullptr));
  out["mount_bind_remount"] = attempt(::syscall(SYS_mount, "/", "/", nullptr, MS_REMOUNT | MS_BIND, nullptr));
  out["umount2"] = attempt(::syscall(SYS_umount2, "/workspace", MNT_DETACH));
  out["pivot_root"] = attempt(::syscall(SYS_pivot_root, "/tmp", "/tmp"));
  out["chroot"] = attempt(::syscall(SYS_chroot, "/tmp"));
  long tree = ::syscall(SYS_open_tree, AT_FDCWD, "/workspace", O_CLOEXEC);
  out["open_tree"] = attempt(tree);
  out["move_mount"] = attempt(::syscall(SYS_move_mount, tree, "", AT_FDCWD, "/tmp", 4 /* MOVE_MOUNT_F_EMPTY_PATH */));
  long context = ::syscall(SYS_fsopen, "tmpfs", 0);
  out["fsopen"] = attempt(context);
  out["fsconfig"] = attempt(::syscall(SYS_fsconfig, context, 6 /* FSCONFIG_CMD_CREATE */, nullptr, nullptr, 0));
  out["fsmount"] = attempt(::syscall(SYS_fsmount, context, 0, 0));
  out["fspick"] = attempt(::syscall(SYS_fspick, AT_FDCWD, "/tmp", 0));
  struct {
    std::uint64_t set = 1, clr = 0, propagation = 0, userns_fd = 0;  // MOUNT_ATTR_RDONLY
  } attr;
  out["mount_setattr"] = attempt(::syscall(SYS_mount_setattr, AT_FDCWD, "/tmp", 0, &attr, sizeof attr));

  out["unshare"] = attempt(::syscall(SYS_unshare, CLONE_NEWUSER));
  out["unshare_mount"] = attempt(::syscall(SYS_unshare, CLONE_NEWNS));
  out["unshare_net"] = attempt(::syscall(SYS_unshare, CLONE_NEWNET));
  int own_net = ::open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  out["setns"] = attempt(::syscall(SYS_setns, own_net, CLONE_NEWNET));
  for (auto [name, flag] : {std::pair{"CLONE_NEWNS", CLONE_NEWNS}, std::pair{"CLONE_NEWUSER", CLONE_NEWUSER},
                            std::pair{"CLONE_NEWPID", CLONE_NEWPID}, std::pair{"CLONE_NEWNET", CLONE_NEWNET},
                            std::pair{"CLONE_NEWIPC", CLONE_NEWIPC}, std::pair{"CLONE_NEWUTS", CLONE_NEWUTS},
                            std::pair{"CLONE_NEWCGROUP", CLONE_NEWCGROUP}})
    out[std::string("clone:") + name] = try_clone(static_cast<unsigned long>(flag));
  struct {
    std::uint64_t flags = 0, pidfd = 0, child_tid = 0, parent_tid = 0, exit_signal = SIGCHLD, stack = 0,
                  stack_size = 0, tls = 0;
  } clone_args;
  long cloned3 = ::syscall(SYS_clone3, &clone_args, sizeof clone_args);
  if (cloned3 == 0) ::_exit(0);
  out["clone3"] = attempt(cloned3);
  if (cloned3 > 0) ::waitpid(static_cast<pid_t>(cloned3), nullptr, 0);

  out["keyctl"] = attempt(::syscall(SYS_keyctl, KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0));
  out["keyctl_join"] = attempt(::syscall(SYS_keyctl, KEYCTL_JOIN_SESSION_KEYRING, nullptr));
  out["add_key"] = attempt(::syscall(SYS_add_key, "user", "cairn", "x", 1, KEY_SPEC_PROCESS_KEYRING));
  out["request_key"] = attempt(::syscall(SYS_request_key, "user", "cairn", nullptr, KEY_SPEC_PROCESS_KEYRING));

  struct {
    std::uint32_t map_type = 2 /* BPF_MAP_TYPE_ARRAY */, key_size = 4, value_size = 8, max_entries = 1;
    char rest[112] = {};
  } map_create;
  out["bpf"] = attempt(::syscall(SYS_bpf, 0 /* BPF_MAP_CREATE */, &map_create, sizeof map_create));
  perf_event_attr counter{};
  counter.type = PERF_TYPE_SOFTWARE;
  counter.size = sizeof counter;
  counter.config = PERF_COUNT_SW_TASK_CLOCK;
  counter.disabled = 1;
  counter.exclude_kernel = 1;
  counter.exclude_hv = 1;
  out["perf_event_open"] = attempt(::syscall(SYS_perf_event_open, &counter, 0, -1, -1, 0));
  out["userfaultfd"] = attempt(::syscall(SYS_userfaultfd, O_CLOEXEC | 1 /* UFFD_USER_MODE_ONLY */));
  io_uring_params ring{};
  out["io_uring_setup"] = attempt(::syscall(SYS_io_uring_setup, 1, &ring));
  // On a file that is no ring these answer EOPNOTSUPP, unless refused first.
  out["io_uring_enter"] = attempt(::syscall(SYS_io_uring_enter, devnull, 0, 0, 0, nullptr, 0));
  out["io_uring_register"] = attempt(::syscall(SYS_io_uring_register, devnull, 8 /* IORING_REGISTER_PROBE */,
                                               nullptr, 0));

  // Gated by capabilities as well: made with the mildest valid arguments.
  out["kexec_load"] = attempt(::syscall(SYS_kexec_load, 0, 0, nullptr, 0));
  out["kexec_file_load"] = attempt(::syscall(SYS_kexec_file_load, devnull, devnull, 1, "", 0));
  out["init_module"] = attempt(::syscall(SYS_init_module, local, sizeof local, ""));
  out["finit_module"] = attempt(::syscall(SYS_finit_module, devnull, "", 0));
  out["delete_module"] = attempt(::syscall(SYS_delete_module, "cairn_no_such_module", O_NONBLOCK));
  out["reboot"] = attempt(::syscall(SYS_reboot, LINUX_REBOOT_MAGIC1, LINUX_REBOOT_MAGIC2,
                                    LINUX_REBOOT_CMD_CAD_ON, nullptr));
  out["swapon"] = attempt(::syscall(SYS_swapon, "/workspace/swap", 0));
  out["swapoff"] = attempt(::syscall(SYS_swapoff, "/workspace/swap"));
  out["acct"] = attempt(::syscall(SYS_acct, nullptr));
  out["syslog"] = attempt(::syscall(SYS_syslog, 10 /* SYSLOG_ACTION_SIZE_BUFFER */, nullptr, 0));
  out["quotactl"] = attempt(::syscall(SYS_quotactl, QCMD(Q_SYNC, USRQUOTA), nullptr, 0, nullptr));
  if_dqinfo quota_info{};
  out["quotactl_fd"] = attempt(::syscall(SYS_quotactl_fd, workspace, QCMD(Q_GETINFO, USRQUOTA), 0, &quota_info));
  struct {
    file_handle header;
    unsigned char bytes[MAX_HANDLE_SZ];
  } handle{};
  handle.header.handle_bytes = MAX_HANDLE_SZ;
  int mount_id = 0;
  out["name_to_handle_at"] = attempt(::syscall(SYS_name_to_handle_at, AT_FDCWD, "/workspace", &handle.header,
                                               &mount_id, 0));
  out["open_by_handle_at"] = attempt(::syscall(SYS_open_by_handle_at, workspace, &handle.header, O_RDONLY));
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  out["settimeofday"] = attempt(::syscall(SYS_settimeofday, nullptr, nullptr));
  out["clock_settime"] = attempt(::syscall(SYS_clock_settime, CLOCK_REALTIME, &now));
  timex read_only{};  // modes 0: reads the clock's state, changes nothing
  out["clock_adjtime"] = attempt(::syscall(SYS_clock_adjtime, CLOCK_REALTIME, &read_only));
  out["adjtimex"] = attempt(::syscall(SYS_adjtimex, &read_only));
  out["iopl"] = attempt(::syscall(SYS_iopl, 0));
  out["ioperm"] = attempt(::syscall(SYS_ioperm, 0x80, 1, 0));
  char path[256];
  out["lookup_dcookie"] = attempt(::syscall(SYS_lookup_dcookie, 0, path, sizeof path));
  out["nfsservctl"] = attempt(::syscall(SYS_nfsservctl, 0, nullptr, nullptr));
  out["uselib"] = attempt(::syscall(SYS_uselib, "/usr/lib/x86_64-linux-gnu/libc.so.6"));
  out["vhangup"] = attempt(::syscall(SYS_vhangup));
  out["fanotify_init"] = attempt(::syscall(SYS_fanotify_init, 0 /* FAN_CLASS_NOTIF */, O_RDONLY));

  out["socket"] = attempt(::socket(AF_UNIX, SOCK_STREAM, 0));
  out["socket_inet"] = attempt(::socket(AF_INET, SOCK_STREAM, 0));
  out["socket_netlink"] = attempt(::socket(AF_NETLINK, SOCK_RAW, 0));
  out["socket_packet"] = attempt(::socket(AF_PACKET, SOCK_RAW, 0));
  out["socket_raw"] = attempt(::socket(AF_INET, SOCK_RAW, IPPROTO_ICMP));
  out["socket_inet6"] = attempt(::socket(AF_INET6, SOCK_DGRAM, 0));
  out["socket_vsock"] = attempt(::socket(40 /* AF_VSOCK */, SOCK_STREAM, 0));
  int pair[2];
  out["socketpair"] = attempt(::socketpair(AF_UNIX, SOCK_STREAM, 0, pair));

  char c = 'x';
  out["ioctl:TIOCSTI"] = attempt(::ioctl(channel_fd, TIOCSTI, &c));
  char linux_request = 12;  // TIOCL_GETKMSGREDIRECT
  out["ioctl:TIOCLINUX"] = attempt(::ioctl(channel_fd, TIOCLINUX, &linux_request));
  return out;
}

// Every directory where a file can be created and every regular file that
// opens for writing, under `dir`; /proc and /sys are not walked.
void find_writable(const std::string& dir, json& found, int depth) {
  if (depth > 24 || dir == "/proc" || dir == "/sys") return;
  std::string probe_file = (dir == "/" ? "" : dir) + "/.cairn-writable-probe";
  int fd = ::open(probe_file.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd >= 0) {
    ::close(fd);
    ::unlink(probe_file.c_str());
    found.push_back(dir);
  }
  for (const auto& name : list_dir(dir.c_str(), false)) {
    std::string path = (dir == "/" ? "" : dir) + "/" + name;
    struct stat st {};
    if (::lstat(path.c_str(), &st) < 0) continue;
    if (S_ISDIR(st.st_mode)) {
      find_writable(path, found, depth + 1);
    } else if (S_ISREG(st.st_mode)) {
      int w = ::open(path.c_str(), O_WRONLY | O_NOFOLLOW | O_NONBLOCK);
      if (w >= 0) {
        ::close(w);
        found.push_back(path);
      }
    }
  }
}

// Writes 64 KiB blocks to `path` until a write fails.
json fill(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return {{"written", 0}, {"error", error_text()}};
  std::string block(64 << 10, 'x');
  std::uint64_t written = 0;
  for (;;) {
    ssize_t n = ::write(fd, block.data(), block.size());
    if (n <= 0) break;
    written += static_cast<std::uint64_t>(n);
  }
  json result = {{"written", written}, {"error", error_text()}};
  ::close(fd);
  return result;
}

// Forks until refused, then keeps trying: the host must end it.
[[noreturn]] void fork_bomb() {
  report("forkbomb", true, nullptr);
  for (;;) {
    pid_t child = ::fork();
    if (child == 0)
      for (;;) ::pause();
  }
}

// `count` processes, each allocating and touching `bytes`, then waiting.
[[noreturn]] void memory_bomb(int count, std::size_t bytes) {
  report("memhog", true, nullptr);
  for (int i = 0; i < count; ++i) {
    if (::fork() != 0) continue;
    char* p = static_cast<char*>(std::malloc(bytes));
    for (std::size_t off = 0; p && off < bytes; off += 4096) p[off] = 1;
    asm volatile("" ::"r"(p) : "memory");  // the memory is used: the compiler may not drop it
    for (;;) ::pause();
  }
  for (;;) ::pause();
}

// Runs `program status` in a child, which reports on the channel itself;
// reports only when that fails, with the exec's error if it was that.
int exec_and_report(const std::string& program) {
  int failed[2];
  if (::pipe2(failed, O_CLOEXEC) != 0) std::_Exit(91);
  pid_t child = ::fork();
  if (child == 0) {
    ::execl(program.c_str(), program.c_str(), "status", nullptr);
    const int error = errno;
    [[maybe_unused]] auto written = ::write(failed[1], &error, sizeof error);
    ::_exit(127);
  }
  ::close(failed[1]);
  int error = 0;
  const bool exec_failed = ::read(failed[0], &error, sizeof error) == sizeof error;
  ::close(failed[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    report("exec", false, {{"status", status}, {"exec_error", exec_failed ? std::strerror(error) : ""}});
  return 0;
}

[[noreturn]] void grandchild(const std::string& token) {
  // Closed on the child's exec: the report waits until its command line is the new one.
  int execed[2];
  if (::pipe2(execed, O_CLOEXEC) != 0) std::_Exit(91);
  pid_t child = ::fork();
  if (child == 0) {
    ::signal(SIGTERM, SIG_IGN);  // kept across the exec
    // With the token in its own command line, however the probe was started.
    ::execl("/proc/self/exe", "sandbox_probe", "pause", token.c_str(), nullptr);
    for (;;) ::pause();
  }
  ::close(execed[1]);
  char byte;
  while (child > 0 && ::read(execed[0], &byte, 1) < 0 && errno == EINTR) {
  }
  report("grandchild", child > 0, {{"pid", child}, {"token", token}});
  for (;;) ::pause();
}

[[noreturn]] void echo() {
  cairn::protocol::frame_decoder decoder;
  char buffer[65536];
  for (;;) {
    ssize_t n = ::read(channel_fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) std::exit(0);
    decoder.feed(std::string_view(buffer, static_cast<std::size_t>(n)));
    while (auto message = decoder.next()) {
      (*message)["echoed"] = true;
      send_frame(*message);
    }
  }
}

}  // namespace

// As an agent does before its run begins: says so on stderr, then waits for
// the host's first frame, which names the run (start's run_id).
json first_frame() {
  std::fprintf(stderr, "probe: waiting for the host's first frame\n");
  std::fflush(stderr);
  cairn::protocol::frame_decoder decoder;
  char buffer[65536];
  for (;;) {
    if (auto message = decoder.next()) return *message;
    ssize_t n = ::read(channel_fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) std::exit(4);
    decoder.feed(std::string_view(buffer, static_cast<std::size_t>(n)));
  }
}

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() == 1 && args[0] == "ahead") {
    // Started ahead by a warm pool (the runtime tests' CAIRN_TEST_SANDBOXES=
    // started), as an SDK is: says hello, waits for its run's first frame,
    // which names the run and carries what to do, then does it as if started
    // with those arguments, with the run id in its environment as a cold
    // start would have put it.
    send_frame({{"t", "hello"}});
    json frame = first_frame();
    ::setenv("CAIRN_RUN_ID", frame.value("run_id", std::string()).c_str(), 1);
    args = frame.value("args", std::vector<std::string>{});
  }
  std::string action = args.empty() ? "status" : args[0];
  auto arg = [&](std::size_t i) { return i < args.size() ? args[i] : std::string(); };

  if (action == "status") {
    report(action, true, status());
  } else if (action == "lock_and_await") {
    // Leaves a file in a folder it makes unwritable, then waits as
    // await_run does (an agent started ahead that litters its workspace).
    bool ok = ::mkdir("locked", 0755) == 0;
    int fd = ::open("locked/file", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ok = ok && fd >= 0;
    if (fd >= 0) ::close(fd);
    ok = ok && ::chmod("locked", 0500) == 0 && ::chmod(".", 0500) == 0;
    send_frame({{"t", "hello"}});
    first_frame();
    report(action, ok, nullptr);
  } else if (action == "await_run" || action == "spin_then_await") {
    // As an SDK does: says hello, waits for the host's answer, writes its
    // run_id to "run.txt" in the working folder, and reports its status.
    // spin_then_await MARKER first forks a process that spins until killed
    // (MARKER in its command line finds it): an agent that burns the CPU of
    // a pooled sandbox while it waits for its run.
    if (action == "spin_then_await" && ::fork() == 0) {
      ::close(channel_fd);
      for (volatile unsigned long n = 0;; n = n + 1) {
      }
    }
    send_frame({{"t", "hello"}});
    json frame = first_frame();
    std::string run = frame.value("run_id", std::string());
    int fd = ::open("run.txt", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    bool ok = fd >= 0 && ::write(fd, run.data(), run.size()) == static_cast<ssize_t>(run.size());
    if (fd >= 0) ::close(fd);
    report(action, ok, status());
  } else if (action == "env") {
    // The needle arrives reversed so that this process's own cmdline does not hold it.
    std::string reversed = arg(1);
    std::string needle(reversed.rbegin(), reversed.rend());
    json places = find_needle(needle);
    report(action, places.empty(),
           {{"found_in", places},
            {"channel_fd", std::getenv("CAIRN_CHANNEL_FD") ? std::getenv("CAIRN_CHANNEL_FD") : ""}});
  } else if (action == "read") {
    bool ok = false;
    std::string content = slurp(arg(1), &ok);
    report(action, ok, ok ? content : error_text());
  } else if (action == "write") {
    int fd = ::open(arg(1).c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    bool ok = fd >= 0 && ::write(fd, arg(2).data(), arg(2).size()) == static_cast<ssize_t>(arg(2).size());
    std::string detail = ok ? "written" : error_text();
    if (fd >= 0) ::close(fd);
    report(action, ok, detail);
  } else if (action == "open_wronly") {
    // Never writes: opening is the whole test (core_pattern must stay intact).
    int fd = ::open(arg(1).c_str(), O_WRONLY);
    std::string detail = fd >= 0 ? "opened" : error_text();
    if (fd >= 0) ::close(fd);
    report(action, fd >= 0, detail);
  } else if (action == "pids") {
    report(action, true, list_dir("/proc", true));
  } else if (action == "connect") {
    int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(std::atoi(arg(1).c_str())));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bool ok = s >= 0 && ::connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    report(action, ok, ok ? "connected" : error_text());
  } else if (action == "connect_unix") {
    int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, arg(1).c_str(), sizeof addr.sun_path - 1);
    bool ok = s >= 0 && ::connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    report(action, ok, ok ? "connected" : error_text());
  } else if (action == "symlink") {
    bool ok = ::symlink(arg(1).c_str(), arg(2).c_str()) == 0;
    report(action, ok, ok ? "linked" : error_text());
  } else if (action == "link") {
    bool ok = ::link(arg(1).c_str(), arg(2).c_str()) == 0;
    report(action, ok, ok ? "linked" : error_text());
  } else if (action == "mknod") {
    json out;
    bool ok_any = false;
    for (auto [name, mode] : {std::pair{"char", S_IFCHR}, std::pair{"block", S_IFBLK}}) {
      std::string path = arg(1) + "-" + name;
      bool ok = ::mknod(path.c_str(), mode | 0666, makedev(1, 3)) == 0;
      ok_any = ok_any || ok;
      out[name] = ok ? "created" : error_text();
    }
    report(action, ok_any, out);
  } else if (action == "lock_out") {
    // A folder holding a file, both mode 0: its owner may not read either.
    const std::string folder = arg(1), file = folder + "/secret.txt";
    bool ok = ::mkdir(folder.c_str(), 0700) == 0;
    if (ok) std::ofstream(file) << "kept";
    ok = ok && ::chmod(file.c_str(), 0) == 0 && ::chmod(folder.c_str(), 0) == 0;
    report(action, ok, ok ? "locked" : error_text());
  } else if (action == "chmod_self") {
    // Through /proc/self/exe: the program's file, wherever it came from.
    bool ok = ::chmod("/proc/self/exe", 0777) == 0;
    report(action, ok, ok ? "changed" : error_text());
  } else if (action == "kill") {
    pid_t target = std::atoi(arg(1).c_str());
    // SIGCONT: harmless to the host should it arrive.
    bool ok = ::kill(target, SIGCONT) == 0;
    report(action, ok, ok ? "signalled" : error_text());
  } else if (action == "exec") {
    return exec_and_report(arg(1));
  } else if (action == "writable") {
    json found = json::array();
    find_writable("/", found, 0);
    report(action, true, found);
  } else if (action == "fill") {
    report(action, true, fill(arg(1)));
  } else if (action == "forkbomb") {
    fork_bomb();
  } else if (action == "memhog") {
    memory_bomb(std::atoi(arg(1).c_str()), std::strtoull(arg(2).c_str(), nullptr, 10));
  } else if (action == "spin") {
    report(action, true, nullptr);
    for (;;) asm volatile("" ::: "memory");  // a loop the compiler must keep
  } else if (action == "syscalls") {
    report(action, true, forbidden_syscalls());
  } else if (action == "interfaces") {
    report(action, true, interfaces());
  } else if (action == "grandchild") {
    grandchild(arg(1));
  } else if (action == "pause") {
    for (;;) ::pause();
  } else if (action == "alloc") {
    std::size_t bytes = std::strtoull(arg(1).c_str(), nullptr, 10);
    void* p = std::malloc(bytes);
    if (p) std::memset(p, 1, std::min<std::size_t>(bytes, 1 << 20));
    asm volatile("" ::"r"(p) : "memory");  // the allocation is used: the compiler may not drop it
    report(action, p != nullptr, p ? "allocated" : error_text());
    std::free(p);
  } else if (action == "reserve") {
    // Address space only, as a JavaScript engine reserves its heap's range at start.
    std::size_t bytes = std::strtoull(arg(1).c_str(), nullptr, 10);
    void* p = ::mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    report(action, p != MAP_FAILED, p != MAP_FAILED ? "reserved" : error_text());
    if (p != MAP_FAILED) ::munmap(p, bytes);
  } else if (action == "echo") {
    echo();
  } else if (action == "abort") {
    report(action, true, nullptr);
    std::abort();
  } else if (action == "exit") {
    report(action, true, nullptr);
    return std::atoi(arg(1).c_str());
  } else {
    report(action, false, "unknown action");
    return 2;
  }
  return 0;
}
