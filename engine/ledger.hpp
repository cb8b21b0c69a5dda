// The one writer of the journal in a host process. Everything that changes
// durable state (the effects an attempt reports, a submit, a claim, a
// signal, a cancel) is applied here through storage's typed calls, and this
// file's .cpp owns the event schema: how each effect is stored, and the
// readers below that find it again. After each commit it announces what
// another thread or process may wait for (wakeups.hpp).
//
// Group commit, as LevelDB's writer queue: a write joins a queue, and the
// ledger's committer thread commits, in one transaction with one sync,
// everything queued, then tells each writer. A write returns (a blocking
// call) or resumes its coroutine (the _async calls, on the coroutine's own
// executor) only after that commit: the acknowledgement still follows the
// durable row, a second run's steps cost no second sync, and no thread of
// the event loop ever waits for an fsync.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine/effects.hpp"
#include "engine/event_schema.hpp"
#include "engine/io.hpp"
#include "engine/run_archive.hpp"
#include "engine/workspace_checkpoints.hpp"
#include "storage/journal.hpp"

namespace cairn::engine {

using json = nlohmann::json;

// A run create_runs was given: its id, and whether it was created (false:
// a run with this id existed, and was left as it is).
struct submitted_run {
  std::string id;
  bool created = false;
};

class ledger {
 public:
  // Opens a connection of its own to the journal at `db`.
  explicit ledger(const std::filesystem::path& db, storage::journal_options options = {});
  // Commits through `journal` (any implementation: a test's in-memory one).
  explicit ledger(std::unique_ptr<storage::journal> journal);
  // The same without a committer thread: every write commits on its
  // writer's thread, as a leading writer's does. For a process with one
  // thread of writers (the deterministic simulator, tests/sim); a second
  // writer while one commits is a logic_error.
  struct single_thread_t {};
  static constexpr single_thread_t single_thread{};
  ledger(std::unique_ptr<storage::journal> journal, single_thread_t);
  // Commits what is queued, then stops the committer.
  ~ledger();
  ledger(const ledger&) = delete;
  ledger& operator=(const ledger&) = delete;

  const std::filesystem::path& path() const { return path_; }

  // Applies the effects of run `run_id` together: all of them or (when it
  // throws, as storage would) none. Durable when it returns.
  void apply(const std::string& run_id, const std::vector<effect>& effects);
  // One effect, of any kind, taken as itself (see attempt_driver::record).
  template <class E>
  task<void> apply_async(std::string run_id, E e) {
    effect whole = std::move(e);
    co_await apply_effect_async(std::move(run_id), std::move(whole));
  }
  // Creates `child`, a child of run `run_id`, unless `refusal` (called in
  // the same transaction, so that runs of one tree started together cannot
  // all take the last place) gives a reason not to; returns that reason. A
  // child that exists already (a replay) is found, not refused.
  task<std::optional<std::string>> start_child_async(
      std::string run_id, storage::new_run child,
      std::function<std::optional<std::string>(storage::journal&)> refusal);

  // `cairn fork` (engine::fork): creates `fork` holding the journal of run
  // `from` up to and including step `seq`: those steps (their payloads
  // stored again, for the fork), the events at them in their order (tool
  // calls started, timers, waits, workspace checkpoints), a kept state that
  // counts their model tokens, and first of all a forked_from event; and
  // adds a forked event to `from`. One transaction, unless `refusal` (called
  // first in it, so nothing can change between check and write) gives a
  // reason not to: then nothing is written and the reason is returned.
  std::optional<std::string> fork_run(const storage::new_run& fork, const std::string& from, std::uint64_t seq,
                                      const std::function<std::optional<std::string>(storage::journal&)>& refusal);

