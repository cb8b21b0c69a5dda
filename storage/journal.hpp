// The journal: the durable record of runs, their steps and events, behind
// one interface of typed calls. Storage writes no event of its own: every
// event kind is declared, and written, by the engine's ledger
// (engine/event_schema.hpp); append_event stores what it is given. Its implementations keep one contract and
// pass one test suite (tests/storage): storage/sqlite/ (one SQLite database in
// WAL mode), storage/postgres/ (one PostgreSQL database), and the in-memory
// journal the engine's tests and simulator run on. open_journal picks one by
// the path's form. SQLiteCpp and libpq stay inside storage/; callers see only
// these types.
//
// Every JSON value is loaded within the bounds of what cairn writes
// (protocol::max_depth levels, protocol::default_max_frame bytes), so copying
// or printing a loaded value cannot exhaust the stack. A value beyond them
// (written by an older cairn or another program) is storage_error(unreadable)
// naming its run, or for a run's own fields run_record::unreadable: it stops
// that run, never the process.
//
// Threading: one journal object per thread. Many processes may open the same
// file; SQLite serializes their writers and readers never block a writer. On
// PostgreSQL each journal object is one connection; row locks serialize the
// writers of one run.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
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
  not_found,       // no such run (or signal); in read-only mode, no journal file yet
  finished,        // the run already ended (completed, failed or cancelled)
  fenced,          // another process took the run over: this journal object no longer holds it
  unreadable,      // a stored value of one run is invalid JSON, too deep or too long; the message names it
  limit_reached,   // a bound the caller gave refuses the write (e.g. how many signals a run may hold)
  unfinished,      // delete_run: the run, a child of it or its parent has not ended; the message says which
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

// waiting: suspended on a timer, a signal or a child run, with no owner; the
// run's `wait` says on what. completed, failed and cancelled are final ("the run
// has finished"). in_doubt: stopped because an at-most-once tool call may or
// may not have happened; `cairn settle` records what did, then the run can go on.
enum class run_status { pending, running, waiting, completed, failed, cancelled, in_doubt };
std::string_view to_string(run_status s);
std::optional<run_status> parse_run_status(std::string_view s);
// Whether a run has finished: completed, failed and cancelled are final.
// in_doubt is not: `cairn settle` records what its tool call did, and the
// run goes on. The one answer of every layer.
bool is_finished(run_status s);

// What a waiting run waits for. kind "timer": until wake_at_ms (required).
// "signal": a signal named `key`, or until wake_at_ms if set (a timeout).
// "child": the run whose id is `key` to finish, or until wake_at_ms if set.
struct wait_spec {
  std::string kind;
  std::string key;
  std::uint64_t seq = 0;  // the step the run waits at
  std::optional<std::int64_t> wake_at_ms;
};

struct run_record {
  std::string id;
  std::string agent;      // absolute path of the agent program
  json input;
  run_status status = run_status::pending;
  json output;                                 // when completed
  std::optional<protocol::error_info> error;   // when failed, cancelled or in_doubt
  int attempts = 0;                            // attempts started so far
  int max_attempts = 3;
  std::string owner;       // host process executing it ("" when none), see engine/owner.hpp
  std::int64_t epoch = 0;  // how many times the run was claimed; fences a stale owner's writes
  std::string sandbox;     // backend name: "bwrap" or "none"
  std::string workspace;   // host folder mounted at /workspace
  std::int64_t created_at_ms = 0;
  std::int64_t updated_at_ms = 0;
  std::optional<std::int64_t> finished_at_ms;
  json policy = json::object();  // what the run may do, see engine/policy.hpp
  std::string parent_id;           // the run that started this one as a child; "" for a top-level run
  std::optional<wait_spec> wait;   // set only while status is waiting
  std::optional<std::int64_t> cancel_requested_at_ms;
  std::string cancel_reason;  // what the request said ("" when none, or none was given)
  std::optional<std::int64_t> deadline_ms;  // the run's overall timeout
  // The machine whose disk holds the run's workspace ("" when the workspace
  // is on storage every worker reaches, or not assigned yet): only a worker
  // on that machine may execute the run. Set with the workspace.
  std::string workspace_host;
  // Why input, output or policy could not be loaded (that field is null
  // then); "" when all were. Such a run cannot be executed.
  std::string unreadable;
};

