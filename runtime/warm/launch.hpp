// What the host and the launcher in a pooled sandbox say to each other on
// the channel (fd 3) before the agent exists. Shared by runtime/warm_pool.cpp
// and warm/launcher.cpp, so it uses nothing but the C library. Internal to
// runtime/.
//
// 1. The launcher, started by bwrap as the sandbox's first program, writes
//    launcher_ready once: bwrap has built the whole sandbox.
// 2. The host writes one launch message: a 4-byte length (host order), then
//    that many bytes: the agent's argv, each string NUL-terminated, an empty
//    string, then its environment the same way. The first byte carries two
//    descriptors (SCM_RIGHTS): the agent program, open for reading, and the
//    write end of the pipe that is the agent's stdout and stderr.
// 3. The launcher moves them into place, enters /workspace again (the host
//    mounted the run's workspace over it, or renamed it into the run's) and
//    executes the program from its descriptor: the agent now owns the channel.
#pragma once

#include <cstdint>

namespace cairn::runtime::warm {

inline constexpr char launcher_ready = 'R';
inline constexpr std::uint32_t max_launch_bytes = 4u << 20;

}  // namespace cairn::runtime::warm
