#include "engine/owner.hpp"

#include <unistd.h>

#include <fstream>
#include <limits>
#include <sstream>

namespace cairn::engine {
namespace {

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// Field 22 of /proc/PID/stat, counted after the ")" that ends the command
// name (which may itself contain spaces and parentheses). A zombie counts as
// gone: it holds its pid but will never write again.
std::optional<unsigned long long> start_ticks_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto close = stat.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  if (!(fields >> field) || field == "Z" || field == "X") return std::nullopt;
  for (int i = 4; i <= 22; ++i) {
    if (!(fields >> field)) return std::nullopt;
  }
  return std::stoull(field);
}

std::string hostname() {
  char buf[256] = {};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

}  // namespace

std::string owner_id::str() const {
  if (boot_id.empty()) return hostname + ":" + std::to_string(pid);
  return hostname + ":" + boot_id + ":" + std::to_string(pid) + ":" + std::to_string(start_ticks);
}

std::optional<owner_id> owner_id::parse(std::string_view s) {
  owner_id o;
  auto take = [&s](std::string& out) {
    auto colon = s.find(':');
    if (colon == std::string_view::npos) return false;
    out = std::string(s.substr(0, colon));
    s.remove_prefix(colon + 1);
    return true;
  };
  auto number = [](std::string_view digits) -> std::optional<unsigned long long> {
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string_view::npos) return std::nullopt;
    try {
      return std::stoull(std::string(digits));
    } catch (const std::out_of_range&) {
      return std::nullopt;
    }
  };
  if (!take(o.hostname)) return std::nullopt;
  std::optional<unsigned long long> pid;
  if (s.find(':') == std::string_view::npos) {
    pid = number(s);  // the older "HOSTNAME:PID"
  } else {
    std::string digits;
    if (!take(o.boot_id) || o.boot_id.empty() || !take(digits)) return std::nullopt;
    pid = number(digits);
    auto ticks = number(s);
    if (!ticks) return std::nullopt;
    o.start_ticks = *ticks;
  }
  if (!pid || *pid == 0 || *pid > static_cast<unsigned long long>(std::numeric_limits<pid_t>::max()))
    return std::nullopt;
  o.pid = static_cast<pid_t>(*pid);
  return o;
}

const owner_id& current_owner() {
  static const owner_id me = [] {
    owner_id o;
    o.hostname = hostname();
    o.boot_id = read_first_line("/proc/sys/kernel/random/boot_id");
    o.pid = getpid();
    o.start_ticks = start_ticks_of(o.pid).value_or(0);
    return o;
  }();
  return me;
}

owner_state check_owner(std::string_view owner) {
  auto o = owner_id::parse(owner);
  if (!o) return owner_state::unknown;
  const auto& me = current_owner();
  if (o->hostname != me.hostname) return owner_state::unknown;
  auto ticks = start_ticks_of(o->pid);
  if (o->boot_id.empty()) return ticks ? owner_state::alive : owner_state::dead;
  if (o->boot_id != me.boot_id) return owner_state::dead;
  return ticks && *ticks == o->start_ticks ? owner_state::alive : owner_state::dead;
}

std::string describe_owner(std::string_view owner) {
  auto o = owner_id::parse(owner);
  if (!o) return "'" + std::string(owner) + "'";
  return "pid " + std::to_string(o->pid) + " on " + o->hostname;
}

}  // namespace cairn::engine
