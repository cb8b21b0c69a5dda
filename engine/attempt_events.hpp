// What an attempt waits for besides its agent's frames, as one descriptor
// to poll: a wake-up of its run (wakeups.hpp: a signal or a cancel came, in
// this process or another, a child ended, the host is stopping) and its agent's process ending (which
// closes the channel too, unless something the agent started holds it open).
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <string>

#include "engine/wakeups.hpp"

namespace cairn::engine {

class attempt_events : public attempt_wakeups {
 public:
  // `db`: the run's journal, whose wake-ups from other processes this hears.
  attempt_events(const std::string& run_id, const std::filesystem::path& db);
  ~attempt_events();
  attempt_events(const attempt_events&) = delete;
  attempt_events& operator=(const attempt_events&) = delete;

  // Also wakes when the process `pid` (a child of this process, not yet
  // reaped) ends. Without pidfds (Linux < 5.3) only the channel says so.
  void watch_process(pid_t pid) override;
  // Readable while a wake-up is pending or once the process has ended.
  int fd() const override { return epoll_; }
  // Consumes pending wake-ups; whether there was one.
  bool take() const override { return wake_.take(); }

 private:
  wake_listening listening_;
  wake_event wake_;
  wake_registration registration_;
  int epoll_ = -1, process_ = -1;
};

}  // namespace cairn::engine
