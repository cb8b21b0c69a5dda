// Where a run's host files live: under CAIRN_HOME, named by the run's
// validated id alone, never beside or inside a folder an agent can write.
//   HOME/workspaces/ID   the default workspace, a child run's too
//   HOME/images/ID.img   its quota image (bwrap under root), templates beside
//   HOME/logs/ID.log     the agent's output, 0600
// Folders are made 0700, without following links; HOME and HOME/workspaces
// are 0711 under root, whose sandboxes run as another uid that must pass.
#pragma once

#include <filesystem>
#include <string>

#include "storage/journal.hpp"

namespace cairn::engine {

std::filesystem::path default_workspace(const std::filesystem::path& home, const std::string& run_id);
std::filesystem::path workspace_image(const std::filesystem::path& home, const std::string& run_id);
std::filesystem::path run_log(const std::filesystem::path& home, const std::string& run_id);

// Creates HOME and its folders with the modes above where missing. Throws
// runtime::sandbox_error(bad_spec) when a component is a symbolic link.
void make_home_folders(const std::filesystem::path& home);

// The workspace a run of `run_id` asked for, made canonical (links resolved
// once, here): HOME/workspaces/ID when `given` is empty. Refused
// (engine_error bad_request) when it contains HOME, lies inside HOME other
// than as HOME/workspaces/ID, or nests with another run's workspace.
std::filesystem::path checked_workspace(storage::journal& journal, const std::filesystem::path& home,
                                        const std::filesystem::path& given, const std::string& run_id);

}  // namespace cairn::engine
