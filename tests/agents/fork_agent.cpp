// The agent of `cairn fork`'s test (tests/cli/fork_test.cpp): 60 journaled
// steps. Step i is a model call (llm.chat) when i % 3 == 0, a call of the
// counting tool "count" when i % 3 == 1, and else a step that appends
// "step i" to steps.txt in /workspace (its working directory). With input
// {"fail_at": N} step N fails (terminal, before it writes anything), as a
// bug would.
#include <fstream>
#include <string>

#include <cairn/cairn.hpp>

using json = nlohmann::json;

int main(int argc, char** argv) {
  return cairn::main(argc, argv, [](cairn::context& ctx, const json& input) -> json {
    const int fail_at = input.value("fail_at", -1);
    int words = 0;
    for (int i = 0; i < 60; ++i) {
      const std::string name = "step " + std::to_string(i);
      if (i % 3 == 0) {
        auto reply = ctx.tool("llm.chat", {{"messages", {{{"role", "user"}, {"content", name}}}}});
        words += static_cast<int>(reply.value("content", "").size() > 0);
      } else if (i % 3 == 1) {
        ctx.tool("count", {{"run", ctx.run_id()}});
      } else {
        ctx.step(name, [&] {
          if (i == fail_at) throw cairn::terminal_error(name + " has a bug");
          std::ofstream("steps.txt", std::ios::app) << name << "\n";
          return i;
        });
      }
    }
    return json{{"steps", 60}, {"answers", words}};
  });
}
