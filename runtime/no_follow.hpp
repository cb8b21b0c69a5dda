// Host folders and files opened without following a symbolic link at any
// component, so a link someone planted (an agent in its workspace, another
// user in a shared folder) never redirects what the host creates, mounts,
// chowns or writes.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include "runtime/unique_fd.hpp"

namespace cairn::runtime {

// Opens the folder at `path` (absolute) walking from "/" one component at a
// time with O_NOFOLLOW. With `create_mode`, missing components are made and
// given exactly that mode (the umask does not apply). Throws
// sandbox_error(bad_spec) naming the component that is a link or no folder.
unique_fd open_folder_no_follow(const std::filesystem::path& path, std::optional<mode_t> create_mode = std::nullopt);

// Why another user could swap a folder on the way to `path` (absolute)
// between two uses of it, as OpenSSH's StrictModes judges a home: a folder
// from "/" down to the one that holds `path` (those that exist) is a link, belongs to
// someone other than root or this user, or may be written by another user
// (by its group, unless that is this user's own, or by everyone, unless it
// is sticky like /tmp, where others cannot rename what is not theirs).
// nullopt when none can: the folders cairn opens then stay the ones it meant.
std::optional<std::string> swappable_ancestor(const std::filesystem::path& path);

// Opens (creating it 0600 when missing) `name` in `folder` for appending,
// never through a link; its mode is set back to 0600, so it is never
// executable or set-uid. Throws sandbox_error(bad_spec).
unique_fd open_append_no_follow(int folder_fd, const std::filesystem::path& name);

// Calls `visit` for every entry under the folder `dir_fd` (not the folder
// itself), a folder before what it holds, never following a link: a link is
// visited itself, never walked. `where` names `dir_fd` in messages. Throws
// sandbox_error(bad_spec) for a folder that cannot be listed or opened, or a
// tree more than 128 levels deep (each level holds an fd); not as root, a
// folder this user may not enter (an agent's mode 0) is visited, not walked.
using tree_visitor = std::function<void(int dir_fd, const char* name, const std::filesystem::path& where)>;
void walk_tree_no_follow(int dir_fd, const std::filesystem::path& where, const tree_visitor& visit, int depth = 0);

// Closes a workspace an agent wrote to every other user, without following
// links: `dir` itself becomes 0700, and nothing under it keeps a set-uid,
// set-gid or sticky bit or write permission for group or others (an agent
// chooses its files' modes, and a 0666 file or 1777 folder left to a
// sandbox uid is another local user's to change). Read and search bits
// below stay: no one else may enter `dir`, and a copy the user makes keeps
// what the agent meant to share. A missing `dir` is nothing to do. Throws
// sandbox_error(bad_spec) when an entry cannot be changed.
void close_to_others(const std::filesystem::path& dir);
// The same for the open folder `dir_fd`, named `where` in messages.
void close_to_others(int dir_fd, const std::filesystem::path& where);

}  // namespace cairn::runtime
