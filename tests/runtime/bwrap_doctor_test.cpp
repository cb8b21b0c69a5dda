#include <stdlib.h>
#include <unistd.h>

#include "tests/runtime/sandbox_fixture.hpp"

namespace cairn::runtime::test {

TEST_CASE("diagnose_bwrap_failure names the cause and the fix") {
  auto userns = diagnose_bwrap_failure(
      "bwrap: No permissions to creating new namespace, likely because the kernel does not allow "
      "non-privileged user namespaces.\n");
  REQUIRE(userns);
  CHECK_THAT(*userns,
             Catch::StartsWith("user namespaces are denied by the kernel") && Catch::Contains("sysctl"));
  auto uid_map = diagnose_bwrap_failure("some agent output\nbwrap: setting up uid map: Permission denied\n");
  REQUIRE(uid_map);
  CHECK_THAT(*uid_map, Catch::StartsWith("user namespaces are denied by the kernel"));
  auto exec = diagnose_bwrap_failure("bwrap: execvp /run/cairn/agent: No such file or directory\n");
  REQUIRE(exec);
  CHECK_THAT(*exec, Catch::Contains("interpreter"));
  CHECK_FALSE(diagnose_bwrap_failure("Traceback: the agent crashed on its own\n"));
  CHECK_FALSE(diagnose_bwrap_failure(""));
}

TEST_CASE("the bwrap doctor passes on this machine") {
  for (const auto& check : make_bwrap_backend()->check()) {
    INFO(check.name << ": " << check.detail << " / fix: " << check.fix);
    // Totals and the workspace size need root (as in CI); without, they are reported with a fix.
    if (check.name == "resource totals" && !require_cgroups()) continue;
    if (check.name == "workspace quota" && !require_quota()) continue;
    CHECK(check.ok);
  }
  auto checks = make_bwrap_backend()->check();
  auto starts =
      std::find_if(checks.begin(), checks.end(), [](const auto& c) { return c.name == "sandbox starts"; });
  REQUIRE(starts != checks.end());
}

TEST_CASE("the bwrap doctor reports how totals and the workspace size are enforced") {
  auto checks = make_bwrap_backend()->check();
  auto find = [&](const char* name) {
    auto it = std::find_if(checks.begin(), checks.end(), [&](const auto& c) { return c.name == name; });
    REQUIRE(it != checks.end());
    return *it;
  };
  doctor_check totals = find("resource totals");
  INFO(totals.detail);
  if (totals.ok)
    CHECK_THAT(totals.detail, Catch::StartsWith("cgroup v1: memory, pids, cpuacct") ||
                                  Catch::StartsWith("cgroup v2: memory, pids"));
  else
    CHECK_THAT(totals.detail, Catch::StartsWith("none: totals are per process only"));
  doctor_check quota = find("workspace quota");
  INFO(quota.detail);
  CHECK_THAT(quota.detail, Catch::StartsWith(quota.ok ? "ext4 image per run" : "unavailable: "));
  // As root through a loop device; otherwise through FUSE, by fuse2fs and fusermount.
  const bool fuse = (fs::exists("/usr/bin/fuse2fs") || fs::exists("/usr/sbin/fuse2fs")) &&
                    (fs::exists("/bin/fusermount3") || fs::exists("/usr/bin/fusermount3") ||
                     fs::exists("/bin/fusermount") || fs::exists("/usr/bin/fusermount")) &&
                    ::access("/dev/fuse", R_OK | W_OK) == 0;
  CHECK(quota.ok == (::geteuid() == 0 ? fs::exists("/dev/loop-control") : fuse));
  if (quota.ok) CHECK_THAT(quota.detail, Catch::Contains(::geteuid() == 0 ? "loop device" : "FUSE"));
}

TEST_CASE("the bwrap doctor reports a missing bwrap with its fix") {
  bwrap_options options;
  options.bwrap = "/nonexistent/bwrap";
  auto checks = make_bwrap_backend(options)->check();
  REQUIRE_FALSE(checks.empty());
  CHECK(checks[0].name == "bwrap installed");
  CHECK_FALSE(checks[0].ok);
  CHECK_THAT(checks[0].fix, Catch::Contains("apt-get install bubblewrap"));
}

TEST_CASE("the process backend's doctor says it does not isolate") {
  auto checks = make_process_backend()->check();
  REQUIRE(checks.size() == 1);
  CHECK(checks[0].ok);
  CHECK_THAT(checks[0].detail, Catch::Contains("NO isolation"));
}

TEST_CASE("resolve_sandbox_user picks an unprivileged uid when cairn runs as root") {
  if (::geteuid() != 0) {
    CHECK_FALSE(resolve_sandbox_user());
    return;
  }
  bwrap_options options;
  options.sandbox_uid = 12345;
  auto chosen = resolve_sandbox_user(options);
  REQUIRE(chosen);
  CHECK(chosen->uid == 12345);
  CHECK(chosen->source == "bwrap_options");

  ::setenv("CAIRN_SANDBOX_UID", "0", 1);
  CHECK_THROWS_AS(resolve_sandbox_user(), sandbox_error);
  ::setenv("CAIRN_SANDBOX_UID", "62000", 1);
  CHECK(resolve_sandbox_user()->uid == 62000);
  ::unsetenv("CAIRN_SANDBOX_UID");
  auto fallback = resolve_sandbox_user();
  REQUIRE(fallback);
  CHECK(fallback->uid != 0);
  CHECK(fallback->gid != 0);
}

}  // namespace cairn::runtime::test
