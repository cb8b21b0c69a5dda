#include <string.h>

#include "runtime/sandbox.hpp"

namespace cairn::runtime {

std::string exit_status::describe() const {
  if (exited) return "exited with code " + std::to_string(code);
  if (signal == 0) return "ended with an unknown status (it was reaped elsewhere)";
  const char* abbrev = ::sigabbrev_np(signal);
  return "killed by signal " + std::to_string(signal) +
         (abbrev ? " (SIG" + std::string(abbrev) + ")" : std::string());
}

}  // namespace cairn::runtime
