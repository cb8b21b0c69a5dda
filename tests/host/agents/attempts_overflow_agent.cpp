// Durations at the edge of what a clock can hold, through the C++ SDK.
// input {"use": ...}:
//   "wait_max"   ctx.wait_signal("go", milliseconds::max())
//   "sleep_max"  ctx.sleep(milliseconds::max())
//   "step_1e13"  a 1.5 s step with a timeout of 1e13 ms
#include <chrono>
#include <thread>

#include <cairn/cairn.hpp>

using namespace std::chrono;

int main(int argc, char** argv) {
  return cairn::main(argc, argv, [](cairn::context& ctx, const cairn::json& input) -> cairn::json {
    const std::string use = input.value("use", "");
    if (use == "wait_max") return ctx.wait_signal("go", milliseconds::max()).value_or("timed out");
    if (use == "sleep_max") {
      ctx.sleep(milliseconds::max());
      return "woke";
    }
    cairn::retry_policy patient = cairn::retry_policy::no_retry();
    patient.timeout = milliseconds(10'000'000'000'000);
    return ctx.step("slow", [] {
      std::this_thread::sleep_for(milliseconds(1500));
      return "finished";
    }, patient);
  });
}
