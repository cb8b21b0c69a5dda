// Protocol v2 messages as typed values, and their strict JSON mapping.
// protocol/PROTOCOL.md is the specification; this file implements it. Parsing
// checks every field's presence and type and names the first one that is wrong.
// Fields a receiver does not know are ignored, so later minor additions stay
// compatible.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "protocol/frame.hpp"

namespace cairn::protocol {

inline constexpr int version = 2;

// Longest step name accepted, in bytes.
inline constexpr std::size_t max_name_size = 1024;
// The longest duration on the wire (a sleep, a timeout, a retry delay), in ms:
// 100 years. Anything longer is a violation, so host arithmetic on now + a
// duration never overflows; an SDK maps longer waits to this or to "none".
constexpr std::int64_t max_duration_ms = 100ll * 365 * 24 * 3600 * 1000;

// How deep a value may nest where the host places it, so that every frame
// carrying it, replayed history included, stays within max_depth (frame.hpp):
// a run's input sits one level down in `start`, a step's output three (in
// history.steps[i].output).
inline constexpr std::size_t max_input_depth = max_depth - 1;
inline constexpr std::size_t max_output_depth = max_depth - 3;

// step, now, random: recorded by the agent (begin/step). patch: a marker the
// agent records with a step alone (ctx.patched; output true, no begin).
// tool, sleep, signal, child, join: recorded only by the host, for the
// agent's tool, sleep, wait, child and join requests; a begin or step of
// those kinds is a violation.
enum class step_kind { step, now, random, patch, tool, sleep, signal, child, join };
std::string_view to_string(step_kind kind);
// The kind `name` names ("tool"), as to_string writes it; nullopt for any
// other text. The one reader of kinds, for the wire and the journal alike.
std::optional<step_kind> parse_step_kind(std::string_view name);
// True for the kinds only the host records: tool, sleep, signal, child, join.
// The others the agent records, with `step` (and `begin`, but for patch).
bool host_recorded(step_kind kind);

struct error_info {
  std::string message;
  std::string type = "error";  // "error", "nondeterminism", or an exception class name
};

// A step's final, journaled outcome. Sent by the agent in `step`, returned in
// `history` chunks on replay.
struct step_result {
  std::uint64_t seq = 0;
  std::string name;
  step_kind kind = step_kind::step;
  bool ok = true;
  json output;       // when ok
  error_info error;  // when !ok
  int attempt = 1;
  std::int64_t duration_us = 0;
};

// Agent -> host.
struct hello_msg {
  int version = protocol::version;
  std::string sdk;
};
// How the agent asks a failed step to be retried: after attempt n fails,
// wait min(initial_delay_ms * multiplier^(n-1), max_delay_ms), scaled by a
// random factor in [1 - jitter, 1], then make attempt n+1, up to max_attempts
// in all. The host decides (and may grant fewer attempts); the default asks for none.
struct retry_request {
  int max_attempts = 1;
  std::int64_t initial_delay_ms = 100;
  double multiplier = 2.0;  // 0 to 1000
  std::int64_t max_delay_ms = 10'000;
  double jitter = 0.2;  // 0 to 1
};
struct begin_msg {
  std::uint64_t seq = 0;
  std::string name;
  step_kind kind = step_kind::step;
  int attempt = 1;
  std::int64_t timeout_ms = 0;  // per attempt; 0: none given, the host applies the policy's default
  retry_request retry;
};
// The outcome of one attempt. A failure (result.ok false) is final only if
// the host answers ack; it answers retry when another attempt is to be made.
struct step_msg {
  step_result result;
  bool terminal = false;  // a failure no further attempt can fix (cairn::terminal_error)
};
// Asks for the journaled steps from seq `from` on (replay, PROTOCOL.md §4).
struct history_msg {
  std::uint64_t from = 0;
};
// Asks the host to call a tool granted by the run's policy. The host answers
// with `result` for the same seq once the outcome is journaled.
struct tool_msg {
  std::uint64_t seq = 0;
  std::string name;
  json args;
};
// Requests the host answers with `result` for the same seq once journaled,
// like tool_msg. After it has sent cancel the host answers none of these.
// A durable timer: exactly one of duration_ms and until_ms (ms since the Unix epoch).
struct sleep_msg {
  std::uint64_t seq = 0;
  std::optional<std::int64_t> duration_ms;
  std::optional<std::int64_t> until_ms;
};
// Waits for the signal `signal` sent to the run, at most timeout_ms if given.
struct wait_msg {
  std::uint64_t seq = 0;
  std::string signal;
  std::optional<std::int64_t> timeout_ms;
};
// Starts a child run of agent `agent`; the result's output is {"run_id": ...}.
struct child_msg {
  std::uint64_t seq = 0;
  std::string agent;
  json input;
};
// Waits for the child run `run_id` to end; the result is its output or error.
struct join_msg {
  std::uint64_t seq = 0;
  std::string run_id;
};
struct emit_msg {
  json data;
};
struct done_msg {
  json output;
};
struct fail_msg {
  error_info error;
};
using agent_message = std::variant<hello_msg, begin_msg, step_msg, history_msg, tool_msg, sleep_msg, wait_msg,
                                   child_msg, join_msg, emit_msg, done_msg, fail_msg>;

// Host -> agent.
struct start_msg {
  int version = protocol::version;
  std::string run_id;
  json input;
  int attempt = 1;  // the run's attempt, 1-based
  std::uint64_t history_steps = 0;  // journaled steps, pulled with history_msg
  int next_step_attempt = 1;  // attempt number for the first step past the history
  std::string host;           // "cairn/VERSION" of the host ("" from a host before 0.1.0 said it)
};
struct ack_msg {
  std::uint64_t seq = 0;
  // The host executes no other attempt now: the agent's polling for its
  // next answer takes the CPU of none of this host's runs (PROTOCOL.md §3.3).
  bool alone = false;
};
// Journaled steps `from`, `from`+1, ... in order: at least one.
struct history_chunk {
  std::uint64_t from = 0;
  std::vector<step_result> steps;
};
// The failed attempt of step `seq` is retried: attempt `attempt` starts after delay_ms.
struct retry_msg {
  std::uint64_t seq = 0;
  int attempt = 2;
  std::int64_t delay_ms = 0;
};
struct reject_msg {
  std::string error;
};
// The journaled outcome of a tool, sleep, wait, child or join request:
// result.kind is tool, sleep, signal, child or join; an error's type says why
// (refused, timeout, failed, no_such_agent, child_failed, ...).
struct result_msg {
  step_result result;
};
// Unsolicited: the run was cancelled or its run timeout passed.
struct cancel_msg {
  std::string reason;
};
using host_message = std::variant<start_msg, ack_msg, reject_msg, result_msg, cancel_msg, history_chunk, retry_msg>;

// Throw protocol_error naming the offending field or type.
agent_message parse_agent_message(const json& j);
host_message parse_host_message(const json& j);

json to_json(const agent_message& m);
json to_json(const host_message& m);
json to_json(const step_result& r);
step_result parse_step_result(const json& j);

// The value of "t" for a message, for logs and errors.
std::string_view type_name(const agent_message& m);

}  // namespace cairn::protocol