struct new_run {
  std::string id;
  std::string agent;
  json input = json::object();
  int max_attempts = 3;
  std::string sandbox = "bwrap";
  std::string workspace;
  json policy = json::object();
  std::string parent_id;  // "" for a top-level run
  std::string owner;      // initial owner, "" = none
  std::optional<std::int64_t> deadline_ms;
  std::string workspace_host;  // see run_record
};

// A step's journaled outcome. Written once, never changed.
struct step_record {
  std::string run_id;
  protocol::step_result result;
  std::int64_t started_at_ms = 0;   // host clock, when the agent announced the step (or derived)
  std::int64_t finished_at_ms = 0;  // host clock, when the result was committed
};

// A message sent to a run from outside. Delivered at most once, into the step
// at delivered_seq.
struct signal_record {
  std::int64_t id = 0;
  std::string run_id, name;
  json payload;
  std::int64_t sent_at_ms = 0;
  std::optional<std::uint64_t> delivered_seq;
  std::optional<std::int64_t> delivered_at_ms;
};

// A run as the scheduler sees it.
struct run_brief {
  std::string id;
  run_status status = run_status::pending;
  std::string owner;
  std::string parent_id;
  std::string workspace_host;
};

// What the journal's database occupies (journal::space).
struct journal_space {
  std::uint64_t bytes = 0;       // the database's size (SQLite: its pages; PostgreSQL: the database's)
  std::uint64_t free_bytes = 0;  // of those, left free by deleted rows and not yet given back (SQLite)
};

// A `cairn serve` process sharing the journal with others (a worker). Its id
// is its owner string (engine/owner.hpp): the runs it owns are the runs whose
// owner is that id. It holds them while its lease is current; once the lease
// has expired any other worker may take them over (claim_run with the id as
// expected owner), and the run's epoch fences every later write of the old one.
struct worker_record {
  std::string id;
  std::string host;            // the machine it runs on (where workspaces it made live)
  std::string workspace_root;  // "" or the shared folder its workspaces are made in
  std::int64_t started_at_ms = 0;
  std::int64_t renewed_at_ms = 0;
  std::int64_t lease_expires_at_ms = 0;
  std::int64_t fenced_writes = 0;  // writes of this worker the journal refused (stale epoch), as it last reported
  int runs = 0;                    // runs it owns now (filled in by workers() and find_worker())
};

// A piece of a workspace file as the journal stores it (put_blobs).
struct blob {
  std::string digest;      // "sha256:HEX" of the piece's bytes
  std::uint64_t size = 0;  // of the piece's bytes
  std::string data;        // as the engine stored them (compressed)
};

struct event_record {
  std::int64_t id = 0;
  std::string run_id;
  std::optional<std::uint64_t> seq;
  std::string kind;  // e.g. "attempt_started", "attempt_ended", "step_retry", "run_failed"
  json data;
  std::int64_t at_ms = 0;
};

// Which runs list_runs returns, newest first: all that match every field
// given, from the newest or from the one after `before`, at most `limit`.
struct run_query {
  std::optional<run_status> status;
  std::string agent;  // the agent's path, or its last components ("count.py", "agents/count.py")
  std::optional<std::int64_t> since_ms;  // created at or after
  std::string before;  // a run's id: the runs created before it (the next page); "" from the newest
  std::optional<std::int64_t> limit;  // at most this many (>= 0); none: all
};

// What journal::request_cancel did.
enum class cancel_mark { marked_now, marked_before, run_finished };

// full: a commit survives power loss. normal: it survives any process crash, but
// the last commits may be lost if the machine loses power.
enum class sync_mode { full, normal };

