// Whether a failed step attempt is retried, and after how long: decided by
// the host alone from the run's policy and what the agent asked for in its
// begin (PROTOCOL.md §2.1). The agent only reports that an attempt failed.
#pragma once

#include <cstdint>
#include <random>

#include "engine/policy.hpp"
#include "protocol/messages.hpp"

namespace cairn::engine {

struct retry_decision {
  bool retry = false;
  std::int64_t delay_ms = 0;  // when retry: 0 to protocol::max_duration_ms
};

// The attempt that failed is failures_so_far + 1. It is retried when it is
// not terminal and below both the agent's max_attempts and the policy's
// retry.step_attempts: the agent may ask for fewer attempts than the policy
// grants, never more. The delay is the agent's backoff for that attempt,
// jittered with `rng`.
retry_decision decide_step_retry(const policy& p, const protocol::retry_request& asked, int failures_so_far,
                                 bool terminal, std::mt19937_64& rng);

}  // namespace cairn::engine
