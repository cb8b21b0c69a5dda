// What a script agent's folder shows inside its sandbox. A script (a program
// that starts with "#!") runs from a read-only bind of its folder at
// /run/cairn/app, so it imports its own modules; that folder is often where
// people keep other things too (cairn's own ./.cairn with the API key and the
// journal, a .env, a checkout's .git, or the whole home folder). Only what an
// agent needs is shown: the folder with every dot-entry at its top (but a
// Python virtualenv, .venv) and every private path of the host's covered,
// and never a folder that is a home, a shared folder or cairn's own.
// Internal to runtime/.
#pragma once

#include <filesystem>
#include <vector>

namespace cairn::runtime {

struct app_view {
  std::filesystem::path folder;                        // canonical; bound read-only
  std::vector<std::filesystem::path> hidden_folders;   // under `folder`: an empty read-only folder in their place
  std::vector<std::filesystem::path> hidden_files;     // under `folder`: an empty file in their place
};

// The view of `folder` (a script agent's, canonical) with `private_paths`
// (host paths the sandbox must never see: CAIRN_HOME, the journal) covered
// wherever they lie inside it. Throws sandbox_error(bad_spec), naming the
// fix, when the folder may not be shown at all: it is "/", a home folder
// (this process's $HOME or its user's), one above it, a folder others may
// write, or it lies inside a private path or holds one as itself.
app_view view_of_app_folder(const std::filesystem::path& folder,
                            const std::vector<std::filesystem::path>& private_paths);

// bwrap's options for `view`, after the bind of view.folder at `inside`.
std::vector<std::string> app_view_options(const app_view& view, const std::filesystem::path& inside);

}  // namespace cairn::runtime