struct journal_options {
  sync_mode sync = sync_mode::full;
  std::chrono::milliseconds busy_timeout{5000};
  bool read_only = false;  // for inspection: never creates or migrates; no file is errc::not_found
};

// Which cairn ("cairn/0.1.0") created a journal and which last opened it to
// write. A journal created before journals said so has created_by "a cairn
// before 0.1.0 (schema N)"; "" where nothing was recorded yet.
struct journal_versions {
  std::string created_by;
  std::string last_written_by;
};

// "cairn/VERSION": how this cairn names itself in the journal.
std::string writer_name();

class journal {
 public:
  journal() = default;
  virtual ~journal() = default;
  journal(const journal&) = delete;
  journal& operator=(const journal&) = delete;

  virtual const std::filesystem::path& path() const = 0;
  virtual const journal_options& options() const = 0;
  // The schema version this cairn writes in this journal's backend (each
  // backend counts its own).
  virtual int schema_version() const = 0;
  // "sqlite", "postgresql" or "memory"; and the server's or library's
  // version ("PostgreSQL 15.18", "SQLite 3.40.1").
  virtual std::string_view backend() const = 0;
  virtual std::string server_version() = 0;
  virtual journal_versions versions() = 0;

  // Group commit: makes every write of `writes` (each calls this object's
  // write methods) in ONE transaction with one sync, each in a savepoint of
  // its own. A write that throws (conflict, fenced, finished, ...) is rolled
  // back alone and its exception is returned at its index; the others are
  // durable when this returns, with nullptr at theirs. When the transaction
  // itself cannot commit (a full disk, an I/O error, the lock held by another
  // process past busy_timeout), nothing of any write was kept and every index
  // holds that error. Claims and releases made inside take effect for the
  // fence only once committed.
  //
  // `sync_later`: the commit may skip its own sync (SQLite): every process
  // sees it at once, but a power cut before the next synced commit of the
  // journal (which syncs it too) forgets it. For writes nobody is answered
  // about, whose loss a restart repairs (a run's claim on its way in). On
  // PostgreSQL it is synced like any other.
  virtual std::vector<std::exception_ptr> write_together(std::span<const std::function<void(journal&)>> writes,
                                                 bool sync_later = false) = 0;

  // Inserts a pending run (with its parent, initial owner and deadline). If a
  // run with this id exists, returns it unchanged and false: the id is the
  // idempotency key.
  virtual std::pair<run_record, bool> create_run(const new_run& run) = 0;
  virtual std::optional<run_record> find_run(std::string_view id) = 0;
  // Newest first (creation time, then insertion order).
  std::vector<run_record> list_runs() { return list_runs(run_query{}); }
  // The runs `q` selects, newest first, found by the database.
  virtual std::vector<run_record> list_runs(const run_query& q) = 0;
  // The runs `parent_id` started as children, oldest first.
  virtual std::vector<run_record> children(std::string_view parent_id) = 0;
  // The runs whose workspace is `folder`, lies inside it or holds it
  // (comparing whole '/'-separated names), found by the database: what a
  // new workspace must not nest with, without reading every run.
  virtual std::vector<run_record> runs_with_workspace_near(const std::string& folder) = 0;

  // Writes to a run id that does not exist throw storage_error(not_found),
  // except claim_run, which returns false.

