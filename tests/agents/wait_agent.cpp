// Test agent for long-running runs: follows a plan of operations from its
// input and logs every real execution of a step body in exec.log (workspace),
// so tests can tell a replay from a re-execution.
//
// input: {"plan": [op, ...], "catch": false}; each op is one of
//   {"op": "step", "name": "a"}                      a step returning its name
//   {"op": "sleep", "ms": 1500}                      ctx.sleep
//   {"op": "sleep_until", "at_ms": 1700000000000}    ctx.sleep_until (ms since the epoch)
//   {"op": "signal", "name": "approval", "timeout_ms": 5000}   ctx.wait_signal (timeout optional)
//   {"op": "child", "agent": "wait_agent", "input": {...}}     ctx.start_child
//   {"op": "join_all"}                               ctx.join of every child started so far, in order
//   {"op": "slow", "name": "s", "ms": 3000, "timeout_ms": 500, "attempts": 2}
//                                                    a step that takes `ms` (longer on attempt 1 only
//                                                    when "first_only" is true), with a timeout
//   {"op": "fail", "message": "boom"}                 throw from the workflow
//   {"op": "crash"}                                  abort outside any step, on every attempt
//   {"op": "print", "text": "hello"}                 the text and a newline to stdout (the run's log), at once
// With "catch": true a child_failed / step_failed / child_error is caught and
// recorded in the output instead of failing the run.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>

#include <cairn/cairn.hpp>

using cairn::json;

namespace {

void log_exec(const std::string& what) {
  std::ofstream("exec.log", std::ios::app) << what << "\n";
}

json run_op(cairn::context& ctx, const json& op, std::vector<cairn::child_handle>& children) {
  const std::string kind = op.at("op");
  if (kind == "step") {
    const std::string name = op.at("name");
    return ctx.step(name, [&] {
      log_exec("step " + name);
      return name;
    });
  }
  if (kind == "sleep") {
    ctx.sleep(std::chrono::milliseconds(op.at("ms").get<std::int64_t>()));
    return "slept";
  }
  if (kind == "sleep_until") {
    ctx.sleep_until(std::chrono::system_clock::time_point(std::chrono::milliseconds(op.at("at_ms").get<std::int64_t>())));
    return "slept";
  }
  if (kind == "signal") {
    std::optional<std::chrono::milliseconds> timeout;
    if (op.contains("timeout_ms")) timeout = std::chrono::milliseconds(op["timeout_ms"].get<std::int64_t>());
    auto payload = ctx.wait_signal(op.at("name").get<std::string>(), timeout);
    return payload ? json{{"signal", *payload}} : json{{"timed_out", true}};
  }
  if (kind == "child") {
    children.push_back(ctx.start_child(op.at("agent").get<std::string>(), op.value("input", json::object())));
    return children.back().run_id;
  }
  if (kind == "join_all") {
    json results = json::array();
    for (const auto& c : children) results.push_back(ctx.join(c));
    return results;
  }
  if (kind == "slow") {
    const std::string name = op.at("name");
    cairn::retry_policy policy;
    policy.max_attempts = op.value("attempts", 1);
    policy.timeout = std::chrono::milliseconds(op.value("timeout_ms", 0));
    policy.initial_delay = std::chrono::milliseconds(10);
    const bool first_only = op.value("first_only", false);
    return ctx.step(name, [&] {
      log_exec("slow " + name + " attempt " + std::to_string(ctx.attempt()));
      if (!first_only || ctx.attempt() == 1)
        std::this_thread::sleep_for(std::chrono::milliseconds(op.at("ms").get<int>()));
      return name;
    }, policy);
  }
  if (kind == "print") {
    std::printf("%s\n", op.at("text").get<std::string>().c_str());
    std::fflush(stdout);
    return "printed";
  }
  if (kind == "fail") throw std::runtime_error(op.value("message", "the plan says fail"));
  if (kind == "crash") std::abort();
  throw cairn::terminal_error("unknown op " + kind);
}

}  // namespace

int main(int argc, char** argv) {
  return cairn::main(argc, argv, [](cairn::context& ctx, const json& input) -> json {
    std::vector<cairn::child_handle> children;
    json out = json::array();
    for (const auto& op : input.value("plan", json::array())) {
      if (!input.value("catch", false)) {
        out.push_back(run_op(ctx, op, children));
        continue;
      }
      try {
        out.push_back(run_op(ctx, op, children));
      } catch (const cairn::child_failed& e) {
        out.push_back(json{{"child_failed", e.what()}});
      } catch (const cairn::child_error& e) {
        out.push_back(json{{"child_error", e.what()}});
      } catch (const cairn::step_failed& e) {
        out.push_back(json{{"step_failed", e.what()}});
      }
    }
    return out;
  });
}
