#include "runtime/process_tree.hpp"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "runtime/small_file.hpp"

namespace cairn::runtime {
namespace {

struct proc_entry {
  pid_t parent = 0;
  std::uint64_t ticks = 0;  // utime + stime + cutime + cstime
};

// Fields 4 (ppid) and 14-17 (utime, stime, cutime, cstime) of /proc/PID/stat.
std::optional<proc_entry> read_entry(const char* pid) {
  auto stat = read_small_file(std::string("/proc/") + pid + "/stat");
  if (!stat) return std::nullopt;
  auto close = stat->rfind(')');  // comm may hold anything
  if (close == std::string::npos) return std::nullopt;
  proc_entry e;
  const char* p = stat->c_str() + close + 1;
  char* end = nullptr;
  for (int field = 3; field <= 17 && *p; ++field) {
    while (*p == ' ') ++p;
    if (field == 3) {
      ++p;  // the state, one letter
      continue;
    }
    unsigned long long value = std::strtoull(p, &end, 10);
    if (end == p) return std::nullopt;
    p = end;
    if (field == 4) e.parent = static_cast<pid_t>(value);
    if (field >= 14) e.ticks += value;
  }
  return e;
}

}  // namespace

std::vector<std::chrono::nanoseconds> tree_cpu_times(const std::vector<pid_t>& roots) {
  std::vector<std::chrono::nanoseconds> out(roots.size(), std::chrono::nanoseconds(0));
  if (roots.empty()) return out;
  std::multimap<pid_t, pid_t> children;
  std::map<pid_t, std::uint64_t> ticks;
  DIR* proc = ::opendir("/proc");
  if (!proc) return out;
  std::unique_ptr<DIR, int (*)(DIR*)> guard(proc, ::closedir);
  while (dirent* entry = ::readdir(proc)) {
    if (entry->d_name[0] < '1' || entry->d_name[0] > '9') continue;
    auto e = read_entry(entry->d_name);
    if (!e) continue;  // gone meanwhile
    const auto pid = static_cast<pid_t>(std::atol(entry->d_name));
    children.emplace(e->parent, pid);
    ticks[pid] = e->ticks;
  }
  const auto tick = std::chrono::nanoseconds(1'000'000'000 / std::max(1L, ::sysconf(_SC_CLK_TCK)));
  for (std::size_t i = 0; i < roots.size(); ++i) {
    std::uint64_t total = 0;
    std::vector<pid_t> left = {roots[i]};
    // Each pid once: read at different moments, parents may seem to form a loop.
    std::set<pid_t> seen;
    while (!left.empty()) {
      const pid_t pid = left.back();
      left.pop_back();
      if (!seen.insert(pid).second) continue;
      if (auto t = ticks.find(pid); t != ticks.end()) total += t->second;
      for (auto [c, end] = children.equal_range(pid); c != end; ++c) left.push_back(c->second);
    }
    out[i] = tick * static_cast<std::int64_t>(total);
  }
  return out;
}

}  // namespace cairn::runtime
