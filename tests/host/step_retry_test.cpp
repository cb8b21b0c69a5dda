// The host's one decision on a failed step attempt (engine/step_retry.hpp):
// what an agent asks for bounds nothing the policy does not grant.
#include <catch2/catch.hpp>

#include "engine/step_retry.hpp"

using namespace cairn;

TEST_CASE("decide_step_retry: the fewer of the agent's and the policy's attempts, never for a terminal error") {
  std::mt19937_64 rng{1};
  auto p = engine::default_policy();
  p.retry.step_attempts = 3;
  protocol::retry_request asked;
  asked.max_attempts = 50;
  CHECK(engine::decide_step_retry(p, asked, 0, false, rng).retry);
  CHECK(engine::decide_step_retry(p, asked, 1, false, rng).retry);
  CHECK_FALSE(engine::decide_step_retry(p, asked, 2, false, rng).retry);  // attempt 3 of 3 failed
  CHECK_FALSE(engine::decide_step_retry(p, asked, 0, true, rng).retry);
  asked.max_attempts = 2;
  CHECK(engine::decide_step_retry(p, asked, 0, false, rng).retry);
  CHECK_FALSE(engine::decide_step_retry(p, asked, 1, false, rng).retry);
  CHECK_FALSE(engine::decide_step_retry(p, protocol::retry_request{}, 0, false, rng).retry);  // asked for none
}

TEST_CASE("decide_step_retry: the agent's backoff, jittered by the host, saturating at its maximum") {
  std::mt19937_64 rng{1};
  auto p = engine::default_policy();
  p.retry.step_attempts = 1000;
  protocol::retry_request asked{1000, 100, 2.0, 10'000, 0.0};
  CHECK(engine::decide_step_retry(p, asked, 0, false, rng).delay_ms == 100);
  CHECK(engine::decide_step_retry(p, asked, 2, false, rng).delay_ms == 400);
  CHECK(engine::decide_step_retry(p, asked, 900, false, rng).delay_ms == 10'000);
  asked.multiplier = 1000;
  asked.max_delay_ms = protocol::max_duration_ms;
  CHECK(engine::decide_step_retry(p, asked, 900, false, rng).delay_ms == protocol::max_duration_ms);
  asked = {1000, 0, 1000, protocol::max_duration_ms, 0.0};  // 0 x infinity
  CHECK(engine::decide_step_retry(p, asked, 900, false, rng).delay_ms == 0);
  asked = {1000, 1000, 1.0, 10'000, 0.5};
  for (int i = 0; i < 100; ++i) {
    auto delay = engine::decide_step_retry(p, asked, 0, false, rng).delay_ms;
    CHECK(delay >= 500);
    CHECK(delay <= 1000);
  }
}
