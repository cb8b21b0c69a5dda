// Wake-ups inside this process. A thread that waits for something to
// happen to a run (an attempt holding a wait or watching for a cancel, a
// crash backoff, the scheduler) registers a wake_event for it; whoever
// changes the run here, or hears of a change from another process
// (storage/wakeup.hpp), calls wake_run(). A wake-up is a hint: the waiter
// re-reads the journal. Waiters take wake-ups before they look, so none is lost.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>

#include "engine/io.hpp"
#include "storage/wakeup.hpp"

namespace cairn::engine {

// An eventfd: readable from the first signal() until take(). Move-only.
class wake_event {
 public:
  wake_event();
  ~wake_event();
  wake_event(wake_event&& other) noexcept;
  wake_event& operator=(wake_event&&) = delete;
  wake_event(const wake_event&) = delete;
  wake_event& operator=(const wake_event&) = delete;

  // Async-signal-safe.
  void signal() const noexcept;
  // Consumes what was signalled; whether anything was.
  bool take() const noexcept;
  // Blocks until signalled (true, consumed) or `until` (false).
  bool wait_until(clock::time_point until) const;
  int fd() const { return fd_; }

 private:
  int fd_;
  // Set after each signal: take() reads the eventfd only then, not on every
  // frame an agent sends (a read that fails with EAGAIN is a system call).
  mutable std::atomic<bool> signalled_{false};
};

// While it lives, wake_run(run_id) signals `event` ("" for run_id: every
// wake_run). `event` must outlive it.
class wake_registration {
 public:
  wake_registration(std::string run_id, const wake_event& event);
  ~wake_registration();
  wake_registration(const wake_registration&) = delete;
  wake_registration& operator=(const wake_registration&) = delete;

 private:
  std::string run_id_;
  const wake_event& event_;
};

// What wakes an attempt besides its agent's frames, as one descriptor to
// poll: a change to its run (a signal, a cancel, a child that ended, the host
// stopping) or its agent's process ending. The engine provides it.
class attempt_wakeups {
 public:
  virtual ~attempt_wakeups() = default;
  // Also wakes when the process `pid` (a child of this process) ends.
  virtual void watch_process(pid_t pid) = 0;
  // Readable while a wake-up is pending or once the process has ended.
  virtual int fd() const = 0;
  // Consumes pending wake-ups; whether there was one.
  virtual bool take() const = 0;
};

// Wakes whoever in this process waits on `run_id`, and every watcher of all runs.
void wake_run(const std::string& run_id);
// Wakes every waiter of this process (the host is shutting down).
void wake_all();

// While one lives, this process hears the wake-ups other processes send
// about the journal at `db` (storage/wakeup.hpp) and passes each to
// wake_run(): whatever executes runs holds one. One listener per journal and
// process, shared. Throws what storage::wake_listener throws.
class wake_listening {
 public:
  explicit wake_listening(std::filesystem::path db);
  ~wake_listening();
  wake_listening(const wake_listening&) = delete;
  wake_listening& operator=(const wake_listening&) = delete;

 private:
  std::filesystem::path db_;
};

// After a commit that changed run `run_id` of the journal at `db`: wakes
// its waiters here and tells the other processes (storage::notify).
void announce(const std::filesystem::path& db, const std::string& run_id, storage::change what);

// A stop request that a signal handler may raise and a poll(2) may wait on.
class stop_flag {
 public:
  // Async-signal-safe.
  void raise() noexcept {
    raised_ = true;
    event_.signal();
  }
  bool raised() const noexcept { return raised_; }
  // Blocks until raised.
  void wait() const;
  // Readable once raised, for good.
  int fd() const { return event_.fd(); }

 private:
  std::atomic<bool> raised_{false};
  wake_event event_;
};


}  // namespace cairn::engine
