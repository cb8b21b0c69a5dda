// Copying and clearing folder trees as root where an agent wrote one side:
// everything goes through folder fds and nothing is ever followed through a
// symlink, so a link the agent planted cannot redirect a write of the host.
// Internal to runtime/.
#pragma once

#include <filesystem>
#include <string>

namespace cairn::runtime {

// Copies what the folder `from` holds into the folder `to` (open fds;
// `from_name` and `to_name` are for messages): folders recursively, regular
// files by content, symlinks as symlinks, each with its owner, permission
// bits (setuid and setgid dropped) and modification time. Fifos, sockets and
// devices are skipped. Whatever `to` holds under a copied name is replaced.
// Throws sandbox_error(workspace_failed) naming the file and the errno.
void copy_tree(int from, int to, const std::filesystem::path& from_name, const std::filesystem::path& to_name);

// Removes everything the folder `dir` holds, the folder itself excepted.
// Throws sandbox_error(workspace_failed).
void clear_tree(int dir, const std::filesystem::path& name);

// Whether the folder `dir` holds anything.
bool has_entries(int dir);

}  // namespace cairn::runtime
