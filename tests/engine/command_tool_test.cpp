// User tools: host executables with JSON in and out, held to their declared
// input, time limit and output size. Every failure is a tool_error the agent
// can read; the host goes on.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "engine/tools/command_tool.hpp"
#include "protocol/text.hpp"
#include "tests/temp_dir.hpp"

using namespace cairn;
using json = nlohmann::json;

namespace {

struct fixture {
  testing::temp_dir dir;
  std::unique_ptr<engine::tool> tool;

  explicit fixture(std::chrono::milliseconds timeout = std::chrono::milliseconds(5000), std::size_t max_output = 1 << 20) {
    setenv("CAIRN_TEST_TOOL_LOG", (dir / "calls.log").c_str(), 1);
    tool = engine::make_command_tool({"mailer", {RECORD_TOOL}, {{"to", "string"}, {"mode?", "string"}, {"n?", "integer"}},
                                      timeout, engine::idempotency::at_most_once, max_output,
                                      {"CAIRN_TEST_TOOL_LOG", "CAIRN_TEST_SECRET"}});
  }
  ~fixture() { unsetenv("CAIRN_TEST_TOOL_LOG"); }

  json call(json args, std::uint64_t seq = 4) {
    engine::tool_call c;
    c.run_id = "run-1";
    c.seq = seq;
    c.idempotency_key = "run-1/" + std::to_string(seq);
    c.args = std::move(args);
    return tool->call(c);
  }

  std::string failure(json args) {
    try {
      call(std::move(args));
    } catch (const engine::tool_error& e) {
      return e.type() + ": " + e.what();
    }
    return "succeeded";
  }

  int calls() {
    std::ifstream in(dir / "calls.log");
    int n = 0;
    for (std::string line; std::getline(in, line);) ++n;
    return n;
  }
};

// The tool_error that a call of `t` without arguments ends in.
engine::tool_error failure_without_args(engine::tool& t) {
  engine::tool_call c;
  c.args = json::object();
  try {
    t.call(c);
  } catch (const engine::tool_error& e) {
    return e;
  }
  FAIL("succeeded");
  throw std::logic_error("unreachable");
}

// A tool that runs `body` as a shell script (its arguments on stdin unread).
std::unique_ptr<engine::tool> script_tool(const testing::temp_dir& dir, const std::string& body,
                                          std::chrono::milliseconds timeout = std::chrono::milliseconds(10000)) {
  const auto script = dir / "tool.sh";
  std::ofstream(script) << "#!/bin/sh\n" << body;
  std::filesystem::permissions(script, std::filesystem::perms::owner_all);
  return engine::make_command_tool({"script", {script.string()}, {}, timeout, engine::idempotency::idempotent,
                                    1 << 20, {}});
}

json call_without_args(engine::tool& t) {
  engine::tool_call c;
  c.args = json::object();
  return t.call(c);
}

// Whether process `pid` is gone (or a zombie nobody reaped yet: it runs no more).
bool gone(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  return line.substr(line.rfind(')') + 2, 1) == "Z";
}

}  // namespace

TEST_CASE("a user tool gets its arguments on stdin and the idempotency key in its environment") {
  fixture f;
  json out = f.call({{"to", "ana@example.com"}});
  CHECK(out == json{{"sent", true}, {"key", "run-1/4"}, {"seq", 4}});
  std::ifstream in(f.dir / "calls.log");
  std::string line;
  std::getline(in, line);
  CHECK(line == R"(run-1/4 {"to":"ana@example.com"})");
  CHECK(f.tool->kind(json::object()) == engine::idempotency::at_most_once);
}

TEST_CASE("arguments outside the declared input are refused before the tool runs") {
  fixture f;
  CHECK_THAT(f.failure({{"to", "a@b"}, {"bcc", "c@d"}}), Catch::StartsWith("refused: ") && Catch::Contains("'bcc'"));
  CHECK_THAT(f.failure({{"to", 5}}), Catch::StartsWith("refused: ") && Catch::Contains("'to' must be a string"));
  CHECK_THAT(f.failure({{"to", "a@b"}, {"n", 1.5}}), Catch::Contains("'n' must be an integer"));
  CHECK_THAT(f.failure(json::object()), Catch::StartsWith("refused: ") && Catch::Contains("needs argument 'to'"));
  CHECK_THAT(f.failure(json::array()), Catch::StartsWith("refused: "));
  CHECK(f.calls() == 0);
}

TEST_CASE("a hanging tool is killed at its timeout") {
  // Long enough for the call that works to finish on a loaded machine; the
  // hanging one sleeps 60 s.
  fixture f(std::chrono::milliseconds(3000));
  auto start = std::chrono::steady_clock::now();
  CHECK_THAT(f.failure({{"to", "x"}, {"mode", "hang"}}), Catch::StartsWith("timeout: ") && Catch::Contains("3000 ms"));
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(30));
  // The host goes on: the next call works.
  CHECK(f.call({{"to", "x"}})["sent"] == true);
}

TEST_CASE("garbage, huge output and a crash are clear errors") {
  fixture f(std::chrono::milliseconds(5000), 64 * 1024);
  CHECK_THAT(f.failure({{"to", "x"}, {"mode", "garbage"}}),
             Catch::StartsWith("bad_output: ") && Catch::Contains("not valid JSON") && Catch::Contains("this is not json"));
  CHECK_THAT(f.failure({{"to", "x"}, {"mode", "huge"}}),
             Catch::StartsWith("too_large: ") && Catch::Contains("65536 bytes"));
  CHECK_THAT(f.failure({{"to", "x"}, {"mode", "crash"}}),
             Catch::StartsWith("failed: ") && Catch::Contains("code 3") && Catch::Contains("mail server refused"));
  CHECK(f.call({{"to", "x"}})["sent"] == true);
}