  // `cairn import` (engine::import_run): creates `run` holding the journal
  // of the archived run `from` (run_archive.hpp): an imported event first
  // (where it came from), its signals (new ids; the events naming them
  // follow), steps, events and kept state as they were, the pieces of
  // `digests` (read from `pieces` one at a time), its attempts, and its
  // status: an ended, waiting or in-doubt run's as it was; a pending or
  // running one's pending, with no owner. One transaction, unless `refusal`
  // (called first in it) gives a reason not to: then nothing is written
  // and the reason is returned.
  std::optional<std::string> import_run(const storage::new_run& run, const archived_run& from,
                                        std::span<const std::string> digests, const piece_source& pieces,
                                        const std::function<std::optional<std::string>(storage::journal&)>& refusal);

  // The event an effect adds to the journal, if it adds one (a step adds a
  // step row; a child, a run). For the run's journal budget.
  static std::optional<event_row> event_of(const effect& e);

  // The journal's typed writes that answer something; each as storage's
  // call of the same name (journal.hpp), group-committed like apply.
  // `sync_later`: as write_together's, for a run its own process executes
  // next (engine::start).
  std::pair<storage::run_record, bool> create_run(const storage::new_run& run, bool sync_later = false);
  // create_run of each run, in order, all in one transaction: all of them
  // or (when it throws) none. Announced once, however many were created.
  // Keeps no record: a batch's memory is its requests, not their rows too.
  std::vector<submitted_run> create_runs(std::span<const storage::new_run> runs);
  bool claim_run(const std::string& id, const std::string& expected_owner, const std::string& new_owner);
  task<bool> claim_run_async(std::string id, std::string expected_owner, std::string new_owner);
  void confirm_held(const std::string& id);
  task<void> confirm_held_async(std::string id);
  int begin_attempt(const std::string& id);
  task<int> begin_attempt_async(std::string id);
  // A run on its way in, in one write and so one commit rather than three:
  // claim_run, then (when `workspace` is given) assign_workspace, then
  // begin_attempt. Returns the attempt's number, or nullopt when the claim
  // failed (and nothing was written). Visible to every process when it
  // returns, but synced with the attempt's first synced write (a power cut
  // before it forgets the claim; the run is then still to be taken).
  struct workspace_assignment {
    std::string folder, host;
  };
  task<std::optional<int>> take_run_async(std::string id, std::string expected_owner, std::string new_owner,
                                          std::optional<workspace_assignment> workspace);
  storage::signal_record enqueue_signal(const std::string& run_id, const std::string& name, const json& payload,
                                        std::uint64_t max_signals);
  bool request_cancel(const std::string& id, const std::string& reason);
  task<bool> request_cancel_async(std::string id, std::string reason);
  bool cancel_idle_run(const std::string& id, const std::string& message);
  task<bool> cancel_idle_run_async(std::string id, std::string message);
  void assign_workspace(const std::string& id, const std::string& workspace, const std::string& workspace_host);
  task<void> assign_workspace_async(std::string id, std::string workspace, std::string workspace_host);
  void register_worker(const storage::worker_record& worker);
  task<void> register_worker_async(storage::worker_record worker);
  task<bool> renew_lease_async(std::string worker_id, std::int64_t lease_expires_at_ms, std::int64_t fenced_writes);
  void remove_worker(const std::string& worker_id);

  // What `read` returns, read on the writing connection within the next
  // group commit (alone, it costs no sync). For a coroutine on an event
  // loop whose read may take long (all of a run's events): the loop goes on
  // meanwhile, and the caller's connection stays with its thread. The group
  // waits for the read, so keyed reads stay on the caller's connection.
  template <class T>
  task<T> read_async(std::function<T(storage::journal&)> read) {
    std::optional<T> out;
    co_await write_async([&](storage::journal& j) { out = read(j); }, /*sync_later=*/true);
    co_return std::move(*out);
  }

  // Writes the journal refused since this ledger opened because another
  // process had taken their run over (storage_error(fenced)).
  std::int64_t fenced_writes() const { return fenced_writes_.load(std::memory_order_relaxed); }

