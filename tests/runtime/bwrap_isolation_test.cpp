// The ways out of a bwrap sandbox, each tried by the probe from inside:
// every test asserts that the attempt failed. The probe reports, the test
// decides.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>

#include "tests/runtime/sandbox_fixture.hpp"

namespace cairn::runtime::test {

TEST_CASE_METHOD(bwrap_fixture, "bwrap: host environment variables do not reach the sandbox") {
  ::setenv("CAIRN_TEST_SECRET", "hunter2", 1);
  json report = probe({"env", "2retnuh"});  // reversed, so the probe's cmdline does not contain it
  ::unsetenv("CAIRN_TEST_SECRET");
  INFO(report.dump());
  CHECK(report["detail"]["channel_fd"] == "3");
  CHECK(report["ok"] == true);
  CHECK(report["detail"]["found_in"].empty());
}

TEST_CASE_METHOD(bwrap_fixture, "bwrap: host files outside the mounts are invisible") {
  fs::path secret = dir.path / "host-secret.txt";
  std::ofstream(secret) << "secret";
  for (const std::string& path : {secret.string(), std::string("/etc/passwd"), std::string("/etc/hostname"),
                                  std::string("/root/.bashrc"), (dir.path / "agent.log").string()}) {
    json report = probe({"read", path});
    INFO(path << ": " << report.dump());
    CHECK(report["ok"] == false);
    CHECK(report["detail"] == "No such file or directory");
  }
}

TEST_CASE_METHOD(bwrap_fixture, "bwrap: nothing outside /workspace and /tmp is writable") {
  for (const char* path :
       {"/usr/x", "/etc/x", "/x", "/run/cairn/x", "/run/cairn/agent", "/proc/x", "/home/x"}) {
    json report = probe({"write", path, "escape"});
    INFO(path << ": " << report.dump());
    CHECK(report["ok"] == false);
  }
  CHECK_FALSE(fs::exists("/usr/x"));
  CHECK_FALSE(fs::exists("/etc/x"));
  CHECK_FALSE(fs::exists("/x"));
}

TEST_CASE_METHOD(bwrap_fixture, "bwrap: /tmp is private to the sandbox") {
  std::string name = unique_token("cairn-private-tmp");
  CHECK(probe({"write", "/tmp/" + name, "sandbox"})["ok"] == true);
  CHECK_FALSE(fs::exists("/tmp/" + name));
}

TEST_CASE_METHOD(bwrap_fixture, "bwrap: host processes are invisible") {
  json pids = probe({"pids"})["detail"];
  INFO(pids.dump());
  CHECK(pids.size() <= 3);  // bwrap's pid 1, the probe, at most one more
  CHECK(std::find(pids.begin(), pids.end(), std::to_string(::getpid())) == pids.end());
}

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

TEST_CASE_METHOD(bwrap_fixture, "bwrap: the agent is not root and holds no capabilities") {
  json status = probe({"status"})["detail"];
  CHECK(status["uid"] != 0);
  CHECK(status["euid"] != 0);
  CHECK(status["cap_eff"] == "0000000000000000");
  // Kernel-level root would pass these; the probe opens without writing.
  for (const char* path : {"/proc/sys/kernel/core_pattern", "/proc/sys/kernel/hostname",
                           "/proc/sys/vm/drop_caches", "/proc/sysrq-trigger"}) {
    json report = probe({"open_wronly", path});
    INFO(path << ": " << report.dump());
    CHECK(report["ok"] == false);
  }
}

}  // namespace cairn::runtime::test

namespace cairn::runtime::test {

TEST_CASE_METHOD(bwrap_fixture, "bwrap: the seccomp filter closes kernel interfaces and socket creation") {
  json results = probe({"syscalls"})["detail"];
  INFO(results.dump(2));
  REQUIRE(results.size() >= 20);
  for (const auto& [name, result] : results.items()) {
    INFO(name);
    CHECK(result["ok"] == false);
  }
  // These succeed for an unprivileged process without the filter: EPERM here
  // is the filter's answer.
  for (const char* name : {"socket_inet", "socket_unix", "socket_netlink", "socketpair", "keyctl", "add_key",
                           "io_uring_setup", "tiocsti"}) {
    INFO(name);
    CHECK(results[name]["errno"] == EPERM);
  }
}

}  // namespace cairn::runtime::test
