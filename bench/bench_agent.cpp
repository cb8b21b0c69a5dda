// Benchmark agent: N empty steps, each timed from the call to ctx.step until
// the host's ack returns (the step is then durable); or, with "tool", N calls
// of that tool, each timed until its journaled result returns. With
// "wait_signal", it then waits (no timeout) for that signal and returns its
// last payload too, "rounds" times with a step between two waits. With "sleep_ms", it
// then sleeps that long (ctx.sleep) first. With "fill_mb", a first step
// writes that many MiB of files (256 MiB each at most) into /workspace.
// input: {"steps": N, "tool": "echo", "sleep_ms": 1000, "wait_signal": "go", "rounds": 1, "fill_mb": 0}
// output: {"step_us": [...], "signal": payload}
#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include <cairn/cairn.hpp>

namespace {

void fill_workspace(int mib) {
  const std::vector<char> chunk(1 << 20, 'x');
  for (int file = 0, left = mib; left > 0; ++file) {
    std::ofstream out("/workspace/fill-" + std::to_string(file) + ".bin", std::ios::binary);
    for (int i = 0; i < std::min(left, 256); ++i) out.write(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    if (!out.flush()) throw std::runtime_error("writing /workspace failed");
    left -= std::min(left, 256);
  }
}

}  // namespace

int main(int argc, char** argv) {
  return cairn::main(argc, argv, [](cairn::context& ctx, const cairn::json& input) -> cairn::json {
    const int n = input.value("steps", 1000);
    const std::string tool = input.value("tool", "");
    const std::string signal = input.value("wait_signal", "");
    const int rounds = input.value("rounds", 1);
    const int sleep_ms = input.value("sleep_ms", 0);
    if (const int fill_mb = input.value("fill_mb", 0); fill_mb > 0)
      ctx.step("fill", [fill_mb] {
        fill_workspace(fill_mb);
        return fill_mb;
      });
    cairn::json us = cairn::json::array();
    for (int i = 0; i < n; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      if (tool.empty()) ctx.step("s" + std::to_string(i), [] { return nullptr; });
      else ctx.tool(tool, {{"i", i}});
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    if (sleep_ms > 0) ctx.sleep(std::chrono::milliseconds(sleep_ms));
    if (signal.empty()) return {{"step_us", us}};
    cairn::json payload;
    for (int round = 0; round < rounds; ++round) {
      if (round > 0) ctx.step("after-" + std::to_string(round), [] { return nullptr; });
      payload = *ctx.wait_signal(signal);
    }
    return {{"step_us", us}, {"signal", payload}};
  });
}