 private:
  using body = std::function<void(storage::journal&)>;
  // Told once the write committed (null) or failed (why).
  using done_fn = std::function<void(std::exception_ptr)>;
  struct writer {
    body write;
    done_fn done;
    bool sync_later = false;  // storage::journal::write_together's
  };
  // Runs `write` on the writing connection within the next group commit.
  // `sync_later`: it may commit without a sync of its own when its group
  // holds nothing else (see storage's write_together).
  void write(body write, bool sync_later = false);
  task<void> write_async(body write, bool sync_later = false);
  task<void> apply_effect_async(std::string run_id, effect e);
  void enqueue(body write, done_fn done, bool sync_later = false);
  // Commits `write` on this thread when nobody else is writing (the first
  // writer leads, as in LevelDB's queue: an idle engine's step pays no hand-
  // over to the committer and back); false when another commit is under way
  // or queued, and `write` was left alone.
  bool lead(body& write, std::exception_ptr& error, bool sync_later = false);
  void commit_loop();
  // Commits `group` together, then answers each writer. Without mutex_.
  void commit_group(std::vector<writer>& group);
  // The writes of apply(), and what to announce once they committed.
  static body effects_body(const std::string& run_id, const std::vector<effect>& effects, std::string& parent);
  void announce_applied(const std::string& run_id, const std::vector<effect>& effects, const std::string& parent);
  // The run ended: whoever waits for it (its parent's join, a `cairn run`
  // following it) hears so, here and in other processes.
  void announce_end(const std::string& run_id, const std::string& parent_id);

  std::filesystem::path path_;
  std::unique_ptr<storage::journal> journal_;  // touched only by whoever commits (committing_)
  std::mutex mutex_;
  std::condition_variable queued_;
  std::deque<writer> queue_;
  bool committing_ = false;  // the committer, or a leading writer, is committing
  bool closing_ = false;
  bool single_thread_ = false;  // no committer: every writer leads
  std::atomic<std::int64_t> fenced_writes_{0};
  std::thread committer_;
};

// What the ledger wrote, read back.

// Failed attempts of the step at `seq` (retry_due effects).
int step_failures(storage::journal& journal, const std::string& run_id, std::uint64_t seq);
// Times the host started the tool call at `seq`.
int tool_attempts(storage::journal& journal, const std::string& run_id, std::uint64_t seq);
std::optional<effects::timer_set> timer_at(storage::journal& journal, const std::string& run_id, std::uint64_t seq);
std::optional<effects::wait_started> wait_at(storage::journal& journal, const std::string& run_id, std::uint64_t seq);
// Suspensions of the run since `since_ms`.
std::uint64_t suspensions_since(storage::journal& journal, const std::string& run_id, std::int64_t since_ms);
// Why the run was cancelled, as `cairn cancel --reason` said.
std::string cancel_reason(storage::journal& journal, const std::string& run_id);

// One end of a fork: the run (the fork, or the run it came from) and the
// step of the original where the fork's own journal goes on from.
struct fork_link {
  std::string run;
  std::uint64_t seq = 0;
  bool operator==(const fork_link&) const = default;
};
// The run and step `run_id` was forked from; nullopt for a run that is no
// fork. Reads one event: a fork's first.
std::optional<fork_link> forked_from(storage::journal& journal, const std::string& run_id);
// The fork that event `e` of a run records; nullopt for any other event
// (`cairn show` finds a run's forks as it reads its events).
std::optional<fork_link> fork_made(const storage::event_record& e);
// The forks made of `run_id`, oldest first.
std::vector<fork_link> forks_of(storage::journal& journal, const std::string& run_id);

// An at-most-once call that was started but whose outcome never reached the
// journal: it may or may not have happened.
struct in_doubt_call {
  std::uint64_t seq = 0;
  std::string tool;
  json args;
  std::int64_t started_at_ms = 0;
  std::string message;  // what happened and how to settle it, for the user
};

// The call in doubt at the run's next seq, if any (a settled one is not).
std::optional<in_doubt_call> find_in_doubt(storage::journal& journal, const std::string& run_id);

}  // namespace cairn::engine
