// Pieces shared by the bwrap backend and its doctor checks: finding bwrap,
// the isolation flags, the kernel's user-namespace switches, and running a
// short command to completion. Internal to runtime/.
#pragma once

#include <chrono>
#include <cstdint>
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

// Every sandbox's bwrap runs as `bwrap --args 4 -- /run/cairn/agent ...`
// with CAIRN_SANDBOX_RECORD=TOKEN in its environment (cleared for the agent),
// TOKEN naming the record (own_records.hpp, kind "sandbox", subject
// host_identity()) written before it was started. kill_orphaned_sandboxes()
// acts only on processes that carry both.
inline constexpr const char* sandbox_agent_path = "/run/cairn/agent";
inline constexpr int bwrap_args_fd = 4;
inline constexpr const char* sandbox_record_kind = "sandbox";
inline constexpr const char* sandbox_record_env = "CAIRN_SANDBOX_RECORD";
// "PID START" of this process (START: its start time in /proc/PID/stat), so a
// recycled pid is never taken for it.
std::string host_identity();
// Whether the process a host_identity() names still runs (the same one: a
// recycled pid has another start time).
bool host_alive(const std::string& identity);

// "0.8.0" from `bwrap --version`; nullopt when it does not answer.
std::optional<std::string> bwrap_version(const std::filesystem::path& bwrap);

// What the installed bubblewrap can do, from its version.
struct bwrap_features {
  bool disable_userns = false;  // --disable-userns (no nested user namespaces): 0.8.0
  bool tmpfs_size = false;      // --size before --tmpfs: 0.7.0
};
bwrap_features bwrap_features_of(const std::string& version);
// Of the bwrap at `bwrap`: by its version, less --size when it is setuid
// (which refuses it). Runs `bwrap --version`.
bwrap_features detect_bwrap_features(const std::filesystem::path& bwrap);

// The flags every cairn sandbox gets, before the per-run env and mounts:
// all namespaces, no capabilities, an empty environment, a read-only /usr
// (and the merged-usr links), private /proc and a read-only /dev, /tmp and
// /dev/shm as tmpfs of `tmp_bytes` each (when bwrap can size them). Nothing
// of the host's /etc but the loader cache and the alternatives links.
std::vector<std::string> bwrap_isolation_args(const bwrap_features& features, std::uint64_t tmp_bytes);

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
// Runs `argv` (argv[0] an absolute path) to completion under `limits`.
// Throws sandbox_error(spawn_failed) when it cannot start.
captured_run run_captured(const std::vector<std::string>& argv, std::optional<spawn_identity> run_as,
                          std::chrono::milliseconds timeout, const resource_limits& limits = {});

}  // namespace cairn::runtime
