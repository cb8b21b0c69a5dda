// Which cgroups this process may make sandbox cgroups in, and the sweep of
// dead hosts' leftovers. See cgroup.hpp for the layout.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "runtime/cgroup.hpp"
#include "runtime/mountinfo.hpp"
#include "runtime/small_file.hpp"

namespace cairn::runtime {
namespace {

namespace fs = std::filesystem;

struct cgroup_mount {
  fs::path mount_point;
  std::string root;  // the part of the hierarchy mounted there, "/" unless in a cgroup namespace
  bool unified = false;
  std::set<std::string> controllers;  // v1: from the super options
};

std::set<std::string> split(const std::string& text, char separator) {
  std::set<std::string> parts;
  std::istringstream in(text);
  for (std::string part; std::getline(in, part, separator);)
    if (!part.empty()) parts.insert(part);
  return parts;
}

// "memory pids cpu\n" -> {"cpu", "memory", "pids"}
std::set<std::string> words(const std::string& text) {
  std::set<std::string> parts;
  std::istringstream in(text);
  for (std::string part; in >> part;) parts.insert(part);
  return parts;
}

std::vector<cgroup_mount> cgroup_mounts() {
  std::vector<cgroup_mount> mounts;
  for (const auto& entry : read_mountinfo()) {
    if (entry.fstype != "cgroup" && entry.fstype != "cgroup2") continue;
    cgroup_mount m{entry.mount_point, entry.root, entry.fstype == "cgroup2", {}};
    if (!m.unified) m.controllers = split(entry.super_options, ',');
    mounts.push_back(std::move(m));
  }
  return mounts;
}

// From /proc/self/cgroup: "4:memory:/process_api/x" -> {"memory", "/process_api/x"}
// for each controller; the unified hierarchy ("0::/x") under "".
std::map<std::string, std::string> own_cgroups() {
  std::map<std::string, std::string> own;
  std::istringstream lines(read_small_file("/proc/self/cgroup").value_or(""));
  for (std::string line; std::getline(lines, line);) {
    auto first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    std::string controllers = line.substr(first + 1, second - first - 1), path = line.substr(second + 1);
    if (controllers.empty()) own[""] = path;
    for (const auto& c : split(controllers, ',')) own[c] = path;
  }
  return own;
}

// Where this process's cgroup `path` of mount `m`'s hierarchy is.
std::optional<fs::path> own_folder(const cgroup_mount& m, const std::string& path) {
  if (m.root == "/") return m.mount_point / fs::path(path).relative_path();
  if (path == m.root) return m.mount_point;
  if (path.rfind(m.root + "/", 0) == 0) return m.mount_point / path.substr(m.root.size() + 1);
  return std::nullopt;  // our cgroup lies outside what is mounted
}

// Makes <own>/cairn, where sandbox cgroups may then be made; nullopt on
// success, else why not.
std::optional<std::string> make_parent(const fs::path& parent) {
  if (::mkdir(parent.c_str(), 0755) < 0 && errno != EEXIST)
    return fmt::format("cannot create {}: {}", parent.string(), std::strerror(errno));
  if (::access(parent.c_str(), W_OK | X_OK) < 0)
    return fmt::format("cannot create cgroups in {}: {}", parent.string(), std::strerror(errno));
  return std::nullopt;
}

// Where cairn's own processes go when its cgroup must give them up: a
// cgroup other than the root may hand controllers to children only while it
// holds no process itself (cgroup v2's "no internal processes" rule). A
// systemd service with Delegate=yes, `systemd-run --scope -p Delegate=yes`
// or a container starts cairn in the very cgroup it was given.
constexpr const char* host_leaf = "cairn-host";

// Moves every process of `folder` (cairn's, and whatever else runs in the
// cgroup it was given) into folder/cairn-host; nullopt on success, else why not.
std::optional<std::string> vacate(const fs::path& folder) {
  fs::path leaf = folder / host_leaf;
  if (::mkdir(leaf.c_str(), 0755) < 0 && errno != EEXIST)
    return fmt::format("cannot create {}: {}", leaf.string(), std::strerror(errno));
  // A process forked meanwhile lands beside its parent: go round again.
  for (int round = 0; round < 10; ++round) {
    auto pids = cgroup_members(folder);
    if (pids.empty()) return std::nullopt;
    for (pid_t pid : pids)
      if (!write_small_file(leaf / "cgroup.procs", std::to_string(pid)) && errno != ESRCH)
        return fmt::format("cannot move process {} out of {} into {}: {}", pid, folder.string(), leaf.string(),
                           std::strerror(errno));
  }
  return fmt::format("processes keep arriving in {}", folder.string());
}

cgroup_support try_v2(const std::vector<cgroup_mount>& mounts, const std::map<std::string, std::string>& own) {
  cgroup_support s;
  auto unified = std::find_if(mounts.begin(), mounts.end(), [](const auto& m) { return m.unified; });
  if (unified == mounts.end() || !own.count("")) {
    s.detail = "no cgroup v2 hierarchy is mounted";
    return s;
  }
  auto folder = own_folder(*unified, own.at(""));
  if (!folder) {
    s.detail = "this process's cgroup v2 is not visible under " + unified->mount_point.string();
    return s;
  }
  // Started from a cgroup an earlier cairn process vacated: the one given is above it.
  if (folder->filename() == host_leaf) folder = folder->parent_path();
  auto offered = words(read_small_file(*folder / "cgroup.controllers").value_or(""));
  if (!offered.count("memory") || !offered.count("pids")) {
    s.detail = fmt::format("cgroup v2 ({}) offers no memory and pids controllers to this process",
                           folder->string());
    return s;
  }
  // cpu.stat counts usage without the cpu controller; it is enabled when offered.
  std::string wanted = offered.count("cpu") ? "+memory +pids +cpu" : "+memory +pids";
  auto enabled = words(read_small_file(*folder / "cgroup.subtree_control").value_or(""));
  if (!enabled.count("memory") || !enabled.count("pids")) {
    bool on = write_small_file(*folder / "cgroup.subtree_control", wanted);
    if (!on && errno == EBUSY) {  // it holds processes
      if (auto why = vacate(*folder)) {
        s.detail = *why;
        return s;
      }
      on = write_small_file(*folder / "cgroup.subtree_control", wanted);
    }
    if (!on) {
      s.detail = fmt::format("cannot enable the memory and pids controllers in {}: {}",
                             (*folder / "cgroup.subtree_control").string(), std::strerror(errno));
      return s;
    }
  }
  fs::path parent = *folder / "cairn";
  if (auto why = make_parent(parent)) {
    s.detail = *why;
    return s;
  }
  if (!write_small_file(parent / "cgroup.subtree_control", wanted)) {
    s.detail = fmt::format("cannot enable controllers in {}: {}", (parent / "cgroup.subtree_control").string(),
                           std::strerror(errno));
    return s;
  }
  s.mode = cgroup_mode::v2;
  s.parents = {parent};
  s.detail = "cgroup v2: memory, pids, cpu";
  return s;
}

cgroup_support try_v1(const std::vector<cgroup_mount>& mounts, const std::map<std::string, std::string>& own) {
  cgroup_support s;
  for (const char* controller : {"memory", "pids", "cpuacct"}) {
    auto m = std::find_if(mounts.begin(), mounts.end(),
                          [&](const auto& m) { return !m.unified && m.controllers.count(controller); });
    if (m == mounts.end() || !own.count(controller)) {
      s.detail = fmt::format("no cgroup v1 {} hierarchy is mounted", controller);
      s.parents.clear();
      return s;
    }
    auto folder = own_folder(*m, own.at(controller));
    if (!folder) {
      s.detail = fmt::format("this process's {} cgroup is not visible under {}", controller,
                             m->mount_point.string());
      s.parents.clear();
      return s;
    }
    if (auto why = make_parent(*folder / "cairn")) {
      s.detail = *why;
      s.parents.clear();
      return s;
    }
    s.parents.push_back(*folder / "cairn");
  }
  s.mode = cgroup_mode::v1;
  s.detail = "cgroup v1: memory, pids, cpuacct";
  return s;
}

cgroup_support detect() {
  auto mounts = cgroup_mounts();
  auto own = own_cgroups();
  cgroup_support v2 = try_v2(mounts, own);
  if (v2.mode != cgroup_mode::none) return v2;
  cgroup_support v1 = try_v1(mounts, own);
  if (v1.mode != cgroup_mode::none) return v1;
  cgroup_support none;
  none.detail = fmt::format("none: totals are per process only (rlimits); {}; {}", v2.detail, v1.detail);
  // systemd delegates a subtree on request; without it (sd_booted()'s test) root makes one by hand.
  const bool systemd = fs::is_directory("/run/systemd/system");
  none.fix = fmt::format(
      "run cairn as root on a machine with the cgroup v1 memory, pids and cpuacct hierarchies, or give it a "
      "cgroup v2 subtree with the memory and pids controllers delegated ({}): cairn moves its own processes into a "
      "child cgroup, cairn-host, and makes the sandboxes' beside it",
      systemd ? "a systemd service with Delegate=yes, or `systemd-run --user --scope -p Delegate=yes cairn serve`"
              : "this machine runs no systemd: as root, make a folder in the cgroup v2 tree whose parent's "
                "cgroup.subtree_control lists memory and pids, chown the folder, its cgroup.procs and "
                "cgroup.subtree_control to this user, and start cairn from a shell whose pid was written to its "
                "cgroup.procs");
  return none;
}

}  // namespace

const cgroup_support& detect_cgroups() {
  static const cgroup_support support = detect();
  return support;
}

std::size_t sweep_orphaned_cgroups(const cgroup_support& support) {
  std::size_t removed = 0;
  for (const auto& parent : support.parents) {
    std::error_code ec;
    for (fs::directory_iterator it(parent, ec), end; !ec && it != end; it.increment(ec)) {
      if (!it->is_directory(ec)) continue;
      unique_fd folder(::open(it->path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      // Held: a live host's sandbox.
      if (!folder || ::flock(folder.get(), LOCK_EX | LOCK_NB) < 0) continue;
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      if (empty_and_remove_cgroup(it->path(), deadline)) ++removed;
    }
  }
  return removed;
}

}  // namespace cairn::runtime
