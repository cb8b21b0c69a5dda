#include "runtime/crash_point.hpp"

#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <string>

namespace cairn::runtime {
namespace {

struct armed_point {
  std::string name;
  long remaining = 0;
};

armed_point read_armed() {
  armed_point p;
  const char* spec = std::getenv("CAIRN_CRASH_POINT");
  if (!spec) return p;
  std::string s(spec);
  auto colon = s.find(':');
  p.name = s.substr(0, colon);
  p.remaining = colon == std::string::npos ? 1 : std::strtol(s.c_str() + colon + 1, nullptr, 10);
  return p;
}

// Read once per process: a test forks a host after its parent has passed
// crash points of its own, and arms only the child.
armed_point& armed() {
  static armed_point point;
  static pid_t read_by = 0;
  if (read_by != ::getpid()) {
    point = read_armed();
    read_by = ::getpid();
  }
  return point;
}

}  // namespace

void crash_point(std::string_view name) {
  auto& p = armed();
  if (p.remaining <= 0 || p.name != name) return;
  if (--p.remaining == 0) std::raise(SIGKILL);
}

}  // namespace cairn::runtime
