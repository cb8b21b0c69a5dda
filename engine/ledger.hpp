// The one writer of the journal in a host process. Everything that changes
// durable state (the effects an attempt reports, a submit, a claim, a
// signal, a cancel) is applied here through storage's typed calls, and this
// file's .cpp owns the event schema: how each effect is stored, and the
// readers below that find it again. After each commit it announces what
// another thread or process may wait for (wakeups.hpp).
//
// Group commit, as LevelDB's writer queue: a thread that writes joins a
// queue; the one at its front commits, in one transaction with one sync, the
// writes of everyone waiting behind it, then wakes them. Each write returns
// (and its caller may answer the agent) only after that commit: the
// acknowledgement still follows the durable row, and a second run's steps
// cost no second sync.
#pragma once

#include <condition_variable>
#include <deque>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/effects.hpp"
#include "storage/journal.hpp"

namespace cairn::engine {

using json = nlohmann::json;

// An event row as the journal keeps it.
struct event_row {
  std::string kind;
  json data;
  std::optional<std::uint64_t> seq;
};

class ledger {
 public:
  // Opens a connection of its own to the journal at `db`.
  explicit ledger(const std::filesystem::path& db, storage::journal_options options = {});
  ledger(const ledger&) = delete;
  ledger& operator=(const ledger&) = delete;

  const std::filesystem::path& path() const { return path_; }

  // Applies the effects of run `run_id` together: all of them or (when it
  // throws, as storage would) none. Durable when it returns.
  void apply(const std::string& run_id, const std::vector<effect>& effects);

  // The event an effect adds to the journal, if it adds one (a step adds a
  // step row; a child, a run). For the run's journal budget.
  static std::optional<event_row> event_of(const effect& e);

  // The journal's typed writes that answer something; each as storage's
  // call of the same name (journal.hpp), group-committed like apply.
  std::pair<storage::run_record, bool> create_run(const storage::new_run& run);
  bool claim_run(const std::string& id, const std::string& expected_owner, const std::string& new_owner);
  void confirm_held(const std::string& id);
  int begin_attempt(const std::string& id);
  storage::signal_record enqueue_signal(const std::string& run_id, const std::string& name, const json& payload,
                                        std::uint64_t max_signals);
  bool request_cancel(const std::string& id, const std::string& reason);
  bool cancel_idle_run(const std::string& id, const std::string& message);

 private:
  struct writer {
    std::function<void(storage::journal&)> body;
    std::exception_ptr error;
    bool done = false;
    std::condition_variable turn;
  };
  // Runs `body` on the writing connection within the next group commit.
  void write(std::function<void(storage::journal&)> body);
  // The run ended: whoever waits for it (its parent's join, a `cairn run`
  // following it) hears so, here and in other processes.
  void announce_end(const std::string& run_id, const std::string& parent_id);

  std::filesystem::path path_;
  storage::journal journal_;  // touched only by the writer at the queue's front
  std::mutex mutex_;
  std::deque<writer*> queue_;
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
