// Test agent for the chaos test (tests/chaos): every kind of journaled call,
// each made so that a re-execution of something already journaled shows.
//
// A step body counts its executions in the workspace (file "count-NAME") and
// returns {"count": N, "attempt": ctx.attempt()}: the journaled count equals
// the file's unless an acknowledged step ran again. At its end the workflow
// compares every step's journaled count with its file and lists the steps
// whose counts differ in "mismatches" (empty when nothing ran twice).
//
// input: {"tool": true, "sleep_ms": 1000, "signal": "go", "child": {...}}, each
// optional. The workflow, in journal order (seq in brackets for the full
// input):
//   step a [0], tool "count" [1] (when "tool"), step b [2], sleep [3] (when
//   "sleep_ms"), step c [4], wait_signal [5] (when "signal"), start_child
//   chaos_agent with input "child" [6], step d [7], join [8] (when "child"),
//   step e [9].
// output: {"steps": {"a": N, ...}, "tool": RESULT, "signal": PAYLOAD,
//          "child": CHILD_OUTPUT, "mismatches": [NAME, ...]}
#include <fstream>
#include <map>
#include <string>

#include <cairn/cairn.hpp>

using cairn::json;

namespace {

int executions(const std::string& name) {
  int n = 0;
  std::ifstream("count-" + name) >> n;
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  return cairn::main(argc, argv, [](cairn::context& ctx, const json& input) -> json {
    std::map<std::string, int> counts;
    auto step = [&](const std::string& name) {
      const json r = ctx.step(name, [&] {
        const int n = executions(name) + 1;
        std::ofstream("count-" + name, std::ios::trunc) << n << "\n";
        return json{{"count", n}, {"attempt", ctx.attempt()}};
      });
      counts[name] = r.at("count").get<int>();
    };

    json out = json::object();
    step("a");
    if (input.value("tool", false)) out["tool"] = ctx.tool("count", {{"run", ctx.run_id()}});
    step("b");
    if (input.contains("sleep_ms")) ctx.sleep(std::chrono::milliseconds(input["sleep_ms"].get<int>()));
    step("c");
    if (input.contains("signal")) out["signal"] = ctx.wait_signal(input["signal"].get<std::string>()).value_or(nullptr);
    std::optional<cairn::child_handle> child;
    if (input.contains("child")) child = ctx.start_child("chaos_agent", input["child"]);
    step("d");
    if (child) out["child"] = ctx.join(*child);
    step("e");

    json mismatches = json::array();
    for (const auto& [name, count] : counts)
      if (executions(name) != count) mismatches.push_back(name);
    out["steps"] = counts;
    out["mismatches"] = mismatches;
    return out;
  });
}
