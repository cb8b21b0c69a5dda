// One step whose first `fail` attempts throw (a terminal_error if
// "terminal"), under a retry_policy of "max_attempts" attempts, 50 ms initial
// delay, doubling, no jitter. The step's output is {"attempts": how many this
// sandbox made, "waited_ms": from the first attempt's start to the last's}.
#include <chrono>
#include <stdexcept>

#include <cairn/cairn.hpp>

int main(int argc, char** argv) {
  return cairn::main(argc, argv, [](cairn::context& ctx, const cairn::json& input) -> cairn::json {
    cairn::retry_policy policy;
    policy.max_attempts = input.value("max_attempts", 3);
    policy.initial_delay = std::chrono::milliseconds(50);
    policy.multiplier = 2;
    policy.jitter = 0;
    const int fail = input.value("fail", 0);
    const bool terminal = input.value("terminal", false);
    int attempts = 0;
    const auto first = std::chrono::steady_clock::now();
    return ctx.step("flaky", [&]() -> cairn::json {
      if (++attempts <= fail) {
        if (terminal) throw cairn::terminal_error("attempt " + std::to_string(attempts) + " cannot succeed");
        throw std::runtime_error("attempt " + std::to_string(attempts) + " failed");
      }
      const auto waited = std::chrono::steady_clock::now() - first;
      return {{"attempts", attempts},
              {"waited_ms", std::chrono::duration_cast<std::chrono::milliseconds>(waited).count()}};
    }, policy);
  });
}
