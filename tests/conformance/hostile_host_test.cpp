// Each SDK facing a broken or hostile host, played by this test on the
// agent's channel: whatever the host sends, the agent sends no outcome and
// exits with the code SCENARIOS.md gives, in bounded time.
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <optional>
#include <thread>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "tests/conformance/sdk_agents.hpp"
#include "tests/temp_dir.hpp"

using namespace cairn;
using json = nlohmann::json;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

using testing::conformance_agents;
using testing::sdk_agent;

std::string frame(const std::string& payload, std::optional<std::uint32_t> length = std::nullopt) {
  const std::uint32_t n = length.value_or(static_cast<std::uint32_t>(payload.size()));
  std::string out{static_cast<char>(n >> 24), static_cast<char>(n >> 16), static_cast<char>(n >> 8),
                  static_cast<char>(n)};
  return out + payload;
}

// The agent, started as cairn starts it but with this test as its host.
class played_agent {
 public:
  played_agent(const sdk_agent& agent, const testing::temp_dir& dir) {
    int pair[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) == 0);
    fs::path program = agent.program;
    if (agent.language == "JavaScript") {
      // Run from a folder where Node finds the SDK as an installed package.
      fs::create_directories(dir / "node_modules");
      fs::create_symlink(JS_SDK, dir / "node_modules" / "cairn");
      program = dir / agent.program.filename();
      fs::copy_file(agent.program, program);
    }
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::dup2(pair[1], 3);  // without close-on-exec
      const std::string env_path = "PYTHONPATH=" + std::string(PYTHON_SDK);
      const char* env[] = {"CAIRN_CHANNEL_FD=3", "CAIRN_RUN_ID=hostile", "PATH=/usr/local/bin:/usr/bin:/bin",
                           env_path.c_str(), nullptr};
      const std::string p = program.string();
      ::execle(p.c_str(), p.c_str(), nullptr, env);
      ::_exit(127);
    }
    ::close(pair[1]);
    fd_ = pair[0];
  }
  ~played_agent() {
    if (pid_ > 0 && !status_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    ::close(fd_);
  }

  void send(const std::string& bytes) {
    for (std::size_t off = 0; off < bytes.size();) {
      ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return;  // the agent may already have hung up
      off += static_cast<std::size_t>(n);
    }
  }

  // The next frame's JSON, or nullopt once the agent closed its channel; at most 60 s.
  std::optional<json> next() {
    std::string header = read_exactly(4);
    if (header.size() < 4) return std::nullopt;
    const auto* h = reinterpret_cast<const unsigned char*>(header.data());
    const std::uint32_t n = (std::uint32_t{h[0]} << 24) | (h[1] << 16) | (h[2] << 8) | h[3];
    REQUIRE(n <= 16u * 1024 * 1024);
    std::string payload = read_exactly(n);
    REQUIRE(payload.size() == n);
    return json::parse(payload);
  }

  // Reads until the agent hangs up; its exit code then (within 60 s).
  int outcome(std::vector<std::string>& sent) {
    while (auto msg = next()) sent.push_back(msg->value("t", ""));
    const auto until = std::chrono::steady_clock::now() + 60s;
    int status = 0;
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      REQUIRE(std::chrono::steady_clock::now() < until);
      std::this_thread::sleep_for(10ms);
    }
    status_ = status;
    REQUIRE(WIFEXITED(status));
    return WEXITSTATUS(status);
  }

 private:
  std::string read_exactly(std::size_t n) {
    std::string out;
    const auto until = std::chrono::steady_clock::now() + 60s;
    char buffer[65536];
    while (out.size() < n) {
      pollfd p{fd_, POLLIN, 0};
      REQUIRE(std::chrono::steady_clock::now() < until);
      if (::poll(&p, 1, 100) <= 0) continue;
      ssize_t got = ::recv(fd_, buffer, std::min(sizeof buffer, n - out.size()), 0);
      if (got <= 0) break;
      out.append(buffer, static_cast<std::size_t>(got));
    }
    return out;
  }

  pid_t pid_ = -1;
  int fd_ = -1;
  std::optional<int> status_;
};

json start_msg(std::uint64_t history_steps) {
  return {{"t", "start"}, {"v", 2}, {"run_id", "hostile"}, {"input", {{"scenario", "steps"}, {"n", 2}}},
          {"attempt", 1}, {"history_steps", history_steps}, {"next_step_attempt", 1}};
}

}  // namespace

TEST_CASE("conformance: a broken handshake from the host ends the agent with code 2, sending nothing") {
  const auto agent = GENERATE(from_range(conformance_agents()));
  struct bad {
    const char* what;
    std::string bytes;
  };
  const auto answer = GENERATE(values<bad>({
      {"a length of 0", frame("", 0)},
      {"a length above 16 MiB", frame("", 16u * 1024 * 1024 + 1)},
      {"invalid JSON", frame("{\"t\":\"start\",")},
      {"a JSON array", frame("[1,2]")},
      {"a start of protocol v3", frame(json{{"t", "start"}, {"v", 3}, {"run_id", "hostile"}, {"input", nullptr},
                                            {"attempt", 1}, {"history_steps", 0}, {"next_step_attempt", 1}}
                                           .dump())},
      {"a reject", frame(R"({"t":"reject","error":"not you"})")},
  }));
  INFO(agent.language << ": " << answer.what);
  testing::temp_dir dir;
  played_agent a(agent, dir);
  auto hello = a.next();
  REQUIRE(hello);
  CHECK((*hello)["t"] == "hello");
  CHECK((*hello)["v"] == 2);
  a.send(answer.bytes);
  std::vector<std::string> sent;
  CHECK(a.outcome(sent) == 2);
  CHECK(sent.empty());
}

TEST_CASE("conformance: a host that breaks the protocol after start ends the agent with code 3, sending no outcome") {
  const auto agent = GENERATE(from_range(conformance_agents()));
  const bool bad_history = GENERATE(false, true);
  INFO(agent.language << (bad_history ? ": a history chunk from the wrong seq" : ": an ack for the wrong seq"));
  testing::temp_dir dir;
  played_agent a(agent, dir);
  REQUIRE(a.next());  // hello
  std::vector<std::string> sent;
  if (bad_history) {
    a.send(frame(start_msg(2).dump()));
    auto ask = a.next();
    REQUIRE(ask);
    REQUIRE((*ask)["t"] == "history");
    REQUIRE((*ask)["from"] == 0);
    a.send(frame(json{{"t", "history"},
                      {"from", 1},
                      {"steps", {{{"seq", 1}, {"name", "s1"}, {"kind", "step"}, {"status", "ok"}, {"output", 1},
                                  {"attempt", 1}, {"duration_us", 5}}}}}
                     .dump()));
  } else {
    a.send(frame(start_msg(0).dump()));
    for (;;) {
      auto msg = a.next();
      REQUIRE(msg);
      if ((*msg)["t"] == "step") break;
      REQUIRE((*msg)["t"] == "begin");
    }
    a.send(frame(R"({"t":"ack","seq":5})"));
  }
  CHECK(a.outcome(sent) == 3);
  for (const auto& t : sent) CHECK((t != "done" && t != "fail"));
}
