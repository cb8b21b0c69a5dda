// The host side of the boundary: a tool is something an agent may ask the host
// to do (fetch a URL, call an LLM, run a user's executable). The engine checks
// the run's policy, journals, and calls tool::call; a tool never touches the
// journal and never sees the sandbox.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace cairn::engine {

using json = nlohmann::json;

// The deepest a tool's result may nest (what a user tool prints, what a model
// replies): well under protocol::max_depth, so the frames and journal rows
// that carry the result stay within it.
inline constexpr std::size_t max_result_depth = 64;

// The shortest timeout a grant of a tool that reaches the network
// (http.fetch, llm.chat) may set: a call needs a name lookup and a
// connection at least, and one that cannot finish only churns.
inline constexpr std::chrono::milliseconds min_network_timeout{100};

// How a call may be repeated after a host crash. idempotent: re-run with the
// same idempotency key. at_most_once: a durable `started` record is written
// first; a crash before the result leaves the call in doubt, never repeated.
enum class idempotency { idempotent, at_most_once };
std::string_view to_string(idempotency i);

// A call failed or was refused. `type` is what the agent sees as the error
// type: "refused" (not granted, or the arguments break the grant's
// constraints), "timeout", "too_large", "bad_output", "unavailable" (the
// endpoint could not be reached), or "failed" (the tool ran and reported an
// error). The message says what happened and, where it can, what to change.
class tool_error : public std::runtime_error {
 public:
  tool_error(std::string type, const std::string& message) : std::runtime_error(message), type_(std::move(type)) {}
  const std::string& type() const { return type_; }

 private:
  std::string type_;
};

struct tool_call {
  std::string run_id;
  std::uint64_t seq = 0;
  std::string idempotency_key;  // "RUN_ID/SEQ": the same on every re-execution of this call
  json args;                    // as the agent sent it; not yet validated
  // Live, non-durable events for whoever watches the run (e.g. LLM tokens).
  // Never null.
  std::function<void(const json&)> emit = [](const json&) {};
};

class tool {
 public:
  virtual ~tool() = default;
  virtual const std::string& name() const = 0;
  // Decided before the call, from its arguments (e.g. GET is idempotent,
  // POST is not). Throws tool_error("refused") for arguments it cannot read.
  virtual idempotency kind(const json& args) const = 0;
  // Throws tool_error("refused") when the arguments break the grant, before
  // any side effect. Must not throw anything but tool_error for a failed
  // call; must return within the grant's time limit.
  virtual json call(const tool_call& call) = 0;
};

// A test seam for the deterministic simulator (tests/sim), whose agents call
// tools that must count their calls and never leave the process: while set,
// every tool_broker made in this process also grants the tools `make` gives
// it (by name, over the policy's). Unset (nullptr) unless a test sets it.
using test_tools = std::function<std::map<std::string, std::unique_ptr<tool>>()>;
void grant_test_tools(test_tools make);
const test_tools& granted_test_tools();

}  // namespace cairn::engine
