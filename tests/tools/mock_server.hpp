// Shared by the tool tests: cairn-mock-llm as a child process on a free port,
// stopped when the fixture goes out of scope, and small helpers for calls.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/tools/tool.hpp"
#include "tests/temp_dir.hpp"

namespace cairn::engine::test {

using namespace std::chrono_literals;

inline std::string slurp(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class mock_server {
 public:
  // `args` are added to --port 0 --port-file FILE --log FILE.
  explicit mock_server(std::vector<std::string> args = {}) {
    auto port_file = dir_ / "port";
    args.insert(args.begin(), {MOCK_LLM_SERVER, "--port", "0", "--port-file", port_file.string(), "--log",
                               log_path().string()});
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    auto output = (dir_ / "output").string();
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {  // only async-signal-safe calls until exec
      int fd = ::open(output.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0 || ::dup2(fd, 1) < 0 || ::dup2(fd, 2) < 0) ::_exit(126);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (!std::filesystem::exists(port_file)) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        FAIL("cairn-mock-llm exited before listening: " << slurp(dir_ / "output"));
      }
      if (std::chrono::steady_clock::now() > deadline) FAIL("cairn-mock-llm wrote no port file within 10 s");
      std::this_thread::sleep_for(5ms);
    }
    port_ = std::stoi(slurp(port_file));
  }

  ~mock_server() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    auto deadline = std::chrono::steady_clock::now() + 5s;
    while (::waitpid(pid_, nullptr, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        return;
      }
      std::this_thread::sleep_for(5ms);
    }
  }

  mock_server(const mock_server&) = delete;
  mock_server& operator=(const mock_server&) = delete;

  int port() const { return port_; }
  std::string url(const std::string& path) const { return "http://127.0.0.1:" + std::to_string(port_) + path; }
  const testing::temp_dir& dir() const { return dir_; }
  std::filesystem::path log_path() const { return dir_ / "requests.log"; }
  // The requests it has logged, one JSON object each.
  std::vector<json> requests() const {
    std::vector<json> lines;
    std::ifstream in(log_path());
    for (std::string line; std::getline(in, line);) lines.push_back(json::parse(line));
    return lines;
  }

 private:
  testing::temp_dir dir_;
  pid_t pid_ = -1;
  int port_ = 0;
};

inline tool_call make_call(json args, std::uint64_t seq = 7) {
  tool_call call;
  call.run_id = "run-1";
  call.seq = seq;
  call.idempotency_key = "run-1/" + std::to_string(seq);
  call.args = std::move(args);
  return call;
}

// The tool_error that `f` throws; FAILs when it throws none.
template <class F>
tool_error error_of(F&& f) {
  try {
    f();
  } catch (const tool_error& e) {
    return e;
  }
  FAIL("expected a tool_error, but the call succeeded");
  throw std::logic_error("unreachable");
}

}  // namespace cairn::engine::test
