#include "engine/step_retry.hpp"

#include <algorithm>
#include <cmath>

namespace cairn::engine {

retry_decision decide_step_retry(const policy& p, const protocol::retry_request& asked, int failures_so_far,
                                 bool terminal, std::mt19937_64& rng) {
  const int failed_attempt = failures_so_far + 1;
  if (terminal || failed_attempt >= std::min(asked.max_attempts, p.retry.step_attempts)) return {};
  // In double, where the powers of a large multiplier saturate to infinity instead of overflowing.
  double ms = static_cast<double>(asked.initial_delay_ms) * std::pow(asked.multiplier, failed_attempt - 1);
  ms = std::min({ms, static_cast<double>(asked.max_delay_ms), static_cast<double>(protocol::max_duration_ms)});
  const double jitter = std::clamp(asked.jitter, 0.0, 1.0);
  ms *= 1.0 - jitter * std::uniform_real_distribution<double>(0.0, 1.0)(rng);
  return {true, ms > 0 ? static_cast<std::int64_t>(ms) : 0};
}

}  // namespace cairn::engine
