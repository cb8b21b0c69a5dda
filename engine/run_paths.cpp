#include "engine/run_paths.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include "engine/engine.hpp"
#include "runtime/no_follow.hpp"

namespace cairn::engine {
namespace {

namespace fs = std::filesystem;

// Whether `inner` is `outer` or lies below it (both absolute and normal).
bool within(const fs::path& inner, const fs::path& outer) {
  auto rel = inner.lexically_relative(outer);
  return !rel.empty() && *rel.begin() != "..";
}

// Under root the sandbox uid must pass through (search, never list).
void open_folder(const fs::path& path, bool passable) {
  const bool root = ::geteuid() == 0;
  auto fd = runtime::open_folder_no_follow(path, root && passable ? 0711 : 0700);
  struct stat st {};
  if (root && passable && ::fstat(fd.get(), &st) == 0 && (st.st_mode & 011) != 011)
    ::fchmod(fd.get(), (st.st_mode & 07777) | 011);
}

}  // namespace

fs::path default_workspace(const fs::path& home, const std::string& run_id) { return home / "workspaces" / run_id; }

fs::path workspace_image(const fs::path& home, const std::string& run_id) {
  return home / "images" / (run_id + ".img");
}

fs::path run_log(const fs::path& home, const std::string& run_id) { return home / "logs" / (run_id + ".log"); }

void make_home_folders(const fs::path& home) {
  open_folder(home, true);
  open_folder(home / "workspaces", true);
  open_folder(home / "images", false);
  open_folder(home / "logs", false);
}

fs::path checked_workspace(storage::journal& journal, const fs::path& home, const fs::path& given,
                           const std::string& run_id) {
  const fs::path own = default_workspace(home, run_id);
  if (given.empty()) return own;
  std::error_code ec;
  fs::path workspace = fs::weakly_canonical(fs::absolute(given), ec).lexically_normal();
  if (ec) throw engine_error(errc::bad_request, fmt::format("--workspace {}: {}", given.string(), ec.message()));
  if (workspace.has_filename() == false) workspace = workspace.parent_path();
  fs::path real_home = fs::weakly_canonical(home, ec).lexically_normal();
  if (real_home.has_filename() == false) real_home = real_home.parent_path();
  if (within(real_home, workspace))
    throw engine_error(errc::bad_request, fmt::format("--workspace {} holds CAIRN_HOME {}: the agent could change "
                                                      "cairn's own files; give a folder of its own",
                                                      workspace.string(), real_home.string()));
  if (within(workspace, real_home) && workspace != default_workspace(real_home, run_id))
    throw engine_error(errc::bad_request, fmt::format("--workspace {} lies inside CAIRN_HOME {}, where cairn keeps "
                                                      "other runs' files; leave --workspace out to use {}",
                                                      workspace.string(), real_home.string(), own.string()));
  for (const auto& run : journal.runs_with_workspace_near(workspace.string())) {
    if (run.id == run_id || run.workspace.empty()) continue;
    const fs::path other = fs::path(run.workspace).lexically_normal();
    if (other != workspace && (within(workspace, other) || within(other, workspace)))
      throw engine_error(errc::bad_request, fmt::format("--workspace {} nests with the workspace {} of run {}: one "
                                                        "run's agent could redirect the other's files; give a "
                                                        "folder apart from every run's",
                                                        workspace.string(), other.string(), run.id));
  }
  return workspace;
}

}  // namespace cairn::engine
