// Fault injection for crash tests: with CAIRN_CRASH_POINT=NAME:N in the
// environment, the N-th time this process reaches crash_point("NAME") it kills
// itself with SIGKILL, exactly as an OOM kill or power cut would stop it.
// Without the variable this is a no-op. Points: after_spawn, after_hello,
// before_commit, after_commit (committed, not yet acked), after_ack,
// before_finish; for tool calls tool_started (the started record is durable,
// the tool not yet called) and tool_returned (called, result not journaled),
// each also as tool_started.TOOL and tool_returned.TOOL for one tool; for a
// run's end with a quota image, workspace_copied (its files copied out and
// marked whole, the image still mounted), image_doomed (the image renamed
// away) and workspace_moved_aside (the folder moved aside, the copy not yet
// in its place).
#pragma once

#include <string_view>

namespace cairn::runtime {

void crash_point(std::string_view name);

}  // namespace cairn::runtime
