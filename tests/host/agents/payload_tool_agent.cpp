// Test agent: makes one tool call and returns its result.
//
// input: {"tool": "echo", "args": {...}}
#include <cairn/cairn.hpp>

using cairn::json;

int main(int argc, char** argv) {
  return cairn::main(argc, argv, [](cairn::context& ctx, const json& input) -> json {
    return ctx.tool(input.at("tool").get<std::string>(), input.at("args"));
  });
}
