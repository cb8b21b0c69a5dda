// Copying and clearing folder trees as root where an agent wrote one side:
// everything goes through folder fds and nothing is ever followed through a
// symlink, so a link the agent planted cannot redirect a write of the host.
// Internal to runtime/.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace cairn::runtime {

// Copies what the folder `from` holds into the folder `to` (open fds;
// `from_name` and `to_name` are for messages): folders recursively, regular
// files by content, symlinks as symlinks, each with its owner, permission
// bits (setuid and setgid dropped) and modification time. Fifos, sockets and
// devices are skipped. Whatever `to` holds under a copied name is replaced.
// What the source shares stays shared: the names of one file become hard
// links to one copy, holes stay holes. Once what it wrote occupies more than
// `max_bytes` on disk (allocated blocks, not sizes) it stops. Not as root,
// a file or folder of `from` that this user owns but may not read (an
// agent's mode 0) is made readable to its owner first: `from` is emptied or
// deleted afterwards.
// Throws sandbox_error(workspace_failed) naming the file and the errno, or
// the budget it ran out of.
void copy_tree(int from, int to, const std::filesystem::path& from_name, const std::filesystem::path& to_name,
               std::uint64_t max_bytes);

// Removes everything the folder `dir` holds, the folder itself excepted,
// also from folders this user owns but made unreadable or unwritable.
// Throws sandbox_error(workspace_failed).
void clear_tree(int dir, const std::filesystem::path& name);

// Whether the folder `dir` holds anything.
bool has_entries(int dir);

}  // namespace cairn::runtime
