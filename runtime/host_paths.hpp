// Host-side file preparation shared by the backends. Internal to runtime/.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "runtime/sandbox.hpp"
#include "runtime/unique_fd.hpp"

namespace cairn::runtime {

// Creates the workspace (0700; the folders above it 0711 under root, else
// 0700) if missing, never through a symbolic link
// (see no_follow.hpp); returns its absolute path. Throws
// sandbox_error(bad_spec) when it cannot be created or a component is a link.
std::filesystem::path prepare_workspace(const std::filesystem::path& workspace);
// The same for the folders above the workspace only; the workspace is left
// as it is (a new run's is not there yet, and a pooled folder may take its
// place). Returns its absolute path.
std::filesystem::path prepare_workspace_parent(const std::filesystem::path& workspace);

// Gives the whole tree under `dir` (itself included) to uid/gid without
// following symlinks, so a link planted in the workspace cannot redirect
// the chown. Throws sandbox_error(bad_spec).
void chown_tree(const std::filesystem::path& dir, uid_t uid, gid_t gid);

// The first directory on the way to `path` (a canonical absolute path) that
// uid/gid, without supplementary groups, may not search; nullopt if none.
// Judged from the mode bits (ACLs are ignored).
std::optional<std::filesystem::path> first_unsearchable_dir(const std::filesystem::path& path, uid_t uid,
                                                            gid_t gid);

// Whether uid/gid may read and execute the file at `path` (mode bits).
bool may_read_and_execute(const std::filesystem::path& path, uid_t uid, gid_t gid);

// The agent program as a canonical path to an executable regular file.
// Throws sandbox_error(bad_spec) naming what is wrong.
std::filesystem::path check_program(const std::filesystem::path& program);

// Throws sandbox_error(bad_spec) for an argument that cannot reach argv (a NUL byte).
void check_agent_args(const std::vector<std::string>& args);

// Opens (creating it 0600, and its folder 0700) the log for appending,
// close-on-exec, never through a symbolic link. Throws sandbox_error(bad_spec).
unique_fd open_log(const std::filesystem::path& log_file);

// Adds to an agent's base environment what runtimes need to start under
// RLIMIT_AS, which stands in for a cgroup's memory total where there is none
// and counts address space only reserved: glibc reserves 64 MiB per thread's
// malloc arena (MALLOC_ARENA_MAX=2), Node 20 about 10 GiB for WebAssembly on
// its first fetch (NODE_OPTIONS=--disable-wasm-trap-handler, set only for a
// node on PATH that takes it: 20.15 and 22.2 on). Measured: the
// OpenAI Agents example needed 1.2 GiB and 12 GiB of it without them, and
// runs under 1 GiB with them.
void add_address_space_environment(std::map<std::string, std::string>& base);

// The agent's whole environment: `base`, then spec.env (which may override
// it), then CAIRN_CHANNEL_FD=3 and CAIRN_RUN_ID (which it may not).
// Throws sandbox_error(bad_spec) for a name or value that cannot be passed.
std::map<std::string, std::string> agent_environment(const sandbox_spec& spec,
                                                     std::map<std::string, std::string> base);

}  // namespace cairn::runtime
