// One attempt of a run: one sandbox, from handshake to done/fail, death,
// suspension or cancellation. Commits each step before acknowledging it.
// Private to the engine.
#pragma once

#include <string>

#include "engine/engine.hpp"
#include "engine/policy.hpp"

namespace cairn::engine {

struct attempt_result {
  enum class kind {
    completed,  // the agent sent done; `output` holds its result
    failed,     // the workflow failed, or broke the protocol: retrying won't help
    crashed,    // the sandbox died or hung without finishing: retry from the journal
    suspended,  // the agent waits longer than suspend_after: the sandbox is gone, see `wait`
    released,   // the host is shutting down: the sandbox is gone, the run goes back to the queue
    cancelled,  // `cairn cancel`: the agent stopped, or was killed after the grace period
    restart,    // the host ended a step (timeout, or out of attempts) and killed the sandbox: replay from the
                // journal; counted against the run's attempts like a crash
  };
  // failed with error type "limit_exceeded" when the sandbox ran into one of
  // the policy's limits (the same code would run into it again) or the run
  // outlived limits.run_wall_seconds, "timeout" when it outlived
  // timeouts.run_seconds.
  kind outcome = kind::crashed;
  json output;
  protocol::error_info error;
  storage::wait_spec wait;  // when suspended
};

attempt_result run_attempt(storage::journal& journal, runtime::sandbox_backend& backend,
                           const storage::run_record& run, const policy& p, int attempt,
                           const engine_options& options, run_observer& observer);

}  // namespace cairn::engine
