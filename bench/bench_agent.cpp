// Benchmark agent: N empty steps, each timed from the call to ctx.step until
// the host's ack returns (the step is then durable); or, with "tool", N calls
// of that tool, each timed until its journaled result returns.
// input: {"steps": N, "tool": "echo"}  output: {"step_us": [...]}
#include <chrono>

#include <cairn/cairn.hpp>

int main(int argc, char** argv) {
  return cairn::main(argc, argv, [](cairn::context& ctx, const cairn::json& input) -> cairn::json {
    const int n = input.value("steps", 1000);
    const std::string tool = input.value("tool", "");
    cairn::json us = cairn::json::array();
    for (int i = 0; i < n; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      if (tool.empty()) ctx.step("s" + std::to_string(i), [] { return nullptr; });
      else ctx.tool(tool, {{"i", i}});
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    return {{"step_us", us}};
  });
}
