#include "engine/run_paths.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include "engine/engine.hpp"
#include "engine/run_id.hpp"
#include "runtime/no_follow.hpp"
#include "runtime/workspace_quota.hpp"

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

fs::path root_workspace_image(const fs::path& workspace_root, const std::string& run_id) {
  return workspace_root / ".images" / (run_id + ".img");
}

fs::path image_of_run(const fs::path& home, const fs::path& workspace_root, const std::string& run_id,
                      const fs::path& workspace) {
  if (!workspace_root.empty() && workspace.lexically_normal() == (workspace_root / run_id).lexically_normal())
    return root_workspace_image(workspace_root, run_id);
  return workspace_image(home, run_id);
}

namespace {

// Whether `path` is this user's alone: owned by it, no one else may write.
bool owned_alone(const fs::path& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && st.st_uid == ::geteuid() && (st.st_mode & (S_IWGRP | S_IWOTH)) == 0;
}

}  // namespace

fs::path find_run_image(const fs::path& home, const std::string& run_id, const fs::path& workspace) {
  const fs::path w = workspace.lexically_normal();
  if (w.filename() == run_id && w != default_workspace(home, run_id).lexically_normal()) {
    const fs::path beside = root_workspace_image(w.parent_path(), run_id);
    if (owned_alone(beside.parent_path()) && owned_alone(beside)) return beside;
  }
  return workspace_image(home, run_id);
}

bool workspace_is_cairns(const fs::path& home, const fs::path& workspace_root, const std::string& run_id,
                         const fs::path& workspace) {
  const fs::path w = workspace.lexically_normal();
  if (w == default_workspace(home, run_id).lexically_normal()) return true;
  if (w.filename() != run_id) return false;
  if (!workspace_root.empty() && w == (workspace_root / run_id).lexically_normal()) return true;
  return owned_alone(root_workspace_image(w.parent_path(), run_id).parent_path());
}

std::optional<std::string> unreachable_workspace(const fs::path& home, const fs::path& workspace_root,
                                                 const std::string& run_id, const fs::path& workspace,
                                                 const std::vector<std::string>& other_roots) {
  if (workspace.empty()) return std::nullopt;  // this worker gives it one
  const fs::path w = workspace.lexically_normal();
  if (w == default_workspace(home, run_id).lexically_normal()) return std::nullopt;
  if (!workspace_root.empty() && w == (workspace_root / run_id).lexically_normal()) return std::nullopt;
  const fs::path parent = w.parent_path();
  for (const auto& other : other_roots)
    if (!other.empty() && parent == fs::path(other).lexically_normal())
      return fmt::format("its workspace {} lies under the workspace root {} of other workers, and this worker's is "
                         "{}: its files, and its quota image under {}, are reached only there; give every worker "
                         "the same --workspace-root",
                         w.string(), parent.string(), workspace_root.empty() ? "none" : workspace_root.string(),
                         root_workspace_image(parent, run_id).string());
  // Another home's default workspace: HOME/workspaces/ID beside HOME/images
  // and HOME/logs, as make_home_folders() leaves a home (a folder the user
  // gave that is named so by chance has no such neighbours).
  std::error_code ec;
  const fs::path other_home = parent.parent_path();
  if (w.filename() == run_id && parent.filename() == "workspaces" && fs::is_directory(other_home / "images", ec) &&
      fs::is_directory(other_home / "logs", ec))
    return fmt::format("its workspace {} is the default one of another CAIRN_HOME, {} (this worker's is {}): its "
                       "files, and its quota image {}, are reached only by a worker of that home; run one with "
                       "CAIRN_HOME={}, or give every worker one --workspace-root",
                       w.string(), parent.parent_path().string(), home.string(),
                       workspace_image(parent.parent_path(), run_id).string(), parent.parent_path().string());
  return std::nullopt;
}

void check_unswappable(const fs::path& folder, const std::string& what) {
  if (::geteuid() != 0) return;
  if (auto why = runtime::swappable_ancestor(folder / "x"))
    throw engine_error(errc::bad_request,
                       fmt::format("{} {} is refused: {}; cairn runs as root and would then act on that folder "
                                   "instead. Keep it where only root may change the folders above it (chown root, "
                                   "chmod go-w)",
                                   what, folder.string(), *why));
}

void make_root_folders(const fs::path& workspace_root) { open_folder(workspace_root / ".images", false); }

std::vector<std::string> adopt_images_of_root(storage::journal& journal, const fs::path& home,
                                              const fs::path& workspace_root) {
  std::vector<std::string> problems;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(home / "images", ec)) {
    const fs::path name = entry.path().filename();
    if (name.extension() != ".img") continue;
    const std::string id = name.stem().string();
    if (run_id_problem(id)) continue;
    auto run = journal.find_run(id);
    if (!run || fs::path(run->workspace).lexically_normal() != (workspace_root / id).lexically_normal()) continue;
    make_root_folders(workspace_root);
    if (auto why = runtime::adopt_image(entry.path(), root_workspace_image(workspace_root, id)))
      problems.push_back(fmt::format("run {}: {}", id, *why));
  }
  return problems;
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
