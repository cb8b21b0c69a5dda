// The ways out of a bwrap sandbox through files, processes and the
// environment, each tried by the probe from inside: every test asserts that
// the attempt failed. The probe reports, the test decides. Privileges,
// kernel interfaces and the network: bwrap_privilege_test.cpp; limits:
// bwrap_limits_test.cpp.
#include <signal.h>
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
  // Searched: its own environ, /proc/self/environ and every /proc/PID/environ (1 included).
  CHECK(report["detail"]["found_in"].empty());
}

TEST_CASE_METHOD(bwrap_fixture, "bwrap: host files outside the mounts are invisible") {
  host_secret secret("secret");
  for (const std::string& path : {secret.path.string(), std::string("/etc/passwd"), std::string("/etc/hostname"),
                                  std::string("/root/.bashrc"), (dir.path / "agent.log").string()}) {
    json report = probe({"read", path});
    INFO(path << ": " << report.dump());
    CHECK(report["ok"] == false);
    CHECK(report["detail"] == "No such file or directory");
  }
}

TEST_CASE_METHOD(bwrap_fixture, "bwrap: /etc/shadow and the host's home folders are invisible") {
  for (const char* path : {"/etc/shadow", "/etc/gshadow", "/root", "/home"}) {
    json report = probe({"read", path});
    INFO(path << ": " << report.dump());
    CHECK(report["ok"] == false);
  }
}

TEST_CASE_METHOD(bwrap_fixture, "bwrap: the journal database and the workspace image beside the workspace are invisible") {
  std::ofstream(dir.path / "journal.db") << "SQLite format 3";
  for (const std::string& path : {std::string("/workspace/../journal.db"), std::string("/journal.db"),
                                  (dir.path / "journal.db").string(), std::string("/workspace/../images/ws.img"),
                                  spec.workspace_image.string()}) {
    json report = probe({"read", path});
    INFO(path << ": " << report.dump());
    CHECK(report["ok"] == false);
  }
}

TEST_CASE_METHOD(bwrap_fixture, "bwrap: nothing outside /workspace, /tmp and /dev/shm is writable") {
  for (const char* path : {"/usr/x", "/etc/x", "/x", "/var/x", "/dev/x", "/run/cairn/x", "/run/cairn/agent",
                           "/proc/x", "/home/x"}) {
    json report = probe({"write", path, "escape"});
    INFO(path << ": " << report.dump());
    CHECK(report["ok"] == false);
  }
  CHECK_FALSE(fs::exists("/usr/x"));
  CHECK_FALSE(fs::exists("/etc/x"));
  CHECK_FALSE(fs::exists("/x"));
  CHECK_FALSE(fs::exists("/var/x"));
}

TEST_CASE_METHOD(bwrap_fixture, "bwrap: a walk of the whole tree finds no other writable place") {
  // Every folder where a file can be made and every file that opens for
  // writing, outside /proc and /sys.
  json found = probe({"writable"})["detail"];
  INFO(found.dump(1));
  auto under = [](const std::string& path, const std::string& root) {
    return path == root || path.rfind(root + "/", 0) == 0;
  };
  for (const std::string path : found)
    CHECK((under(path, "/workspace") || under(path, "/tmp") || under(path, "/dev/shm")));
  std::vector<std::string> paths = found;
  std::sort(paths.begin(), paths.end());
  CHECK(paths == std::vector<std::string>{"/dev/shm", "/tmp", "/workspace"});
}

TEST_CASE_METHOD(bwrap_fixture, "bwrap: /tmp is private to the sandbox") {
  std::string name = unique_token("cairn-private-tmp");
  CHECK(probe({"write", "/tmp/" + name, "sandbox"})["ok"] == true);
  CHECK_FALSE(fs::exists("/tmp/" + name));
}

TEST_CASE_METHOD(bwrap_fixture, "bwrap: a symlink planted in the workspace does not lead to the host's file") {
  host_secret secret("secret");
  fs::create_symlink(secret.path, dir.path / "ws" / "absolute-link");
  std::ofstream(dir.path / "host-secret.txt") << "secret";
  fs::create_symlink("../host-secret.txt", dir.path / "ws" / "relative-link");
  for (const char* link : {"/workspace/absolute-link", "/workspace/relative-link"}) {
    json report = probe({"read", link});
    INFO(link << ": " << report.dump());
    CHECK(report["ok"] == false);
    CHECK(report["detail"] != "secret");
  }
}

TEST_CASE_METHOD(bwrap_fixture, "bwrap: hard links to files outside the workspace fail") {
  for (const char* target : {"/usr/bin/true", "/etc/ld.so.cache", "/run/cairn/agent"}) {
    json report = probe({"link", target, "/workspace/linked"});
    INFO(target << ": " << report.dump());
    CHECK(report["ok"] == false);
  }
  CHECK_FALSE(fs::exists(dir.path / "ws" / "linked"));
}

TEST_CASE_METHOD(bwrap_fixture, "bwrap: device nodes cannot be made") {
  for (const char* where : {"/workspace/dev", "/tmp/dev", "/dev/shm/dev"}) {
    json report = probe({"mknod", where});
    INFO(where << ": " << report.dump());
    CHECK(report["ok"] == false);
  }
}

TEST_CASE_METHOD(bwrap_fixture, "bwrap: host processes are invisible") {
  json pids = probe({"pids"})["detail"];
  INFO(pids.dump());
  CHECK(pids.size() <= 3);  // bwrap's pid 1, the probe, at most one more
  CHECK(std::find(pids.begin(), pids.end(), std::to_string(::getpid())) == pids.end());
}

TEST_CASE_METHOD(bwrap_fixture, "bwrap: host processes cannot be signalled") {
  json report = probe({"kill", std::to_string(::getpid())});
  INFO(report.dump());
  CHECK(report["ok"] == false);
  CHECK(report["detail"] == "No such process");
}

}  // namespace cairn::runtime::test
