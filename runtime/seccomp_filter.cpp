#include "runtime/seccomp_filter.hpp"

#include <sched.h>
#include <seccomp.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include <fmt/format.h>

#include "runtime/sandbox.hpp"

namespace cairn::runtime {
namespace {

constexpr const char* denied_syscalls[] = {
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "mount", "umount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsconfig",
    "fsmount", "fspick", "mount_setattr", "unshare", "setns",
    "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "reboot", "swapon", "swapoff", "acct", "syslog", "quotactl", "open_by_handle_at", "name_to_handle_at",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "iopl", "ioperm", "lookup_dcookie",
    "socket", "socketpair", "nfsservctl", "uselib", "vhangup", "quotactl_fd", "fanotify_init",
    "process_madvise",
};

struct named_value {
  const char* name;
  unsigned long value;
};

constexpr named_value namespace_flags[] = {
    {"CLONE_NEWNS", CLONE_NEWNS},   {"CLONE_NEWUSER", CLONE_NEWUSER}, {"CLONE_NEWPID", CLONE_NEWPID},
    {"CLONE_NEWNET", CLONE_NEWNET}, {"CLONE_NEWIPC", CLONE_NEWIPC},   {"CLONE_NEWUTS", CLONE_NEWUTS},
    {"CLONE_NEWCGROUP", CLONE_NEWCGROUP},
};

constexpr named_value tty_requests[] = {{"TIOCSTI", TIOCSTI}, {"TIOCLINUX", TIOCLINUX}};

// A syscall another architecture has resolves to a negative pseudo number.
bool on_this_architecture(const char* name) { return seccomp_syscall_resolve_name(name) >= 0; }

[[noreturn]] void failed(const std::string& what, int rc) {
  throw sandbox_error(sandbox_errc::spawn_failed,
                      fmt::format("building the seccomp filter: {}: {}", what, std::strerror(-rc)));
}

void add(scmp_filter_ctx ctx, std::uint32_t action, int nr, unsigned count, const scmp_arg_cmp* args,
         const char* name) {
  int rc = seccomp_rule_add_array(ctx, action, nr, count, args);
  if (rc < 0) failed(name, rc);
}

std::string build() {
  std::unique_ptr<void, void (*)(scmp_filter_ctx)> ctx(seccomp_init(SCMP_ACT_ALLOW), seccomp_release);
  if (!ctx) failed("seccomp_init", -ENOMEM);
  const std::uint32_t deny = SCMP_ACT_ERRNO(EPERM);
  for (const char* name : denied_syscalls)
    if (on_this_architecture(name)) add(ctx.get(), deny, seccomp_syscall_resolve_name(name), 0, nullptr, name);
  if (on_this_architecture("clone3"))
    add(ctx.get(), SCMP_ACT_ERRNO(ENOSYS), seccomp_syscall_resolve_name("clone3"), 0, nullptr, "clone3");

  // Deny clone with any namespace flag: one rule per flag, as a masked
  // comparison tests equality.
  for (auto [name, flag] : namespace_flags) {
    scmp_arg_cmp new_namespace = SCMP_A0(SCMP_CMP_MASKED_EQ, flag, flag);
    add(ctx.get(), deny, SCMP_SYS(clone), 1, &new_namespace, "clone");
  }
  for (auto [name, request] : tty_requests) {
    scmp_arg_cmp is_request = SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffUL, request);
    add(ctx.get(), deny, SCMP_SYS(ioctl), 1, &is_request, "ioctl");
  }

  int fd = memfd_create("cairn-seccomp", MFD_CLOEXEC);
  if (fd < 0) failed("memfd_create", -errno);
  int rc = seccomp_export_bpf(ctx.get(), fd);
  std::string program;
  if (rc == 0) {
    off_t size = lseek(fd, 0, SEEK_END);
    program.resize(static_cast<std::size_t>(size));
    if (pread(fd, program.data(), program.size(), 0) != size) rc = -EIO;
  }
  close(fd);
  if (rc < 0) failed("seccomp_export_bpf", rc);
  return program;
}

}  // namespace

const std::string& seccomp_program() {
  static const std::string program = build();
  return program;
}

std::vector<seccomp_denial> seccomp_denials() {
  std::vector<seccomp_denial> denials;
  for (const char* name : denied_syscalls)
    if (on_this_architecture(name)) denials.push_back({name, EPERM});
  if (on_this_architecture("clone3")) denials.push_back({"clone3", ENOSYS});
  for (auto [name, flag] : namespace_flags) denials.push_back({std::string("clone:") + name, EPERM});
  for (auto [name, request] : tty_requests) denials.push_back({std::string("ioctl:") + name, EPERM});
  return denials;
}

}  // namespace cairn::runtime
