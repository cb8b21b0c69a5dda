// The journal: the durable record of runs, their steps and events, in one
// SQLite database (WAL mode). The schema and its migrations are at the top of
// journal.cpp. SQLiteCpp stays inside storage/; callers see only these types.
//
// Threading: one journal object per thread. Many processes may open the same
// file; SQLite serializes their writers and readers never block a writer.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "protocol/messages.hpp"

namespace cairn::storage {

using json = nlohmann::json;

enum class errc {
  locked,          // another process holds the write lock past busy_timeout
  read_only,       // the file or its folder cannot be written
  disk_full,       // SQLITE_FULL: nothing of the failed transaction was kept
  corrupt,         // not a journal, or damaged
  schema_too_new,  // written by a newer cairn
  conflict,        // a write-once row already exists
  not_found,       // no such run; in read-only mode, no journal file yet
  io,              // any other failure to open, read or write
};

// A journal operation failed; the message says what to do about it. The failed
// transaction was rolled back: nothing is half-written.
class storage_error : public std::runtime_error {
 public:
  storage_error(errc code, const std::string& message) : std::runtime_error(message), code_(code) {}
  errc code() const { return code_; }

 private:
  errc code_;
};

// in_doubt: stopped because an at-most-once tool call may or may not have
// happened; `cairn settle` records what did, then the run can go on.
enum class run_status { pending, running, completed, failed, in_doubt };
std::string_view to_string(run_status s);
std::optional<run_status> parse_run_status(std::string_view s);

struct run_record {
  std::string id;
  std::string agent;      // absolute path of the agent program
  json input;
  run_status status = run_status::pending;
  json output;                                 // when completed
  std::optional<protocol::error_info> error;   // when failed
  int attempts = 0;                            // attempts started so far
  int max_attempts = 3;
  std::string owner;       // host process executing it ("" when none), see engine/owner.hpp
  std::string sandbox;     // backend name: "bwrap" or "none"
  std::string workspace;   // host folder mounted at /workspace
  std::int64_t created_at_ms = 0;
  std::int64_t updated_at_ms = 0;
  std::optional<std::int64_t> finished_at_ms;
  json policy = json::object();  // what the run may do, see engine/policy.hpp
};

struct new_run {
  std::string id;
  std::string agent;
  json input = json::object();
  int max_attempts = 3;
  std::string sandbox = "bwrap";
  std::string workspace;
  json policy = json::object();
};

// A step's journaled outcome. Written once, never changed.
struct step_record {
  std::string run_id;
  protocol::step_result result;
  std::int64_t started_at_ms = 0;   // host clock, when the agent announced the step (or derived)
  std::int64_t finished_at_ms = 0;  // host clock, when the result was committed
};

struct event_record {
  std::int64_t id = 0;
  std::string run_id;
  std::optional<std::uint64_t> seq;
  std::string kind;  // e.g. "attempt_started", "attempt_ended", "step_retry", "run_failed"
  json data;
  std::int64_t at_ms = 0;
};

// full: a commit survives power loss. normal: it survives any process crash, but
// the last commits may be lost if the machine loses power.
enum class sync_mode { full, normal };

struct journal_options {
  sync_mode sync = sync_mode::full;
  std::chrono::milliseconds busy_timeout{5000};
  bool read_only = false;  // for inspection: never creates or migrates; no file is errc::not_found
};

class journal {
 public:
  // Opens (creating and migrating when writable) the journal at `path`.
  // Throws storage_error with an actionable message.
  explicit journal(const std::filesystem::path& path, journal_options options = {});
  ~journal();
  journal(const journal&) = delete;
  journal& operator=(const journal&) = delete;

  const std::filesystem::path& path() const;
  static int schema_version();

  // Inserts a pending run. If a run with this id exists, returns it unchanged
  // and false: the id is the idempotency key.
  std::pair<run_record, bool> create_run(const new_run& run);
  std::optional<run_record> find_run(std::string_view id);
  // Newest first (creation time, then insertion order).
  std::vector<run_record> list_runs();

  // Writes to a run id that does not exist throw storage_error(not_found),
  // except claim_run, which returns false.

  // Compare-and-set of the owner: succeeds only if the run's owner is still
  // `expected_owner` and the run is not completed. Sets status running.
  bool claim_run(std::string_view id, std::string_view expected_owner, std::string_view new_owner);
  // Counts one more attempt and returns its number (1-based); records an event.
  int begin_attempt(std::string_view id);
  // Ends the run: completed with `output`, or failed with `error` (required then);
  // or stops it in_doubt with `error` (no finish time: it is not over). Any
  // other status is std::invalid_argument. Clears the owner; records an event.
  void finish_run(std::string_view id, run_status status, const json& output,
                  const std::optional<protocol::error_info>& error);
  // Makes a failed (or orphaned) run pending again with a fresh set of attempts:
  // clears output, error, owner and finish time, keeps the steps, records an event.
  void reset_attempts(std::string_view id);

  // Inserts the step row. Throws storage_error(conflict) if (run, seq) exists,
  // even with the same content: the database refuses any rewrite of a step.
  // Returns only after the transaction is durable per the sync mode.
  void append_step(const step_record& step);
  std::vector<step_record> steps(std::string_view run_id);

  void append_event(std::string_view run_id, std::string_view kind, const json& data,
                    std::optional<std::uint64_t> seq = std::nullopt);
  std::vector<event_record> events(std::string_view run_id);
  // The run's events at one seq, oldest first.
  std::vector<event_record> events_at(std::string_view run_id, std::uint64_t seq);
  std::uint64_t step_count(std::string_view run_id);

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

// Milliseconds since the Unix epoch, the journal's time unit.
std::int64_t now_ms();

}  // namespace cairn::storage