  // Compare-and-set of the owner: succeeds only if the run's owner is still
  // `expected_owner` and the run is neither completed nor cancelled. Sets
  // status running (also from waiting, clearing the wait) and counts one more
  // epoch. From then on this journal object holds the run at that epoch:
  // every write for the run made through it (begin_attempt, append_step,
  // append_event, deliver_signal, create_run of a child, finish_run,
  // suspend_run, release_run, reset_attempts) first checks, in the same
  // transaction, that the run's owner is still `new_owner` at that epoch, and
  // otherwise throws storage_error(fenced) without writing anything, for good:
  // a process that lost its run never writes to it again. finish_run,
  // suspend_run, release_run and reset_attempts end the hold. Requests from
  // outside (enqueue_signal, request_cancel, cancel_idle_run) and writes
  // through a journal object that never claimed the run are not fenced.
  virtual bool claim_run(std::string_view id, std::string_view expected_owner, std::string_view new_owner) = 0;
  // Throws storage_error(fenced) if this journal object held the run and
  // another process has taken it over since; for work outside the journal
  // (releasing the workspace) that must not happen to a run lost meanwhile.
  virtual void confirm_held(std::string_view id) = 0;
  // Counts one more attempt and returns its number (1-based).
  virtual int begin_attempt(std::string_view id) = 0;
  // Ends the run: completed with `output`; failed or cancelled with `error`
  // (required then); or stops it in_doubt with `error` (no finish time: it is
  // not over). Any other status is std::invalid_argument. Clears the owner and
  // the wait.
  virtual void finish_run(std::string_view id, run_status status, const json& output,
                  const std::optional<protocol::error_info>& error) = 0;
  // Makes a failed (or orphaned) run pending again with a fresh set of attempts:
  // clears output, error, owner, finish time, wait and cancel request, keeps
  // the steps.
  virtual void reset_attempts(std::string_view id) = 0;
  // Parks the run at step w.seq: status waiting with `w`, owner cleared. An
  // unknown kind, or a timer without wake_at_ms, is
  // std::invalid_argument; a finished run is storage_error(finished).
  virtual void suspend_run(std::string_view id, const wait_spec& w) = 0;
  // Hands the run back (a host shutting down): status pending, owner and wait
  // cleared. A finished run is storage_error(finished).
  virtual void release_run(std::string_view id) = 0;

  // Marks that someone asked to cancel the run, and why (run_record's
  // cancel_reason); the engine acts on it. Whether it marked it now, had
  // marked it before (the first reason stays), or the run has finished.
  virtual cancel_mark request_cancel(std::string_view id, std::string_view reason) = 0;
  // Compare-and-set: cancels the run only if it is pending or waiting and has
  // no owner: status cancelled, error {message, "cancelled"}, finish time set,
  // wait cleared. Returns whether it did.
  virtual bool cancel_idle_run(std::string_view id, const std::string& message) = 0;

  // Every run the scheduler may act on at `now_ms`, oldest first (creation
  // time, then insertion order): all pending and running runs (the caller
  // checks owners), and the waiting runs that can move: their wake time has
  // come, the signal they wait for is queued, the child they wait for has
  // finished, cancellation was requested, or their deadline has passed.
  // Costs in proportion to the unfinished runs, not to the whole history.
  virtual std::vector<run_brief> schedulable(std::int64_t now_ms) = 0;
  // The earliest time after `after_ms` at which a waiting run can move
  // without anyone doing anything: its wake time (timer, timeout) or its
  // deadline. nullopt when no waiting run has one. Runs that are not waiting
  // need none: a pending one is schedulable now and a running one's owner
  // watches its deadline. Reads two indexes, not the runs.
  virtual std::optional<std::int64_t> next_due_ms(std::int64_t after_ms) = 0;
  // How many runs have each status; every status is present, zero included.
  virtual std::map<run_status, int> count_by_status() = 0;

  // Queues a signal for the run and returns it. storage_error(not_found)
  // when there is no such run,
  // storage_error(finished) when it has finished, storage_error(limit_reached)
  // when the run already holds `max_signals` signals (delivered or not);
  // nothing is written then.
  virtual signal_record enqueue_signal(std::string_view run_id, std::string_view name, const json& payload,
                               std::uint64_t max_signals = UINT64_MAX) = 0;
  // The oldest undelivered signal of the run with this name.
  virtual std::optional<signal_record> pending_signal(std::string_view run_id, std::string_view name) = 0;
  // Whether pending_signal would find one (without loading its payload).
  virtual bool has_pending_signal(std::string_view run_id, std::string_view name) = 0;
  // In one transaction: marks the signal delivered at step.result.seq and
  // journals `step` (as append_step). A signal already delivered, or a step already journaled, is
  // storage_error(conflict) and nothing is written: each signal reaches
  // exactly one step. No such signal is storage_error(not_found); a signal of
  // another run than step.run_id is std::invalid_argument.
  virtual void deliver_signal(std::int64_t signal_id, const step_record& step) = 0;
  // The run's signals, delivered or not, oldest first.
  virtual std::vector<signal_record> signals(std::string_view run_id) = 0;

