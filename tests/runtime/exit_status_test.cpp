#include <signal.h>

#include <catch2/catch.hpp>

#include "runtime/sandbox.hpp"

namespace cairn::runtime {

TEST_CASE("exit_status describes exits and signals") {
  CHECK(exit_status{true, 3, 0}.describe() == "exited with code 3");
  CHECK(exit_status{true, 0, 0}.describe() == "exited with code 0");
  CHECK(exit_status{false, 0, SIGKILL}.describe() == "killed by signal 9 (SIGKILL)");
  CHECK(exit_status{false, 0, SIGABRT}.describe() == "killed by signal 6 (SIGABRT)");
}

}  // namespace cairn::runtime
