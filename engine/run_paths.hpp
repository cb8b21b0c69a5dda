// Where a run's host files live: under CAIRN_HOME, named by the run's
// validated id alone, never beside or inside a folder an agent can write.
//   HOME/workspaces/ID   the default workspace, a child run's too
//   HOME/images/ID.img   its quota image (bwrap under root), templates beside
//   HOME/logs/ID.log     the agent's output, 0600
// With a shared workspace root (engine_options::workspace_root), what holds
// a run's files lives under that root, where every worker of it finds them:
//   ROOT/ID              the workspace
//   ROOT/.images/ID.img  its quota image (a run id never begins with a dot)
// Folders are made 0700, without following links; HOME and HOME/workspaces
// are 0711 under root, whose sandboxes run as another uid that must pass.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "storage/journal.hpp"

namespace cairn::engine {

std::filesystem::path default_workspace(const std::filesystem::path& home, const std::string& run_id);
std::filesystem::path workspace_image(const std::filesystem::path& home, const std::string& run_id);
std::filesystem::path root_workspace_image(const std::filesystem::path& workspace_root, const std::string& run_id);
std::filesystem::path run_log(const std::filesystem::path& home, const std::string& run_id);

// Creates HOME and its folders with the modes above where missing. Throws
// runtime::sandbox_error(bad_spec) when a component is a symbolic link.
void make_home_folders(const std::filesystem::path& home);

// The one place this worker (its HOME and shared `workspace_root`, "" for
// none) keeps the image of a run whose workspace is `workspace`: beside it
// under the root when it is ROOT/ID, else HOME/images/ID.img. Both paths are
// taken as canonical.
std::filesystem::path image_of_run(const std::filesystem::path& home, const std::filesystem::path& workspace_root,
                                   const std::string& run_id, const std::filesystem::path& workspace);

// The image of a run as a process that knows only its HOME (a `cairn`
// command, not the worker) finds it: ROOT/.images/ID.img beside a workspace
// ROOT/ID when that folder and the image are this user's alone (a worker of
// a shared root made them), never a file another user placed; else
// HOME/images/ID.img.
std::filesystem::path find_run_image(const std::filesystem::path& home, const std::string& run_id,
                                     const std::filesystem::path& workspace);

// Whether cairn made the workspace `workspace` of run `run_id`, so that it
// goes with the run: HOME/workspaces/ID, or ROOT/ID under a workspace root
// (`workspace_root`, or a folder whose .images this user alone owns, as
// make_root_folders leaves every root). A folder the user gave is not.
bool workspace_is_cairns(const std::filesystem::path& home, const std::filesystem::path& workspace_root,
                         const std::string& run_id, const std::filesystem::path& workspace);

// Why this worker cannot reach the files of a run whose workspace is
// `workspace` (canonical paths; `other_roots`: the workspace roots other
// workers of the journal registered), or nullopt when it can: a workspace
// under another worker's root or in another CAIRN_HOME is held there. A
// folder the user gave (neither) is reachable.
std::optional<std::string> unreachable_workspace(const std::filesystem::path& home,
                                                 const std::filesystem::path& workspace_root,
                                                 const std::string& run_id, const std::filesystem::path& workspace,
                                                 const std::vector<std::string>& other_roots);

// Under root: throws engine_error(bad_request) naming the fix when another
// user could put another folder in place of one above `folder` (what root
// chowns and mounts there would land in theirs); `what` names it for the
// user ("CAIRN_HOME", "--workspace-root"). Nothing to check as another user.
void check_unswappable(const std::filesystem::path& folder, const std::string& what);

// Makes ROOT/.images (0700, without following links) for a shared root.
void make_root_folders(const std::filesystem::path& workspace_root);

// Moves to ROOT/.images the images that an older cairn kept in HOME/images
// for runs whose workspace is ROOT/ID, so that every worker of the root
// finds them; returns one line per image that could not be moved (the run
// then refuses to start on its empty folder and names the image).
std::vector<std::string> adopt_images_of_root(storage::journal& journal, const std::filesystem::path& home,
                                              const std::filesystem::path& workspace_root);

// The workspace a run of `run_id` asked for, made canonical (links resolved
// once, here): HOME/workspaces/ID when `given` is empty. Refused
// (engine_error bad_request) when it contains HOME, lies inside HOME other
// than as HOME/workspaces/ID, or nests with another run's workspace.
std::filesystem::path checked_workspace(storage::journal& journal, const std::filesystem::path& home,
                                        const std::filesystem::path& given, const std::string& run_id);

}  // namespace cairn::engine
