// Pieces shared by the bwrap backend and its doctor checks: finding bwrap,
// the isolation flags, the kernel's user-namespace switches, and running a
// short command to completion. Internal to runtime/.
#pragma once

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "runtime/sandbox.hpp"
#include "runtime/spawn.hpp"

namespace cairn::runtime {

inline constexpr const char* bwrap_missing_message =
    "bubblewrap (bwrap) is not installed: install it with `apt-get install bubblewrap`, or pass "
    "--sandbox none to run WITHOUT isolation";

// `configured` itself when it names a path (contains a '/'), else the first
// executable `configured` on $PATH; nullopt when there is none.
std::optional<std::filesystem::path> find_bwrap(const std::filesystem::path& configured);

// Every sandbox's bwrap runs as `bwrap --args 4 -- /run/cairn/agent ...`;
// kill_orphaned_sandboxes() recognises them by this command line.
inline constexpr const char* sandbox_agent_path = "/run/cairn/agent";
inline constexpr int bwrap_args_fd = 4;

// "0.8.0" from `bwrap --version`; nullopt when it does not answer.
std::optional<std::string> bwrap_version(const std::filesystem::path& bwrap);

// --disable-userns (no nested user namespaces) arrived in bubblewrap 0.8.0.
bool supports_disable_userns(const std::string& version);

// The flags every cairn sandbox gets, before the per-run env and mounts:
// all namespaces, no capabilities, an empty environment, a read-only /usr
// (and the merged-usr links), private /proc, /dev and /tmp. Nothing of the
// host's /etc but the loader cache and the alternatives links.
std::vector<std::string> bwrap_isolation_args(bool disable_userns);

// A kernel setting that keeps unprivileged user namespaces from working.
struct userns_blocker {
  std::string found;  // "kernel.unprivileged_userns_clone = 0"
  std::string fix;    // "sysctl -w kernel.unprivileged_userns_clone=1"
};
std::vector<userns_blocker> userns_blockers();

struct captured_run {
  std::optional<exit_status> status;  // nullopt: killed after the timeout
  std::string output;                 // stdout and stderr together
};
// Runs `argv` (argv[0] an absolute path) to completion, with default limits.
// Throws sandbox_error(spawn_failed) when it cannot start.
captured_run run_captured(const std::vector<std::string>& argv, std::optional<spawn_identity> run_as,
                          std::chrono::milliseconds timeout);

}  // namespace cairn::runtime
