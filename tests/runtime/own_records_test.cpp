// Where cairn keeps its records: a folder of the user's alone, never one
// another user made first (issue 40, finding 7).
#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>

#include <catch2/catch.hpp>

#include "runtime/own_records.hpp"
#include "tests/runtime/sandbox_fixture.hpp"

namespace cairn::runtime::test {
namespace {

// A uid no account uses, for root to act as a normal user.
constexpr uid_t test_uid = 61998;

// Runs `check` as a normal user, with XDG_RUNTIME_DIR set to `runtime_dir`:
// as root in a child process that becomes test_uid, else in this process.
// Returns what `check` returned: empty when all held, else what did not.
std::string as_normal_user(const fs::path& runtime_dir, const std::function<std::string()>& check) {
  if (::geteuid() != 0) {
    const char* before = std::getenv("XDG_RUNTIME_DIR");
    const std::string kept = before ? before : "";
    ::setenv("XDG_RUNTIME_DIR", runtime_dir.c_str(), 1);
    std::string result = check();
    if (before) ::setenv("XDG_RUNTIME_DIR", kept.c_str(), 1);
    else ::unsetenv("XDG_RUNTIME_DIR");
    return result;
  }
  int report[2];
  REQUIRE(::pipe2(report, O_CLOEXEC) == 0);
  pid_t child = ::fork();
  if (child == 0) {
    ::setenv("XDG_RUNTIME_DIR", runtime_dir.c_str(), 1);
    std::string result = ::setgroups(0, nullptr) == 0 && ::setresgid(test_uid, test_uid, test_uid) == 0 &&
                                 ::setresuid(test_uid, test_uid, test_uid) == 0
                             ? check()
                             : "could not become uid " + std::to_string(test_uid);
    [[maybe_unused]] auto written = ::write(report[1], result.data(), result.size());
    ::_exit(0);
  }
  ::close(report[1]);
  std::string result;
  char buffer[4096];
  for (ssize_t n; (n = ::read(report[0], buffer, sizeof buffer)) > 0;) result.append(buffer, static_cast<std::size_t>(n));
  ::close(report[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  if (!WIFEXITED(status)) result += " (the child was killed)";
  return result;
}

// The folder of the one record of `kind` found, or what was found instead.
std::string folder_of_record(const std::string& kind) {
  auto found = own_records(kind);
  if (found.size() != 1) return std::to_string(found.size()) + " records found";
  return found.front().file.parent_path().string();
}

}  // namespace

TEST_CASE("own records: in the user's runtime folder while it is the user's alone, never once others may enter it") {
  temp_dir dir;
  const fs::path runtime_dir = dir.path / "runtime";
  fs::create_directory(runtime_dir);
  ::chmod(runtime_dir.c_str(), 0700);
  if (::geteuid() == 0) REQUIRE(::chown(runtime_dir.c_str(), test_uid, test_uid) == 0);
  const std::string kind = unique_token("test");

  std::string problem = as_normal_user(runtime_dir, [&]() -> std::string {
    own_record kept(kind, "subject");
    const std::string where = folder_of_record(kind);
    if (where != (runtime_dir / "cairn-records").string()) return "kept in " + where;
    if (find_records_place().folder != runtime_dir / "cairn-records") return "doctor names another folder";
    // Open to others now: neither trusted nor written to any more.
    ::chmod(runtime_dir.c_str(), 0755);
    const std::string now = folder_of_record(kind);
    if (now != "0 records found") return "still read from the open folder: " + now;
    const auto place = find_records_place();
    if (!place.folder || place.folder->string().starts_with(runtime_dir.string())) return "still written there";
    if (place.passed_over.empty() || place.passed_over.front().find("may be entered by others") == std::string::npos)
      return "the open folder is not named";
    return "";
  });
  INFO(problem);
  CHECK(problem.empty());
  if (::geteuid() == 0)  // the test uid's records in /tmp
    for (const auto& entry : fs::directory_iterator("/tmp"))
      if (entry.path().filename().string().starts_with("cairn-records-" + std::to_string(test_uid)))
        fs::remove_all(entry.path());
}

}  // namespace cairn::runtime::test
