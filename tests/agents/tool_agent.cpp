// Test agent for tool calls. Runs a step, then each call in input.calls, then
// a step; a call that fails is caught and recorded. With crash_after_calls it
// aborts (on attempt 1) once the calls are done, so the run replays them.
//
// input: {"calls": [{"tool": "name", "args": {...}}, ...], "crash_after_calls": false}
// output: {"results": [OUTPUT | {"error": TYPE, "message": MESSAGE}, ...], "attempt": N}
#include <cstdlib>

#include <cairn/cairn.hpp>

using cairn::json;

int main(int argc, char** argv) {
  return cairn::main(argc, argv, [](cairn::context& ctx, const json& input) -> json {
    ctx.step("before", [] { return "ready"; });
    json results = json::array();
    for (const auto& call : input.value("calls", json::array())) {
      try {
        results.push_back(ctx.tool(call.at("tool").get<std::string>(), call.value("args", json::object())));
      } catch (const cairn::tool_error& e) {
        results.push_back({{"error", e.type()}, {"message", e.what()}});
      }
    }
    if (input.value("crash_after_calls", false) && ctx.attempt() == 1) std::abort();
    ctx.step("after", [] { return "done"; });
    return json{{"results", results}, {"attempt", ctx.attempt()}};
  });
}
