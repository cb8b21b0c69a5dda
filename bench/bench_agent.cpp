// Benchmark agent: N empty steps, each timed from the call to ctx.step until
// the host's ack returns (the step is then durable); or, with "tool", N calls
// of that tool, each timed until its journaled result returns. With
// "wait_signal", it then waits (no timeout) for that signal and returns its
// payload too. With "sleep_ms", it then sleeps that long (ctx.sleep) first.
// input: {"steps": N, "tool": "echo", "sleep_ms": 1000, "wait_signal": "go"}
// output: {"step_us": [...], "signal": payload}
#include <chrono>

#include <cairn/cairn.hpp>

int main(int argc, char** argv) {
  return cairn::main(argc, argv, [](cairn::context& ctx, const cairn::json& input) -> cairn::json {
    const int n = input.value("steps", 1000);
    const std::string tool = input.value("tool", "");
    const std::string signal = input.value("wait_signal", "");
    const int sleep_ms = input.value("sleep_ms", 0);
    cairn::json us = cairn::json::array();
    for (int i = 0; i < n; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      if (tool.empty()) ctx.step("s" + std::to_string(i), [] { return nullptr; });
      else ctx.tool(tool, {{"i", i}});
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    if (sleep_ms > 0) ctx.sleep(std::chrono::milliseconds(sleep_ms));
    if (signal.empty()) return {{"step_us", us}};
    return {{"step_us", us}, {"signal", *ctx.wait_signal(signal)}};
  });
}
