// Benchmark agent: N empty steps, each timed from the call to ctx.step until
// the host's ack returns (the step is then durable). Returns the timings.
// input: {"steps": N}
#include <chrono>

#include <cairn/cairn.hpp>

int main(int argc, char** argv) {
  return cairn::main(argc, argv, [](cairn::context& ctx, const cairn::json& input) -> cairn::json {
    const int n = input.value("steps", 1000);
    cairn::json us = cairn::json::array();
    for (int i = 0; i < n; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      ctx.step("s" + std::to_string(i), [] { return nullptr; });
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    return {{"step_us", us}};
  });
}
