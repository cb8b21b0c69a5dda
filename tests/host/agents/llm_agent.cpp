// Calls llm.chat input.calls times (default 1), catching tool errors; with
// input.crash_after_first it aborts after the first call on attempt 1, so the
// run resumes from its journal.
//
// output: {"results": [REPLY | {"error": TYPE, "message": MESSAGE}, ...]}
#include <cstdlib>

#include <cairn/cairn.hpp>

using cairn::json;

int main(int argc, char** argv) {
  return cairn::main(argc, argv, [](cairn::context& ctx, const json& input) -> json {
    const json hello = {{"messages", {{{"role", "user"}, {"content", "hello there world"}}}}};
    json results = json::array();
    for (int i = 0; i < input.value("calls", 1); ++i) {
      try {
        results.push_back(ctx.tool("llm.chat", hello));
      } catch (const cairn::tool_error& e) {
        results.push_back({{"error", e.type()}, {"message", e.what()}});
      }
      if (i == 0 && input.value("crash_after_first", false) && ctx.attempt() == 1) std::abort();
    }
    return json{{"results", results}};
  });
}
