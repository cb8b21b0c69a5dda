// The smallest useful agent: two journaled steps and a file in /workspace.
#include <fstream>

#include <cairn/cairn.hpp>

int main(int argc, char** argv) {
  return cairn::main(argc, argv, [](cairn::context& ctx, const cairn::json& input) {
    auto greeting = ctx.step("greet", [&] { return "hello, " + input.value("name", std::string("world")); });
    return ctx.step("save", [&] {
      std::ofstream("greeting.txt") << greeting.get<std::string>() << "\n";
      return cairn::json{{"saved", "/workspace/greeting.txt"}, {"text", greeting}};
    });
  });
}
