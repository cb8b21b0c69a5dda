// The ways out of a bwrap sandbox through privileges, kernel interfaces and
// the network, each tried by the probe from inside: every test asserts that
// the attempt failed.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <set>

#include "protocol/frame.hpp"
#include "runtime/seccomp_filter.hpp"
#include "tests/runtime/sandbox_fixture.hpp"

namespace cairn::runtime::test {
namespace {

// The probe's "syscalls" report, once per test case.
json forbidden_calls(bwrap_fixture& f) {
  json results = f.probe({"syscalls"})["detail"];
  REQUIRE(results.size() >= 60);
  return results;
}

// The probe's "syscalls" report from a bare bwrap sandbox (root only) in
// which it is root of its user namespace with every capability there, run
// under the product's seccomp filter or under none: what the filter alone
// refuses, and what the same calls do without it.
json calls_with_every_capability(bool filtered) {
  temp_dir dir;
  int channel[2];
  REQUIRE(::pipe2(channel, O_CLOEXEC) == 0);
  int program = ::memfd_create("cairn-test-seccomp", MFD_CLOEXEC);
  const std::string& bpf = seccomp_program();
  REQUIRE(::write(program, bpf.data(), bpf.size()) == static_cast<ssize_t>(bpf.size()));
  REQUIRE(::lseek(program, 0, SEEK_SET) == 0);
  std::vector<std::string> args = {"bwrap", "--unshare-all", "--uid", "0", "--gid", "0", "--cap-add", "ALL",
                                   "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib",
                                   "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/bin", "/bin",
                                   "--ro-bind", SANDBOX_PROBE, "/probe", "--dev", "/dev", "--proc", "/proc",
                                   "--tmpfs", "/tmp", "--dir", "/workspace", "--die-with-parent"};
  if (filtered) args.insert(args.end(), {"--seccomp", "4"});
  args.insert(args.end(), {"--", "/probe", "syscalls"});
  pid_t child = ::fork();
  if (child == 0) {
    ::dup2(channel[1], 3);
    ::dup2(program, 4);
    std::vector<char*> argv;
    for (auto& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    ::execv("/usr/bin/bwrap", argv.data());
    ::_exit(127);
  }
  ::close(channel[1]);
  ::close(program);
  protocol::frame_decoder decoder;
  std::optional<json> report;
  char buffer[65536];
  pollfd readable{channel[0], POLLIN, 0};
  while (!report && ::poll(&readable, 1, 60'000) > 0) {
    ssize_t n = ::read(channel[0], buffer, sizeof buffer);
    if (n <= 0) break;
    decoder.feed(std::string_view(buffer, static_cast<std::size_t>(n)));
    report = decoder.next();
  }
  ::close(channel[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  INFO("bwrap wait status " << status);
  REQUIRE(report);
  return (*report)["detail"];
}

// Each call failed; with EPERM where the seccomp filter is the only thing
// in the way (without it an unprivileged process could make them).
void check_denied(const json& results, std::initializer_list<const char*> names,
                  std::initializer_list<const char*> denied_by_filter = {}) {
  for (const char* name : names) {
    INFO(name << ": " << results[name].dump());
    REQUIRE(results.contains(name));
    CHECK(results[name]["ok"] == false);
  }
  for (const char* name : denied_by_filter) {
    INFO(name << ": " << results[name].dump());
    CHECK(results[name]["errno"] == EPERM);
  }
}

}  // namespace

TEST_CASE_METHOD(bwrap_fixture, "bwrap: no network, not even the host's loopback") {
  int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(listener >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(listener, 4) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) == 0);

  json report = probe({"connect", std::to_string(ntohs(addr.sin_port))});
  INFO(report.dump());
  CHECK(report["ok"] == false);
  pollfd p{listener, POLLIN, 0};
  CHECK(::poll(&p, 1, 0) == 0);  // no connection reached the host
  ::close(listener);

  // bwrap brings up the namespace's own loopback; it leads nowhere but the sandbox.
  json interfaces = probe({"interfaces"})["detail"];
  INFO(interfaces.dump());
  REQUIRE(interfaces.size() == 1);
  CHECK(interfaces[0]["name"] == "lo");
}

TEST_CASE_METHOD(bwrap_fixture, "bwrap: a host unix socket inside the workspace cannot be reached") {
  // Unix sockets are found by path, across network namespaces: only the
  // seccomp filter (no socket()) keeps the agent from this one.
  fs::path path = dir.path / "ws" / "host.sock";
  int listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(listener >= 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  REQUIRE(path.string().size() < sizeof addr.sun_path);
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(listener, 4) == 0);
  fs::permissions(path, fs::perms(0777));

  json report = probe({"connect_unix", "/workspace/host.sock"});
  INFO(report.dump());
  CHECK(report["ok"] == false);
  CHECK(report["detail"] == "Operation not permitted");
  pollfd p{listener, POLLIN, 0};
  CHECK(::poll(&p, 1, 0) == 0);
  ::close(listener);
}

TEST_CASE_METHOD(bwrap_fixture, "bwrap: the agent is not root and holds no capabilities") {
  json status = probe({"status"})["detail"];
  INFO(status.dump());
  CHECK(status["uid"] != 0);
  CHECK(status["euid"] != 0);
  for (const char* set : {"cap_eff", "cap_prm", "cap_bnd", "cap_amb"}) {
    INFO(set);
    CHECK(status[set] == "0000000000000000");
  }
  // Kernel-level root would pass these; the probe opens without writing.
  for (const char* path : {"/proc/sys/kernel/core_pattern", "/proc/sys/kernel/hostname",
                           "/proc/sys/vm/drop_caches", "/proc/sysrq-trigger"}) {
    json report = probe({"open_wronly", path});
    INFO(path << ": " << report.dump());
    CHECK(report["ok"] == false);
  }
}

TEST_CASE_METHOD(bwrap_fixture, "bwrap: no_new_privs is set and the seccomp filter is on") {
  json status = probe({"status"})["detail"];
  INFO(status.dump());
  CHECK(status["no_new_privs"] == "1");
  CHECK(status["seccomp"] == "2");  // SECCOMP_MODE_FILTER
}

TEST_CASE_METHOD(bwrap_fixture, "bwrap: a setuid-root program does not make the agent root") {
  if (!require_root("only root can plant a setuid-root file")) return;
  fs::path planted = dir.path / "ws" / "setuid-probe";
  fs::copy_file(SANDBOX_PROBE, planted);
  REQUIRE(::chown(planted.c_str(), 0, 0) == 0);
  fs::permissions(planted, fs::perms(04755));
  REQUIRE((fs::status(planted).permissions() & fs::perms::set_uid) != fs::perms::none);
  // The probe runs it; the child reports its own ids.
  json report = probe({"exec", "/workspace/setuid-probe"});
  INFO(report.dump());
  REQUIRE(report["action"] == "status");
  CHECK(report["detail"]["euid"] != 0);
  CHECK(report["detail"]["euid"] == report["detail"]["uid"]);
  CHECK(report["detail"]["cap_eff"] == "0000000000000000");
}

TEST_CASE_METHOD(bwrap_fixture, "bwrap: every call the seccomp filter denies is refused when made with valid arguments") {
  json results = forbidden_calls(*this);
  auto denials = seccomp_denials();
  REQUIRE(denials.size() >= 60);
  for (const auto& denial : denials) {
    INFO(denial.name << ": " << (results.contains(denial.name) ? results[denial.name].dump() : "not tried"));
    REQUIRE(results.contains(denial.name));  // the probe tries every entry of the filter
    CHECK(results[denial.name]["ok"] == false);
    CHECK(results[denial.name]["errno"] == denial.error);
  }
}

// The calls the filter exists for, written out here rather than taken from
// seccomp_denials(): a call dropped from the filter's table must fail this
// case, not silently leave it. "socket" is AF_UNIX, "socket_inet" AF_INET:
// the filter refuses socket() whatever the family.
constexpr const char* never_allowed[] = {
    "ptrace",          "process_vm_readv", "mount",       "unshare",     "setns",
    "bpf",             "io_uring_setup",   "socket",      "socket_inet", "keyctl",
    "perf_event_open", "userfaultfd",      "clone:CLONE_NEWUSER", "ioctl:TIOCSTI"};

TEST_CASE_METHOD(bwrap_fixture, "bwrap: each call of a fixed list is refused with the filter's EPERM") {
  // In the sandbox an agent gets, and (as root) in one where only the filter
  // stands in the way: there a call the filter no longer refuses succeeds,
  // or fails otherwise than with EPERM, where a capability would be missing.
  std::vector<std::pair<std::string, json>> sandboxes = {{"the agent's sandbox", forbidden_calls(*this)}};
  if (::geteuid() == 0) sandboxes.emplace_back("a sandbox with every capability", calls_with_every_capability(true));
  for (const auto& [where, results] : sandboxes)
    for (const char* name : never_allowed) {
      INFO(where << ": " << name << ": " << (results.contains(name) ? results[name].dump() : "not tried"));
      REQUIRE(results.contains(name));
      CHECK(results[name]["ok"] == false);
      CHECK(results[name]["errno"] == EPERM);
    }
}

TEST_CASE("bwrap: the seccomp filter alone refuses its calls to a holder of every capability of its namespace") {
  if (!require_root("only root can give a sandbox capabilities (bwrap --cap-add)")) return;
  json filtered = calls_with_every_capability(true), unfiltered = calls_with_every_capability(false);
  // The control: without the filter these answer otherwise, except where a
  // capability of the initial namespace or a sysctl closes the call to every
  // sandbox (or the kernel lacks it), which only the unprivileged probe above
  // can then tell apart, if at all.
  const std::set<std::string> closed_anyway = {
      "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
      "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot", "swapon",
      "swapoff", "acct", "syslog", "open_by_handle_at", "settimeofday", "clock_settime", "vhangup",
      "fanotify_init", "iopl", "ioperm", "unshare", "clone:CLONE_NEWUSER"};
  // Before Linux 6.13 process_madvise needs CAP_SYS_NICE of the initial
  // namespace even on the caller itself.
  utsname kernel{};
  REQUIRE(::uname(&kernel) == 0);
  int major = 0, minor = 0;
  std::sscanf(kernel.release, "%d.%d", &major, &minor);
  const bool madvise_closed_anyway = std::pair(major, minor) < std::pair(6, 13);
  for (const auto& denial : seccomp_denials()) {
    INFO(denial.name << ": " << filtered[denial.name].dump() << ", without the filter "
                     << unfiltered[denial.name].dump());
    REQUIRE(filtered.contains(denial.name));
    CHECK(filtered[denial.name]["ok"] == false);
    CHECK(filtered[denial.name]["errno"] == denial.error);
    bool provable = !closed_anyway.count(denial.name) && !(denial.name == "process_madvise" && madvise_closed_anyway);
    if (provable) CHECK(unfiltered[denial.name] != filtered[denial.name]);
  }
}

TEST_CASE_METHOD(bwrap_fixture, "bwrap: other namespaces, remounts and keyrings are closed too") {
  check_denied(forbidden_calls(*this), {"unshare_mount", "unshare_net", "mount_bind_remount", "keyctl_join"});
}

TEST_CASE_METHOD(bwrap_fixture, "bwrap: no socket of any family can be made") {
  check_denied(forbidden_calls(*this),
               {"socket_inet", "socket_inet6", "socket", "socket_raw", "socket_netlink", "socket_packet",
                "socket_vsock", "socketpair"},
               {"socket_inet", "socket_inet6", "socket", "socket_netlink", "socketpair"});
}

}  // namespace cairn::runtime::test
