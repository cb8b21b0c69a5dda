// Test agent: a configurable multi-step workflow that records every real
// execution of a step body in exec.log (workspace), so tests can tell a replay
// from a re-execution.
//
// input: {"steps": N, "sleep_ms": 0, "fail_first": {"3": 2}, "terminal_at": -1,
//         "crash_at": -1, "rename_on_attempt2": -1, "catch_failure": false,
//         "mark_begin": false, "print": "", "long_line_bytes": 0}
// mark_begin: each body also appends its step number to began.log as it
// starts (before its sleep), so a test can tell the agent is inside a body.
// print: each step's body writes "PRINT I" to stdout (the run's log) as it
// starts, the text as given (escape sequences too); long_line_bytes: before
// its first step the agent writes one line of that many 'x' to stderr.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <thread>

#include <cairn/cairn.hpp>

using cairn::json;

int main(int argc, char** argv) {
  return cairn::main(argc, argv, [](cairn::context& ctx, const json& input) -> json {
    const int steps = input.value("steps", 5);
    const int sleep_ms = input.value("sleep_ms", 0);
    const int crash_at = input.value("crash_at", -1);
    const int terminal_at = input.value("terminal_at", -1);
    const int rename_at = input.value("rename_on_attempt2", -1);
    const json fail_first = input.value("fail_first", json::object());
    const bool mark_begin = input.value("mark_begin", false);
    const std::string print = input.value("print", "");
    if (const auto n = input.value("long_line_bytes", std::size_t{0}); n > 0)
      std::fprintf(stderr, "%s\n", std::string(n, 'x').c_str());
    std::random_device rd;

    json outputs = json::array();
    for (int i = 0; i < steps; ++i) {
      std::string name = "step " + std::to_string(i);
      if (i == rename_at && ctx.attempt() >= 2) name = "renamed " + std::to_string(i);
      int tries = 0;
      auto body = [&] {
        ++tries;
        if (mark_begin) std::ofstream("began.log", std::ios::app) << i << "\n";
        if (!print.empty()) {
          std::printf("%s %d\n", print.c_str(), i);
          std::fflush(stdout);
        }
        if (sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
        const auto nonce = std::to_string(rd()) + "-" + std::to_string(rd());
        std::ofstream("exec.log", std::ios::app) << i << " " << nonce << " attempt " << ctx.attempt() << "\n";
        if (i == crash_at && ctx.attempt() == 1) std::abort();
        if (i == terminal_at) throw cairn::terminal_error("step " + std::to_string(i) + " cannot succeed");
        if (fail_first.contains(std::to_string(i)) && tries <= fail_first[std::to_string(i)].get<int>())
          throw std::runtime_error("transient failure " + std::to_string(tries));
        return json{{"i", i}, {"nonce", nonce}};
      };
      cairn::retry_policy policy;
      policy.max_attempts = 4;
      policy.initial_delay = std::chrono::milliseconds(10);
      if (input.value("catch_failure", false)) {
        try {
          outputs.push_back(ctx.step(name, body, policy));
        } catch (const cairn::step_failed& e) {
          outputs.push_back(json{{"caught", e.what()}});
        }
      } else {
        outputs.push_back(ctx.step(name, body, policy));
      }
    }
    return json{{"steps", outputs.size()}, {"outputs", outputs}};
  });
}
