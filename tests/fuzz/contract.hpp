// What a fuzz target calls when the code under test breaks its contract: the
// message goes to stderr and the process aborts, so libFuzzer keeps the input
// as a crash (its artifact) and the run fails.
#pragma once

#include <cstdio>
#include <cstdlib>

namespace cairn::fuzz {

inline void require(bool holds, const char* contract) {
  if (holds) return;
  std::fprintf(stderr, "contract broken: %s\n", contract);
  std::abort();
}

}  // namespace cairn::fuzz