  // Inserts the step row. Throws storage_error(conflict) if (run, seq) exists,
  // even with the same content: the database refuses any rewrite of a step.
  // Returns only after the transaction is durable per the sync mode.
  virtual void append_step(const step_record& step) = 0;
  virtual std::vector<step_record> steps(std::string_view run_id) = 0;
  // The steps from from_seq up to (not including) end_seq, in order, as many
  // as fit in max_bytes (counted as bytes_of_run counts a step), but at least
  // one if there is one: a replay reads a history of any size in bounded chunks.
  virtual std::vector<step_record> steps_from(std::string_view run_id, std::uint64_t from_seq, std::uint64_t end_seq,
                                      std::uint64_t max_bytes) = 0;

  virtual void append_event(std::string_view run_id, std::string_view kind, const json& data,
                    std::optional<std::uint64_t> seq = std::nullopt) = 0;
  virtual std::vector<event_record> events(std::string_view run_id) = 0;
  // The run's events of these kinds, in order: what an attempt reads as it
  // begins, found by index (events_by_kind) however long the history.
  virtual std::vector<event_record> events_of_kinds(std::string_view run_id,
                                                    std::span<const std::string_view> kinds) = 0;
  // The run's events after the one whose id is `after_id` (0: from the
  // first), oldest first, as many as fit in max_bytes (their kind and data
  // as stored, payload bodies included), but at least one if there is one:
  // a reader shows a history of any size in bounded chunks.
  virtual std::vector<event_record> events_from(std::string_view run_id, std::int64_t after_id,
                                                std::uint64_t max_bytes) = 0;
  // The run's events at one seq, oldest first.
  virtual std::vector<event_record> events_at(std::string_view run_id, std::uint64_t seq) = 0;
  virtual std::uint64_t step_count(std::string_view run_id) = 0;
  // The bytes the run's steps and events occupy: each step's name, output
  // (its JSON text), error message and type; each event's kind and data
  // (payloads stored apart: once each, its digest and body). Kept on the
  // run as they are written, by the database itself, so it reads one row
  // however long the history.
  virtual std::uint64_t bytes_of_run(std::string_view run_id) = 0;

  // A run's state beside its history (Temporal's mutable state): what its
  // writer would otherwise derive again by scanning its events. The engine's
  // ledger owns its form (engine/run_state.hpp); storage keeps the JSON
  // object as given, one per run. A new run's is {}; nullopt for a run
  // written before the journal kept one (the ledger derives it then);
  // storage_error(not_found) when there is no such run. put_run_state is a
  // write like append_event: fenced by this object's claim.
  virtual std::optional<json> run_state(std::string_view run_id) = 0;
  virtual void put_run_state(std::string_view run_id, const json& state) = 0;

  // Gives a run created without a workspace (workspace "") its workspace
  // folder and the machine holding it ("" = shared storage), once: a fenced
  // write of the run's owner. A run whose workspace is already set is
  // storage_error(conflict) and nothing changes.
  virtual void assign_workspace(std::string_view id, const std::string& workspace, const std::string& workspace_host) = 0;

