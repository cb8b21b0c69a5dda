// Deleting what an agent wrote, as root or as the user: through folder fds,
// never following a link, so a link the agent planted in its workspace
// cannot turn a deletion of the host's onto another file.
#pragma once

#include <cstdint>
#include <filesystem>

namespace cairn::runtime {

// Removes the file or folder at `path` (absolute), a folder with all it
// holds, following no link at any component: a link is removed, never its
// target. A folder with another filesystem mounted in it (a workspace image
// still mounted) is left whole: throws sandbox_error(bad_spec) naming it.
// Returns the bytes freed (the allocated blocks of the files whose last
// name went); 0 when there is nothing at `path`. Throws
// sandbox_error(workspace_failed) when an entry cannot be removed.
std::uint64_t remove_no_follow(const std::filesystem::path& path);

}  // namespace cairn::runtime
