// cairn SDK: what an agent program links. An agent is a `main` that hands its
// workflow to cairn::main; every ctx.step result is journaled by the host
// before the step returns, and on replay (after any crash) the recorded result
// is returned without running the step again. Timers, signals and child runs
// are journaled the same way, so a run can wait for days and survive restarts.
//
//   int main(int argc, char** argv) {
//     return cairn::main(argc, argv, [](cairn::context& ctx, const cairn::json& input) -> cairn::json {
//       auto plan = ctx.step("plan", [&] { return make_plan(input); });
//       auto approval = ctx.wait_signal("approved", std::chrono::hours(24));
//       if (!approval) return "not approved in time";
//       return ctx.step("report", [&] { return write_report(plan, *approval); });
//     });
//   }
//
// The wire protocol is specified in protocol/PROTOCOL.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

#include <nlohmann/json.hpp>

namespace cairn {

using json = nlohmann::json;

// How a failing step asks to be retried inside the same run; the host decides
// from this and the run's policy: after attempt n fails it waits
// min(initial_delay * multiplier^(n-1), max_delay), scaled by a random factor
// in [1 - jitter, 1] so that runs failing together do not retry in lockstep,
// then makes attempt n+1. A terminal_error is never retried.
struct retry_policy {
  int max_attempts = 3;  // at most the run policy's retry.step_attempts (default 10): more are not made
  std::chrono::milliseconds initial_delay{100};
  double multiplier = 2.0;
  std::chrono::milliseconds max_delay{10'000};
  // Longest time one attempt may take; 0: the run policy's default. The host
  // enforces it: it kills the sandbox of an attempt that overruns and counts a
  // failed attempt, retried (in a new sandbox) while max_attempts allows;
  // each new sandbox counts against the run's attempts. At most 100 years.
  std::chrono::milliseconds timeout{0};
  double jitter = 0.2;  // clamped to [0, 1]; 0 gives the exact delays

  static retry_policy no_retry() { return retry_policy{1}; }
};

// Throw from a step to fail it at once, without further attempts.
class terminal_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A step failed for good (every attempt threw); also raised again on replay of
// a step whose failure was journaled. Catch it to continue the workflow.
class step_failed : public std::runtime_error {
 public:
  step_failed(std::string step, std::string type, const std::string& message)
      : std::runtime_error("step '" + step + "' failed: " + message),
        step_(std::move(step)),
        type_(std::move(type)),
        cause_(message) {}
  const std::string& step() const { return step_; }
  const std::string& type() const { return type_; }    // the exception type the step threw
  const std::string& cause() const { return cause_; }  // that exception's message

 private:
  std::string step_, type_, cause_;
};

// A tool call did not succeed: the host refused it (not granted by the run's
// policy, or arguments outside the grant), or the tool failed. Journaled like
// a result: on replay the same error is thrown again. Catch it to go on.
class tool_error : public std::runtime_error {
 public:
  tool_error(std::string tool, std::string type, const std::string& message)
      : std::runtime_error(message), tool_(std::move(tool)), type_(std::move(type)) {}
  const std::string& tool() const { return tool_; }
  // "refused", "timeout", "too_large", "bad_output", "unavailable", "failed",
  // or "settled" (recorded by `cairn settle --error`).
  const std::string& type() const { return type_; }

 private:
  std::string tool_, type_;
};

// The host cancelled the run (`cairn cancel`, or its run timeout passed).
// Thrown by every journaled ctx call from then on. The run ends as cancelled
// whatever the workflow does, even if it catches this and returns.
class cancelled_error : public std::runtime_error {
 public:
  explicit cancelled_error(std::string reason)
      : std::runtime_error("the run was cancelled: " + reason), reason_(std::move(reason)) {}
  const std::string& reason() const { return reason_; }  // as the host gave it

 private:
  std::string reason_;
};

// A started child run, as returned by ctx.start_child.
struct child_handle {
  std::string run_id;
};

// The host did not start a child run. Journaled: on replay the same error is
// thrown again.
class child_error : public std::runtime_error {
 public:
  child_error(std::string agent, std::string type, const std::string& message)
      : std::runtime_error(message), agent_(std::move(agent)), type_(std::move(type)) {}
  const std::string& agent() const { return agent_; }
  // "no_such_agent", or "refused" (the run's policy does not allow it).
  const std::string& type() const { return type_; }

 private:
  std::string agent_, type_;
};

// A joined child run failed or was cancelled. Journaled like its output.
class child_failed : public std::runtime_error {
 public:
  child_failed(std::string run_id, std::string type, const std::string& message)
      : std::runtime_error("child run '" + run_id + "' " + (type == "child_cancelled" ? "was cancelled" : "failed") +
                           ": " + message),
        run_id_(std::move(run_id)),
        type_(std::move(type)),
        cause_(message) {}
  const std::string& run_id() const { return run_id_; }
  const std::string& type() const { return type_; }    // "child_failed", "child_cancelled" or "refused"
  const std::string& cause() const { return cause_; }  // the child's error message