  // Retention. Deletes an ended run (completed, failed or cancelled) and
  // everything kept for it alone: its row, steps, events, signals, kept
  // state and payloads (stored per run, payloads.hpp), in one transaction;
  // returns the row as it was. Refused, with nothing deleted:
  // storage_error(not_found) for no such run; storage_error(unfinished)
  // for a run that has not ended or that a process holds (the message names
  // the owner), for one with a child that has not ended (it would outlive
  // the parent it reports to), and for a child whose parent has not ended
  // (the parent may still wait for it or read its result). A child that has
  // ended stays when its parent goes: it is a run of its own, as a
  // Temporal child workflow is an execution of its own, and retention
  // takes it by its own age and status. Not fenced: a request from outside.
  virtual run_record delete_run(std::string_view id) = 0;
  // The database's size and what deletes left free.
  virtual journal_space space() = 0;
  // Gives back to the file system at most about `max_bytes` of what deletes
  // left free, in one short write: call it again, in slices, until
  // free_bytes is 0 (SQLite's incremental_vacuum, then a checkpoint so the
  // file itself shrinks). PostgreSQL reuses freed space by itself
  // (autovacuum); there it runs a plain VACUUM of the journal's tables, so
  // the space is reusable at once, and writers are not blocked.
  virtual journal_space reclaim_space(std::uint64_t max_bytes) = 0;
  // Whether another connection committed to the journal since this object
  // last asked (the first time: since it opened): what tells a retention
  // pass that writers share the journal with it. SQLite: PRAGMA
  // data_version. PostgreSQL cannot tell without a query on every commit,
  // and answers true, as the memory journal does.
  virtual bool others_wrote() = 0;

  // Pieces of workspace files, stored by content and shared by every run
  // (engine/workspace_checkpoints.hpp; SQLite schema 9, PostgreSQL 10).
  // put_blobs stores `blobs` (a digest already held keeps its blob as it
  // is) and records that run `run_id` uses every digest of `used` (the
  // blobs' own and those other runs stored): delete_run deletes a blob when
  // the last run that used it goes. Writes of write_together's group, like
  // every write.
  virtual void put_blobs(std::string_view run_id, std::span<const blob> blobs, std::span<const std::string> used) = 0;
  // The blob stored under `digest`; nullopt when none is.
  virtual std::optional<blob> find_blob(std::string_view digest) = 0;

  // Workers and their leases. register_worker inserts the worker or replaces
  // its row (a restarted worker of the same id), and deletes the rows of
  // workers whose lease expired more than forgotten_worker_ms ago and that
  // hold no run (killed workers: a fleet that comes and goes would pile
  // them up, and every scheduler reads them all; `cairn workers` shows
  // them no more). renew_lease sets a new
  // expiry and the fenced-writes count; false when the row is gone or its
  // lease had already expired at now_ms() (the worker must assume its runs
  // were taken: it re-registers, and the fence refuses its stale writes).
  // remove_worker deletes the row (a worker shutting down, after handing its
  // runs back). workers() lists every row, oldest first, expired ones too.
  static constexpr std::int64_t forgotten_worker_ms = 300'000;  // 5 minutes
  virtual void register_worker(const worker_record& worker) = 0;
  virtual bool renew_lease(std::string_view worker_id, std::int64_t lease_expires_at_ms, std::int64_t fenced_writes) = 0;
  virtual void remove_worker(std::string_view worker_id) = 0;
  virtual std::vector<worker_record> workers() = 0;
  virtual std::optional<worker_record> find_worker(std::string_view worker_id) = 0;
};

// Opens (creating and migrating when writable) the journal at `path`: a
// SQLite file, or, when `path` is a URL "postgresql://..." (or
// "postgres://..."), a PostgreSQL database (libpq's URI syntax; read_only
// then never migrates and refuses writes). Throws storage_error with an
// actionable message.
std::unique_ptr<journal> open_journal(const std::filesystem::path& path, journal_options options = {});

// Whether `db` names a PostgreSQL database ("postgresql://..." or
// "postgres://...") rather than a SQLite file.
bool is_postgres_url(std::string_view db);

// `db` as it may be shown (messages, logs, `cairn doctor`): a URL's
// password, in its credentials or as ?password=, replaced by ***.
std::string without_password(const std::string& db);

// Milliseconds since the Unix epoch, the journal's time unit.
std::int64_t now_ms();
// A test seam: the clock now_ms() reads instead of the system's (the
// deterministic simulator's virtual time, tests/sim); null gives the
// system's back. cairn itself never sets it.
void set_now_ms_for_testing(std::int64_t (*clock)());

}  // namespace cairn::storage