TEST_CASE("a user tool gets a clean environment: the variables its grant names and cairn's own, no API key") {
  fixture f;
  setenv("CAIRN_LLM_API_KEY", "sk-host-only-51f0", 1);
  setenv("AWS_SECRET_ACCESS_KEY", "aws-host-only", 1);
  setenv("CAIRN_TEST_SECRET", "named-in-the-grant", 1);
  json seen = f.call({{"to", "x"}, {"mode", "env"}}, 9);
  unsetenv("CAIRN_LLM_API_KEY");
  unsetenv("AWS_SECRET_ACCESS_KEY");
  unsetenv("CAIRN_TEST_SECRET");
  INFO(seen.dump());
  CHECK(seen["api_key_seen"] == false);
  CHECK(seen["secret_seen"] == true);
  CHECK(seen["run"] == "run-1");
  CHECK(seen["seq"] == "9");
  CHECK(seen["key"] == "run-1/9");
  CHECK(seen["path"] == "/usr/local/bin:/usr/bin:/bin");
  for (const auto& name : seen["names"]) {
    static const std::set<std::string> allowed = {"PATH", "LANG", "HOME", "CAIRN_TEST_TOOL_LOG", "CAIRN_TEST_SECRET",
                                                  "CAIRN_RUN_ID", "CAIRN_TOOL_SEQ", "CAIRN_IDEMPOTENCY_KEY",
                                                  // set by bash itself
                                                  "PWD", "SHLVL", "_", "OLDPWD"};
    CHECK(allowed.count(name.get<std::string>()) == 1);
  }
}

TEST_CASE("a tool's output nested 300,000 levels deep fails that call alone") {
  testing::temp_dir dir;
  const auto script = dir / "deep.sh";
  std::ofstream(script) << "#!/bin/sh\nhead -c 300000 /dev/zero | tr '\\0' '['\nhead -c 300000 /dev/zero | tr '\\0' ']'\n";
  std::filesystem::permissions(script, std::filesystem::perms::owner_all);
  auto t = engine::make_command_tool({"deep", {script.string()}, {}, std::chrono::milliseconds(10000),
                                      engine::idempotency::idempotent, 1 << 20, {}});
  auto error = failure_without_args(*t);
  CHECK(error.type() == "bad_output");
  CHECK_THAT(error.what(), Catch::Contains("deeper than 64 levels"));
}

TEST_CASE("a tool that cannot start is a failed call, not a host error") {
  testing::temp_dir dir;
  auto t = engine::make_command_tool({"gone", {(dir / "missing").string()}, {}, std::chrono::milliseconds(1000),
                                      engine::idempotency::idempotent, 1024, {}});
  CHECK(failure_without_args(*t).type() == "failed");
}

TEST_CASE("a user tool gets none of the host's open descriptors, only stdin, stdout and stderr") {
  testing::temp_dir dir;
  // Opened without close-on-exec, as a library in the host might.
  const int opened = ::open("/dev/null", O_RDONLY);
  REQUIRE(opened >= 0);
  const int leaked = ::fcntl(opened, F_DUPFD, 100);
  REQUIRE(leaked >= 100);
  // ls lists its own descriptors: the three it was given, and 3 for the folder it reads.
  auto t = script_tool(dir, "printf '{\"fds\":\"%s\"}' \"$(ls /proc/self/fd | tr '\\n' ' ')\"\n");
  const json seen = call_without_args(*t);
  ::close(leaked);
  ::close(opened);
  INFO(seen.dump());
  std::istringstream fds(seen["fds"].get<std::string>());
  std::set<int> numbers;
  for (int fd; fds >> fd;) numbers.insert(fd);
  CHECK(numbers == std::set<int>{0, 1, 2, 3});
}

TEST_CASE("a timeout kills what the tool started too, not only the tool") {
  testing::temp_dir dir;
  const auto pid_file = dir / "background.pid";
  auto t = script_tool(dir, "sleep 60 &\necho $! > " + pid_file.string() + "\nwait\n", std::chrono::milliseconds(1500));
  const auto start = std::chrono::steady_clock::now();
  CHECK(failure_without_args(*t).type() == "timeout");
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(30));  // the call did not wait for it
  pid_t background = 0;
  std::ifstream(pid_file) >> background;
  REQUIRE(background > 0);
  for (int i = 0; i < 200 && !gone(background); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(gone(background));
}

TEST_CASE("a tool that cannot start leaves no process behind, not even a zombie") {
  testing::temp_dir dir;
  while (::waitpid(-1, nullptr, WNOHANG) > 0) {
  }
  auto t = engine::make_command_tool({"gone", {(dir / "missing").string()}, {}, std::chrono::milliseconds(1000),
                                      engine::idempotency::idempotent, 1024, {}});
  const auto error = failure_without_args(*t);
  CHECK(error.type() == "failed");
  CHECK_THAT(error.what(), Catch::Contains("cannot start") && Catch::Contains("No such file or directory"));
  CHECK(::waitpid(-1, nullptr, WNOHANG) <= 0);
}

TEST_CASE("a failing tool's stderr is quoted from its end, cut between UTF-8 characters") {
  testing::temp_dir dir;
  // 1000 three-byte characters, then the line that says what went wrong.
  auto t = script_tool(dir, "yes € | head -n 1000 | tr -d '\\n' >&2\necho ' disk full!' >&2\nexit 3\n");
  const auto error = failure_without_args(*t);
  const std::string message = error.what();
  CHECK(error.type() == "failed");
  CHECK_THAT(message, Catch::Contains("exited with code 3") && Catch::EndsWith("€€ disk full!"));
  CHECK(cairn::protocol::is_utf8(message));
}
