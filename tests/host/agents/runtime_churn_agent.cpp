// Attack on suspension (issue 16.4): an agent that sleeps just past the
// suspension threshold again and again, each time making the host give up
// and take back its sandbox and workspace.
#include <chrono>

#include <cairn/cairn.hpp>

int main(int argc, char** argv) {
  return cairn::main(argc, argv, [](cairn::context& ctx, const cairn::json& input) -> cairn::json {
    const int sleeps = input.value("sleeps", 10);
    for (int i = 0; i < sleeps; ++i) ctx.sleep(std::chrono::milliseconds(input.value("ms", 400)));
    return sleeps;
  });
}
