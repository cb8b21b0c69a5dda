#include "engine/owner.hpp"

#include <unistd.h>

#include <fstream>
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
  std::string pid;
  if (!take(o.hostname) || !take(o.boot_id) || !take(pid) || s.empty()) return std::nullopt;
  try {
    o.pid = static_cast<pid_t>(std::stol(pid));
    o.start_ticks = std::stoull(std::string(s));
  } catch (const std::exception&) {
    return std::nullopt;
  }
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
  if (o->boot_id != me.boot_id) return owner_state::dead;
  auto ticks = start_ticks_of(o->pid);
  return ticks && *ticks == o->start_ticks ? owner_state::alive : owner_state::dead;
}

std::string describe_owner(std::string_view owner) {
  auto o = owner_id::parse(owner);
  if (!o) return "'" + std::string(owner) + "'";
  return "pid " + std::to_string(o->pid) + " on " + o->hostname;
}

}  // namespace cairn::engine
