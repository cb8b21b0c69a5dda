// The agent_process both backends return: a spawned child, its channel and
// the pipe its output reaches the log through. Internal to runtime/.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>

#include "runtime/limit_watch.hpp"
#include "runtime/output_log.hpp"
#include "runtime/own_records.hpp"
#include "runtime/sandbox.hpp"
#include "runtime/spawn.hpp"
#include "runtime/unique_fd.hpp"

namespace cairn::runtime {

// What must be signalled to end one agent and everything it started. Shared
// by the agent_process (which reaps) and its sandbox (whose destroy() may kill
// first); every member is guarded by `mutex`.
struct child_handle {
  std::mutex mutex;
  pid_t pid = -1;   // also the process group id (the child called setsid)
  unique_fd pidfd;  // of `pid`
  // bwrap: the sandbox's pid 1. When it dies the kernel kills and reaps every
  // other process of the pid namespace before the pidfd becomes readable.
  unique_fd sandbox_init_pidfd;
  std::optional<exit_status> status;  // set once `pid` is reaped
  // bwrap passes on an agent killed by signal N as exit code 128+N; with this
  // set, such a code is reported as the signal (as a shell would read it).
  bool exit_codes_carry_signals = false;
  // bwrap: what lets a later host's sweep find the sandbox should this host
  // die; removed once the handle goes, after its processes are reaped.
  std::unique_ptr<own_record> record;

  // SIGKILL to the sandbox's pid 1 and, while `pid` is unreaped (until then
  // its pid and group id cannot be recycled), to the process and its group.
  void kill_locked();
  // After kill_locked(): waits up to `limit` until no process of the group
  // and of the sandbox's pid namespace is alive any more (zombies are dead).
  void wait_dead_locked(std::chrono::milliseconds limit) const;
};

// Kills every process `h` stands for, waits (bounded by kill_grace) until
// they are gone, reaps, and returns the status. Idempotent.
exit_status end_child(child_handle& h);

class child_process final : public agent_process {
 public:
  child_process(std::shared_ptr<child_handle> handle, unique_fd channel_fd, std::size_t max_frame,
                std::unique_ptr<output_log> log, std::unique_ptr<limit_watch> limits);
  ~child_process() override;

  channel& io() override { return channel_; }
  pid_t pid() const override { return handle_->pid; }
  std::optional<exit_status> poll_exit() override;
  exit_status kill() override;
  std::optional<exit_status> wait_for(std::chrono::milliseconds timeout) override;
  std::string log_tail(std::size_t max_bytes) const override;
  std::optional<limit_breach> check_limits() override;

 private:
  std::shared_ptr<child_handle> handle_;
  channel channel_;
  std::unique_ptr<output_log> log_;
  std::unique_ptr<limit_watch> limits_;
};

// The processes a sandbox has started, for its destroy(). Holds them weakly:
// each agent_process owns and reaps its own.
class child_tracker {
 public:
  void track(const std::shared_ptr<child_handle>& handle);
  // SIGKILLs every tracked process that is not reaped yet and waits (bounded)
  // until each has exited and its sandbox's pid 1 is gone.
  void kill_all();

 private:
  std::mutex mutex_;
  std::vector<std::weak_ptr<child_handle>> handles_;
};

// How long kill() and destroy() wait for a killed sandbox to disappear.
inline constexpr std::chrono::milliseconds kill_grace{5000};
// How long bwrap gets to reap its killed pid 1 and exit by itself.
inline constexpr std::chrono::milliseconds bwrap_exit_grace{1000};

}  // namespace cairn::runtime
