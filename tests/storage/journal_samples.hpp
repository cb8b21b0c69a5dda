// Samples for the storage tests: a run, a step, and the storage_error a call throws.
#pragma once

#include <optional>
#include <string>

#include "storage/journal.hpp"

namespace cairn::storage::samples {

template <class F>
std::optional<storage_error> error_from(F&& f) {
  try {
    f();
  } catch (const storage_error& e) {
    return e;
  }
  return std::nullopt;
}

inline new_run a_run(const std::string& id, json input = {{"question", "why"}}) {
  new_run r;
  r.id = id;
  r.agent = "/opt/agents/researcher";
  r.input = std::move(input);
  r.max_attempts = 4;
  r.sandbox = "none";
  r.workspace = "/tmp/ws-" + id;
  return r;
}

inline step_record ok_step(const std::string& run, std::uint64_t seq, json output) {
  step_record s;
  s.run_id = run;
  s.result.seq = seq;
  s.result.name = "step-" + std::to_string(seq);
  s.result.ok = true;
  s.result.output = std::move(output);
  s.result.attempt = 1;
  s.result.duration_us = 1234 + static_cast<std::int64_t>(seq);
  s.started_at_ms = 1'700'000'000'000 + static_cast<std::int64_t>(seq);
  s.finished_at_ms = s.started_at_ms + 2;
  return s;
}

}  // namespace cairn::storage::samples
