// Takes runs from the journal and executes them on a few event loops (one
// thread each, however many runs are live; engine/io.hpp): new
// runs, runs whose wait is over (a timer is due, a signal came, a child
// ended), and runs a dead host process or a worker whose lease expired left
// behind (engine/liveness.hpp), never a run whose workspace is on another
// machine (run_record::workspace_host). `cairn serve` runs one
// over the whole journal; `cairn run` runs one over its own run and its
// children, so child runs and timers work without a daemon. It waits on
// events, not on a timer: an execution returning, a wake-up of a run (from
// this process or, through storage/wakeup.hpp, from another), the next due
// time in the journal, or stop.
#pragma once

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.hpp"
#include "engine/wakeups.hpp"
#include "engine/worker_lease.hpp"

namespace cairn::engine {

struct scheduler_options {
  std::filesystem::path db;
  storage::journal_options journal;
  engine_options engine;  // engine.stopping is set by the scheduler
  int max_concurrent = 8;
  // How often the whole journal is looked at without a wake-up: for runs a
  // dead process left behind (nobody announces a death) and hints that were
  // lost. Not a hot path: a live host announces every change it makes.
  std::chrono::milliseconds idle_check{5'000};
  // Set: this scheduler is a worker (`cairn serve`): it holds a lease in the
  // journal's workers while it runs (worker_lease.hpp), and hands its runs
  // back and removes itself when it stops. When the lease is found expired
  // (this process was paused or cut off), every run in flight checks at once
  // that it still holds its run; an attempt whose run was taken over stops
  // (its sandbox killed, nothing more written) and is not retried here.
  std::optional<lease_settings> lease;
  // Lines for the operator: this worker's lease, the journal out of reach
  // and back; may be null.
  std::function<void(const std::string&)> on_note;
  // Only runs this accepts are taken (called on the scheduling thread, in
  // creation order, so a child is seen after its parent). Empty: all.
  std::function<bool(const storage::run_brief&)> accept;
  // The observer of one execution, called on its worker thread; may be null.
  std::function<run_observer*(const std::string& run_id)> observer_for;
  // After each execution returns: the run ended, waits, or was handed back.
  std::function<void(const storage::run_record&)> on_return;
  // An execution that failed to run at all (journal error, busy, ...). The
  // run is left alone for a few seconds before it is tried again.
  std::function<void(const std::string& run_id, const std::string& error)> on_error;
};

// One scheduling pass's rule (scheduler::run's, and tests/sim's): which of
// the runs journal::schedulable lists at `now_ms` this process (owner `me`,
// on machine `host`) starts, in creation order, at most `room` of them:
// not a run whose workspace is on another machine, not one another owner
// holds under a live lease or process (liveness.hpp), nor one `passed_over`
// names (in flight here, resting after an error, not accepted).
struct schedule_pass {
  std::vector<storage::run_brief> start;
  // The earliest expiry of a lease that holds a run passed over: look again then.
  std::optional<std::int64_t> next_expiry_ms;
};
schedule_pass choose_runs(storage::journal& journal, std::string_view me, std::string_view host, std::int64_t now_ms,
                          std::size_t room, const std::function<bool(const storage::run_brief&)>& passed_over);

class scheduler {
 public:
  explicit scheduler(scheduler_options options);
  ~scheduler();
  scheduler(const scheduler&) = delete;
  scheduler& operator=(const scheduler&) = delete;

  // Schedules until `done` (checked at each wake-up, on this thread, with no
  // execution in flight) says so, or until `stop` is raised. Then, gracefully:
  // no new runs; runs in flight finish their current step and are handed
  // back, or are suspended (engine_options::stopping); returns when all are.
  // A journal out of reach (a database server restarting, a file locked
  // past the busy timeout) is waited out, looking again with a growing
  // pause up to max_outage_pause; executions it failed are tried again
  // once it answers. Any other journal error is thrown.
  void run(const std::function<bool(storage::journal&)>& done, const stop_flag& stop);

  // Executions in flight now.
  std::size_t busy() const;

 private:
  std::optional<clock::time_point> look(storage::journal& journal, const std::string& me,
                                                            const std::function<bool(storage::journal&)>& done);
  void note(const std::string& line) const;

  struct pool;
  scheduler_options options_;
  std::atomic<bool> stopping_{false};
  std::unique_ptr<pool> pool_;
};

}  // namespace cairn::engine
