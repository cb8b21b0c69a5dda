// An honest-SDK attack on the host's attempt budget: one step whose every
// attempt overruns a 50 ms timeout, under a retry_policy asking for a
// million attempts. Each timeout kills the sandbox; the host must count it.
#include <chrono>
#include <thread>

#include <cairn/cairn.hpp>

int main(int argc, char** argv) {
  return cairn::main(argc, argv, [](cairn::context& ctx, const cairn::json&) -> cairn::json {
    cairn::retry_policy forever;
    forever.max_attempts = 1'000'000;
    forever.initial_delay = std::chrono::milliseconds(0);
    forever.timeout = std::chrono::milliseconds(50);
    return ctx.step("never done", [] { std::this_thread::sleep_for(std::chrono::seconds(10)); }, forever);
  });
}
