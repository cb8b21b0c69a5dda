// The ways out of a bwrap sandbox through privileges, kernel interfaces and
// the network, each tried by the probe from inside: every test asserts that
// the attempt failed.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

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
