// A user tool: a host executable declared in the run's policy. The call's
// arguments go to its stdin as one JSON value; it prints its result as one
// JSON value on stdout (at most max_result_depth levels deep) and exits 0. It runs on the
// host, outside the sandbox, with a clean environment:
//   PATH=/usr/local/bin:/usr/bin:/bin, LANG=C.UTF-8, HOME (the host's),
//   the host variables its grant names in `env` (that is how a credential
//   reaches it; the host's CAIRN_LLM_API_KEY does not, unless named),
//   CAIRN_RUN_ID, CAIRN_TOOL_SEQ, CAIRN_IDEMPOTENCY_KEY ("RUN_ID/SEQ").
// It gets no descriptor of the host's but stdin, stdout and stderr. A non-zero
// exit fails the call with the end of its stderr; a timeout or oversized
// output kills its whole process group.
#pragma once

#include <chrono>
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/tools/tool.hpp"

namespace cairn::engine {

struct command_tool_options {
  std::string name;
  std::vector<std::string> command;          // argv; command[0] absolute
  std::map<std::string, std::string> input;  // declared arguments, see policy.hpp
  std::chrono::milliseconds timeout{30'000};
  idempotency kind = idempotency::at_most_once;
  std::size_t max_output_bytes = 1 << 20;
  std::vector<std::string> env;  // host variables passed on, by name
};

std::unique_ptr<tool> make_command_tool(command_tool_options options);

}  // namespace cairn::engine
