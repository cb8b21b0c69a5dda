// A test seam for the engine's time (engine/io.hpp's clock): while a
// fake_clock exists, the engine's clock and storage::now_ms() (the
// journal's wall time) move only when the test moves them.
#pragma once

#include <chrono>
#include <cstdint>

#include "engine/io.hpp"

namespace cairn::engine {

// A test seam: while one exists, clock::now() and storage::now_ms() read it
// (one at a time per process). It starts at the machine's times and moves
// only by advance(), from any thread.
class fake_clock {
 public:
  fake_clock();
  ~fake_clock();
  fake_clock(const fake_clock&) = delete;
  fake_clock& operator=(const fake_clock&) = delete;

  void advance(std::chrono::milliseconds by);
  std::int64_t wall_ms() const;  // what storage::now_ms() says now
};

}  // namespace cairn::engine
