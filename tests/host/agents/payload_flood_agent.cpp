// Hostile agent for journal bounds: journals `steps` steps whose outputs are
// strings of `bytes` bytes, each its own and incompressible, as fast as the
// host acknowledges them.
//
// input: {"steps": 30, "bytes": 4190000}
#include <string>

#include <cairn/cairn.hpp>

#include "tests/support/noise.hpp"

using cairn::json;

int main(int argc, char** argv) {
  return cairn::main(argc, argv, [](cairn::context& ctx, const json& input) -> json {
    const int steps = input.at("steps").get<int>();
    const auto bytes = input.at("bytes").get<std::size_t>();
    for (int i = 0; i < steps; ++i)
      ctx.step("block " + std::to_string(i), [&] { return cairn::testing::noise(bytes, i); });
    return steps;
  });
}