 private:
  std::string run_id_, type_, cause_;
};

class session;

// The workflow's view of its run. Every journaled call (step, tool, sleep,
// sleep_until, wait_signal, start_child, join, now, random) throws
// cancelled_error once the run is cancelled, also while it waits for a timer,
// signal or child. A cancel does not interrupt a running step or tool call:
// its outcome is journaled, the step makes no further attempt, and the next
// call throws.
class context {
 public:
  // Runs `fn` once and journals its result (anything convertible to json;
  // void gives null). On replay returns the journaled result and does not call
  // `fn`. Throws step_failed when the step's attempts are exhausted.
  // No journaled ctx call may be made inside `fn`.
  // `name` must be the same on every execution of the workflow: it is how
  // replay checks that the code still matches the journal.
  template <class F>
  json step(std::string_view name, F&& fn, retry_policy policy = {}) {
    return run_step(name, [&]() -> json {
      if constexpr (std::is_void_v<std::invoke_result_t<F&>>) {
        fn();
        return nullptr;
      } else {
        return json(fn());
      }
    }, policy);
  }

  // Asks the host to call tool `name` (granted by the run's policy) with
  // `args`. The host checks the policy, runs the tool outside the sandbox and
  // journals the result before returning it; on replay the journaled result
  // is returned and the tool is not called again. Throws tool_error.
  //   auto page = ctx.tool("http.fetch", {{"url", "https://example.com/"}});
  //   auto reply = ctx.tool("llm.chat", {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}});
  json tool(std::string_view name, const json& args = json::object());

  // Durable timers: the host journals the sleep and wakes the run when it is
  // due, even after a restart (it may suspend the run meanwhile). On replay a
  // journaled sleep returns at once. A sleep longer than 100 years sleeps 100
  // years (the run's limits.run_wall_seconds ends it long before).
  void sleep(std::chrono::milliseconds d);
  void sleep_until(std::chrono::system_clock::time_point t);

  // Waits until the signal `name` is sent to the run and returns its payload
  // (json null if it has none), or nullopt when `timeout` passed first. A
  // timeout of 100 years or more (milliseconds::max()) is no timeout.
  // Journaled: on replay the same outcome is returned at once.
  std::optional<json> wait_signal(std::string_view name,
                                  std::optional<std::chrono::milliseconds> timeout = std::nullopt);

  // Starts a run of agent `agent` with `input` as a child of this run and
  // returns without waiting for it. Throws child_error when the host refuses.
  // Journaled: on replay the same child is returned, not started again.
  child_handle start_child(std::string_view agent, const json& input = json::object());
  // Waits for the child run to end and returns its output; throws
  // child_failed when it failed or was cancelled. Journaled: on replay the
  // recorded output or error is returned at once.
  json join(const child_handle& child);

  // True once the host has cancelled the run. Checks the channel without
  // blocking, so a long computation can poll it and stop early.
  bool cancelled() const;

  // The wall clock, journaled: replay sees the time of the first execution.
  std::chrono::system_clock::time_point now();
  // A uniform number in [0, 1), journaled.
  double random();
  // Whether this run takes the branch of patch `id` (Temporal's `patched`):
  //   if (ctx.patched("fix-rounding")) { new code } else { old code }
  // True in a run that reaches this point with this code (a marker is
  // journaled, so its replays take the same branch), false in a run whose
  // journal was written by code that passed this point without it. Remove
  // the call only when no run that recorded it can replay again.
  bool patched(std::string_view id);
  // A live, non-durable event for whoever watches the run (progress, tokens).
  void emit(const json& data);

  const std::string& run_id() const;
  // The run's attempt, 1-based: each start of its sandbox counts, so 2 and up
  // after the sandbox crashed, a step timed out, or the run woke from a
  // suspension (a long sleep or wait) and was resumed from its journal.
  int attempt() const;
  // True while the workflow is being fast-forwarded through journaled steps.
  bool replaying() const;

  explicit context(session& s) : session_(s) {}

 private:
  json run_step(std::string_view name, const std::function<json()>& fn, const retry_policy& policy);
  session& session_;
};

using workflow = std::function<json(context& ctx, const json& input)>;

// Runs `fn` as a cairn agent on the channel the host gave it (fd 3). Returns
// the process exit code, as every SDK does: 0 after done, 1 after the
// workflow failed, 2 when not started by cairn or the host refused the agent
// before the run started, 3 when the host went away or broke the protocol
// after it (nothing more is sent: the run's fate is the host's to decide
// from its journal).
int main(int argc, char** argv, const workflow& fn);

// Same, on an explicit channel fd (for tests and embedding). Takes ownership of fd.
int run(int channel_fd, const workflow& fn);

}  // namespace cairn
