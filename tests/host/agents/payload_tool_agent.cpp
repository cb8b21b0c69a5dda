// Test agent: calls a tool `calls` times (default 1) with the same
// arguments and returns the last result.
//
// input: {"tool": "echo", "args": {...}, "calls": 1}
#include <cairn/cairn.hpp>

using cairn::json;

int main(int argc, char** argv) {
  return cairn::main(argc, argv, [](cairn::context& ctx, const json& input) -> json {
    json result;
    for (int i = 0; i < input.value("calls", 1); ++i) result = ctx.tool(input.at("tool").get<std::string>(), input.at("args"));
    return result;
  });
}
