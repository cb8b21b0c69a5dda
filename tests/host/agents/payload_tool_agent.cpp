// Test agent: calls a tool `calls` times (default 1) with the same
// arguments and returns the last result. With "distinct_bytes" N > 0, each
// call's args.text is instead N bytes of its own that do not compress, so no
// two calls share it (and the input stays small enough for a command line).
//
// input: {"tool": "echo", "args": {...}, "calls": 1, "distinct_bytes": 0}
#include <cairn/cairn.hpp>

#include "tests/support/noise.hpp"

using cairn::json;

int main(int argc, char** argv) {
  return cairn::main(argc, argv, [](cairn::context& ctx, const json& input) -> json {
    json result;
    const std::size_t distinct_bytes = input.value("distinct_bytes", 0);
    for (int i = 0; i < input.value("calls", 1); ++i) {
      json args = input.at("args");
      if (distinct_bytes > 0) args["text"] = cairn::testing::noise(distinct_bytes, i);
      result = ctx.tool(input.at("tool").get<std::string>(), args);
    }
    return result;
  });
}
