// Which host process executes a run, and whether that process still lives.
// An owner is "HOSTNAME:BOOT_ID:PID:START_TICKS": the boot id and the
// process start time (from /proc/PID/stat) make a recycled pid or a reboot
// distinguishable from the original process. Journals from before the boot
// id hold "HOSTNAME:PID" (boot_id empty, start_ticks 0), judged by the pid
// alone as then.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <sys/types.h>

namespace cairn::engine {

struct owner_id {
  std::string hostname;
  std::string boot_id;
  pid_t pid = 0;
  unsigned long long start_ticks = 0;

  std::string str() const;
  static std::optional<owner_id> parse(std::string_view s);
};

// This process.
const owner_id& current_owner();

enum class owner_state { alive, dead, unknown };

// dead: same hostname and the process is gone, its pid now names a process
// that started at another time, or the boot id differs (the machine rebooted,
// or it is another machine of that name: the journal's fencing stops the old
// owner from writing if it still lives). unknown: another host; only that
// host can tell.
owner_state check_owner(std::string_view owner);

// "pid 4121 on host1" for messages.
std::string describe_owner(std::string_view owner);

}  // namespace cairn::engine
