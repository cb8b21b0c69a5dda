// An agent built for protocol v1: says hello with "v":1, prints the host's
// answer to its log, and exits 0 only if that answer was a reject.
#include <cstdio>

#include "tests/host/wire.hpp"

using namespace cairn::hostile;

int main() {
  const json answer = handshake(1);
  std::printf("%s\n", answer.dump().c_str());
  return answer.value("t", "") == "reject" ? 0 : 1;
}
