// What a run may do: the tools it may call and within what constraints, the
// limits of its sandbox, and its network. Given as a JSON file with `cairn run
// --policy FILE` (the format is in README.md, "Policy"); stored with the run,
// normalized with every default filled in, so a resumed run is held to the
// same policy. Without a file a run gets default_policy(): no tools, no
// network, the default limits.
#pragma once

#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/tools/http_fetch.hpp"
#include "engine/tools/llm_chat.hpp"
#include "engine/tools/tool.hpp"
#include "runtime/sandbox.hpp"

namespace cairn::engine {

// A policy was rejected before anything ran. key() is the path of the
// offending key, e.g. "limits.memory_mb" or "tools.send_email.command".
class policy_error : public std::runtime_error {
 public:
  policy_error(std::string key, const std::string& message)
      : std::runtime_error(key.empty() ? message : key + ": " + message), key_(std::move(key)) {}
  // The same error, found in `file`.
  policy_error(const policy_error& e, const std::filesystem::path& file)
      : std::runtime_error("policy file " + file.string() + ": " + e.what()), key_(e.key_) {}
  const std::string& key() const { return key_; }

 private:
  std::string key_;
};

// A user tool: a host executable that reads the call's arguments as JSON on
// stdin and writes its result as JSON on stdout (see tools/command_tool.hpp).
struct command_tool_spec {
  std::vector<std::string> command;  // argv; command[0] an absolute path (see load_policy_file)
  // The declared input: argument name -> "string", "number", "integer",
  // "boolean", "object", "array" or "any"; a name ending in "?" is optional.
  // A call with any other argument, or a wrong type, is refused.
  std::map<std::string, std::string> input;
  std::chrono::milliseconds timeout{30'000};
  idempotency kind = idempotency::at_most_once;
  std::size_t max_output_bytes = 1 << 20;
  // Host environment variables the tool gets (see tools/command_tool.hpp).
  std::vector<std::string> env;
};

// How long a run and its steps may take ("timeouts" in the policy file).
struct timeouts {
  std::chrono::seconds run{0};             // from the run's creation to its end, waits included; 0: none
  std::chrono::seconds step{0};            // per step attempt, unless the step sets its own; 0: none
  std::chrono::seconds cancel_grace{10};   // after a cancel, for the agent to stop by itself
};

// The backoff between attempts of a run whose sandbox crashed ("retry"):
// attempt n+1 starts min(initial * multiplier^(n-1), max) later, scaled by a
// uniform factor in [1 - jitter, 1] so that runs which crashed together do
// not retry together.
struct run_retry {
  std::chrono::milliseconds initial{200};
  double multiplier = 2.0;
  std::chrono::milliseconds max{10'000};
  double jitter = 0.2;
  // The most attempts of one step, counted by the host: an agent may ask for
  // fewer (begin.max_attempts), never more.
  int step_attempts = 10;

  std::chrono::milliseconds delay_after(int crashes) const;
};

// Child runs ("children"): how many a run tree may hold, how deep, and which
// programs. A child agent is named by its file name in the parent agent's
// folder, or by a path listed in `agents`. Children carry the root's policy,
// so the root's bounds hold for the whole tree.
struct child_grant {
  std::uint64_t max = 100;     // child runs in the whole tree, the root's descendants at every depth
  std::uint64_t max_depth = 4; // the root is depth 0, its children depth 1
  std::vector<std::string> agents;  // absolute paths (see load_policy_file)
};

// What a run may make the host store, beside its sandbox's limits ("limits"
// in the policy file: journal_mb, step_output_mb, signal_kb, signals, checkpoint_mb).
struct journal_limits {
  std::uint64_t journal_bytes = 256ull << 20;     // its steps, tool calls and events in the journal
  std::uint64_t step_output_bytes = 4ull << 20;   // one step's output or tool result, as JSON text
  std::uint64_t signal_bytes = 64ull << 10;       // one signal's payload, as JSON text
  std::uint64_t signals = 1000;                   // signals it holds, queued and delivered
  // Pieces of its workspace files its checkpoints stored, compressed
  // (workspace_checkpoints.hpp); 0: the run keeps no checkpoints.
  std::uint64_t checkpoint_bytes = 1ull << 30;
};

struct policy {
  std::string network = "none";
  runtime::resource_limits limits;
  journal_limits journal;
  std::chrono::seconds wall_time{3600};  // per attempt; 0: unlimited
  // From the run's creation to its end, across every attempt and suspension
  // (limits.run_wall_seconds); then it fails with type limit_exceeded. 0: unlimited.
  std::chrono::seconds run_wall_time{86'400};
  // limits.suspensions_per_hour: how often a run may give up its sandbox to
  // wait; one more within an hour ends it (limit_exceeded).
  std::uint64_t suspensions_per_hour = 60;
  struct timeouts timeouts;
  run_retry retry;
  child_grant children;
  std::optional<http_fetch_grant> http_fetch;
  std::optional<llm_chat_grant> llm_chat;
  std::map<std::string, command_tool_spec> commands;

  bool grants(const std::string& tool) const;
  std::vector<std::string> tool_names() const;
  // How long a run may live from its creation: the smaller of timeouts.run
  // and run_wall_time that is set; 0: no bound. The run's deadline.
  std::chrono::seconds run_bound() const;
  // Why a run ends when its deadline passes: {message, type}, type "timeout"
  // (timeouts.run_seconds) or "limit_exceeded" (limits.run_wall_seconds).
  std::pair<std::string, std::string> deadline_passed() const;
};

policy default_policy();
// Strict: an unknown key, a wrong type or an impossible value is a
// policy_error naming the key.
policy parse_policy(const json& j);
// parse_policy of a file; errors name the file too. A user tool's program
// given as a relative path with a folder ("tools/send_email.sh") is taken
// relative to the policy file.
policy load_policy_file(const std::filesystem::path& file);
// Normalized: every field present, parse_policy(to_json(p)) == p.
json to_json(const policy& p);

}  // namespace cairn::engine
