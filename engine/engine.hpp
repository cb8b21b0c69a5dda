// Runs: start, execute in a sandbox, checkpoint every step, retry a crashed
// sandbox from the journal, resume what a dead host process left behind;
// suspend a run that waits (timer, signal, child run) and wake it by replay;
// cancel. The engine writes the journal only through its ledger (the
// process's one writer, group-committing the writes of all its threads);
// runtime only reports.
#pragma once

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/attempt.hpp"
#include "engine/ledger.hpp"
#include "engine/policy.hpp"
#include "engine/tools/llm_chat.hpp"
#include "engine/wakeups.hpp"
#include "runtime/sandbox.hpp"
#include "storage/journal.hpp"

namespace cairn::engine {

using json = nlohmann::json;

enum class errc {
  not_found,  // no such run
  busy,       // a live process executes the run
  bad_request,
};

// Deepest signal payload a run accepts: it reaches the agent as the
// "payload" of a step's output, so four levels down in a replayed `start`.
inline constexpr std::size_t max_signal_depth = protocol::max_output_depth - 1;

class engine_error : public std::runtime_error {
 public:
  engine_error(errc code, const std::string& message) : std::runtime_error(message), code_(code) {}
  errc code() const { return code_; }

 private:
  errc code_;
};

// Creates the sandbox backend a run asked for ("bwrap" or "none").
using backend_factory = std::function<std::shared_ptr<runtime::sandbox_backend>(const std::string& name)>;
// `warm`: the bwrap backend's pool of ready sandboxes (none by default).
backend_factory default_backends(runtime::warm_pool_options warm = {});
// Each backend made once by `make` and shared by every engine given the
// result (the lanes of a scheduler share one warm pool).
backend_factory shared_backends(backend_factory make);

// What a host executes of what a shared journal's rows ask for. On a
// PostgreSQL journal whoever may write it could otherwise choose what runs on
// every worker and as whom: an agent without a sandbox, a command on the
// host, a folder of the worker's chowned to the sandbox uid. So a worker
// decides from its own configuration (`cairn --allow ...`), and checks every
// row at every attempt. A SQLite journal is a file of this user's
// (cli/home_trust.cpp): everything in it is this user's own choice.
struct host_allows {
  bool sandbox_none = false;   // runs with --sandbox none: the agent is this user, on this host
  bool command_tools = false;  // a policy's command tools, executed on this host
  bool any_workspace = false;  // a --workspace given at submit, outside the worker's root and home
};

struct engine_options {
  // CAIRN_HOME: every host file of a run lives under it (run_paths.hpp). Required.
  std::filesystem::path home;
  std::chrono::milliseconds hello_timeout{10'000};
  // Overrides the policy's retry.initial_ms (for tests).
  std::optional<std::chrono::milliseconds> retry_backoff;
  std::chrono::milliseconds exit_grace{2'000};   // after done/fail, for the agent to exit
  // A run that waits longer than this (a timer, a signal, a child run) is
  // suspended: its sandbox is deleted, its status is waiting, and it is
  // resumed by replay when the wait is over. Shorter waits keep the sandbox.
  std::chrono::milliseconds suspend_after{2'000};
  // Set when the host shuts down gracefully: a run between steps is handed
  // back at once (pending), one inside a step gets `drain` to finish it, a
  // waiting one is suspended. Whoever sets it calls wake_all()
  // (wakeups.hpp): waiting attempts see it at once.
  const std::atomic<bool>* stopping = nullptr;
  std::chrono::milliseconds drain{10'000};
  std::optional<llm_endpoint> llm;  // where llm.chat calls go; see llm_endpoint_from_host
  backend_factory backends = default_backends();
  // The process's one journal writer, shared by every engine of the process
  // so that their runs' steps commit together. Null: the engine opens its own.
  std::shared_ptr<cairn::engine::ledger> ledger;
  // Where this host makes the workspace of a run that has none yet (a run on
  // a PostgreSQL journal gets its workspace from the worker that first
  // executes it): WORKSPACE_ROOT/ID on storage every worker reaches, so any
  // worker may resume it; "" for HOME/workspaces/ID, on this machine only.
  std::filesystem::path workspace_root;
  // On a shared (PostgreSQL) journal: what this host executes of what rows ask.
  host_allows allow;
};

struct run_request {
  std::string id;  // empty: a new id is generated; else it must pass run_id_problem()
  std::filesystem::path agent;
  json input = json::object();
  std::filesystem::path workspace;  // empty: HOME/workspaces/RUN_ID; see checked_workspace()
  std::string sandbox = "bwrap";
  int max_attempts = 3;
  engine::policy policy = default_policy();
  // Who holds the run from the start ("" none: any host process may take it,
  // e.g. `cairn serve`); `cairn run` holds its own run.
  std::string owner;
};

// `cairn fork RUN --at SEQ`: a new run from another's journal up to a step.
struct fork_request {
  std::string from;       // the run forked
  std::uint64_t seq = 0;  // its last step the fork keeps
  std::string id;         // empty: a new id is generated; else it must pass run_id_problem()
  std::filesystem::path agent;  // empty: the program now at the path of `from`'s agent
  std::optional<json> input;    // none: the input of `from`
  // Held by this process, to execute next (execute()), as `cairn run`'s
  // run is; false: pending, for `cairn serve` or `cairn resume`.
  bool hold = true;
};

// What fork() made.
struct forked_run {
  storage::run_record run;
  // The fork's workspace holds `from`'s files at the step (its checkpoint);
  // false: `from` kept no workspace checkpoint there, and it starts empty.
  bool workspace_restored = false;
};

// What import_run() made.
struct imported_run {
  storage::run_record run;
  std::string from_run;               // its id in the archive
  storage::run_status exported_as{};  // its status when exported
  bool workspace_restored = false;    // its workspace holds its last checkpoint's files
};

// What `cairn settle` records for a tool call in doubt.
struct settlement {
  enum class how { result, error, retry };
  how outcome = how::retry;
  json result;        // for how::result: what the call returned
  std::string error;  // for how::error: why it failed
};

class engine {
 public:
  // `journal` (this thread's connection, for reading) must outlive the engine.
  engine(storage::journal& journal, engine_options options);

  // Records a pending run, or returns the existing one with this id. An id
  // or workspace that cannot be used, or an input deeper than
  // protocol::max_input_depth, is refused (bad_request).
  std::pair<storage::run_record, bool> submit(const run_request& request);
  // submit() of a run this process executes next (execute()), as `cairn run`
  // does: its owner is this process, so no other host takes it meanwhile,
  // and its creation commits without a sync of its own, like the take that
  // follows; the run's first synced write (its first step, its end, a crash
  // recorded) syncs them. A power cut before that forgets the run, which
  // nobody was told of as kept: started again with its id, it begins anew.
  std::pair<storage::run_record, bool> start(run_request request);
  // submit() of every request, in one transaction: all or nothing. Returns
  // each run's id and whether it was created (an id that exists: left as it
  // is), in the order of `requests`. A request submit() would refuse, a workspace
  // given (runs that start together must not share or nest their folders:
  // each gets HOME/workspaces/ID) or an id given twice refuses the whole
  // batch (bad_request, naming the request by its 1-based place) and
  // nothing is written.
  std::vector<submitted_run> submit_many(std::vector<run_request> requests);

  // Drives the run to its end (completed or failed) in this process and
  // returns the final record. A run owned by a live process is refused
  // (errc::busy); one owned by a dead process is taken over. If another
  // process takes the run over meanwhile, its sandbox is killed and this is
  // errc::busy too, with nothing more written. A failed run is
  // given a fresh set of attempts. A completed run is returned as it is.
  // A run whose next step is an at-most-once tool call that was started but
  // never recorded stops in_doubt instead (see settle).
  // With `revive_failed` false a failed or in-doubt run is returned as it is
  // (a scheduler must never restart what stopped; `cairn resume` may).
  // A run whose journal holds a value cairn cannot load (storage's
  // errc::unreadable) fails with error type "journal"; other runs go on.
  storage::run_record execute(const std::string& run_id, run_observer* observer = nullptr, bool revive_failed = true);
  // The same as a coroutine, for an event loop that carries many runs: it
  // suspends where execute() would block. The engine is not thread-safe:
  // the runs of one engine share one thread.
  task<storage::run_record> execute_async(std::string run_id, run_observer* observer, bool revive_failed);

  // Records the outcome of the in-doubt call at `seq` (or that it is to be
  // made again) and makes the run pending, ready for execute. Refused
  // (bad_request) unless that call is the one in doubt, or when the result
  // nests deeper than protocol::max_output_depth; busy while a live process
  // executes the run.
  storage::run_record settle(const std::string& run_id, std::uint64_t seq, const settlement& s);

  // A new run whose journal is run `from`'s up to and including step `seq`
  // (ledger::fork_run says what is copied) and whose workspace is `from`'s
  // checkpoint at that step (workspace_checkpoints.hpp), written before the
  // fork can be executed. Executed, it replays that prefix (no step, tool or
  // model call of it runs again; the usual non-determinism checks hold the
  // agent to it) and goes on. Its origin is journaled on both runs
  // (forked_from, fork_made). A fork is not a child: it shares the
  // children `from` started in the prefix through their journaled steps,
  // and may join them. `from` may still be running: its prefix is durable.
  // Refused (bad_request; not_found for no run `from`) with nothing
  // written: an id that is invalid or exists, a step past `from`'s last, a
  // tool call in doubt at or before `seq` (settle it first), an input or
  // agent submit() would refuse. When the workspace cannot be restored the
  // fork is left failed, saying why, and this throws.
  forked_run fork(const fork_request& request);

  // `cairn import`: the run of the archive read from `fd` (`cairn export`,
  // run_archive.hpp), checked whole before anything is written, then
  // written in one transaction (ledger::import_run) under its own id or
  // `id`, with its workspace folder (HOME/workspaces/ID, or the shared
  // root's) holding its latest checkpoint's files, made just before. An
  // ended, waiting or in-doubt run keeps its status; one exported pending
  // or running is pending with no owner (cairn resume or serve goes on
  // with it). It is no child here (its parent was not exported), and child
  // runs it started are not imported: its steps that joined them keep their
  // results. Refused (bad_request), with nothing written: an archive that
  // is truncated, altered, hostile or of a newer format (read_run_archive),
  // an invalid id or one that exists, a workspace folder already there.
  imported_run import_run(int fd, const std::string& id);

  // Makes a failed run pending again with a fresh set of attempts (its steps
  // kept) and returns it; any other run is returned as it is. busy while a
  // live process executes it.
  storage::run_record reopen(const std::string& run_id);

  // `cairn resume RUN --agent PATH`: the agent at `program`, identified and
  // kept (agent_versions.hpp), is the version the run executes from now on;
  // journaled as agent_replaced. Returns a line that says what it replaced.
  // Refused (bad_request) for a run that has ended or a program that cannot
  // be read; not_found, busy as reopen.
  std::string replace_agent(const std::string& run_id, const std::filesystem::path& program);

  // Runs left unfinished by host processes that have died, oldest first,
  // plus pending runs nobody has started and waiting runs whose wait is over
  // (a timer that came due while no host was up).
  std::vector<storage::run_record> orphaned_runs();

  // Queues signal `name` for the run and returns it; the run gets it (once)
  // from ctx.wait_signal(name). Refused (bad_request), with nothing stored,
  // for a run that has ended, a payload deeper than max_signal_depth or
  // larger than the run's limits.signal_kb, or a run that already holds
  // limits.signals signals; not_found for an unknown run.
  storage::signal_record signal(const std::string& run_id, const std::string& name, const json& payload);

  // What cancel() did.
  enum class cancel_outcome {
    cancelled,  // the run held no sandbox: it is cancelled now
    requested,  // a live process runs it: it tells the agent, and kills the sandbox after the grace period
  };
  // Cancels the run and, when it ends, its unfinished children. Refused
  // (bad_request) for a run that has already ended. Blocks (on an event
  // loop of its own), like execute().
  cancel_outcome cancel(const std::string& run_id, const std::string& reason);

  storage::journal& journal() { return journal_; }

  // Releases into their plain folders the files of ended runs whose quota
  // images are still in this host's folders (HOME/images, ROOT/.images): a
  // run cancelled while suspended by a process that does not hold its files,
  // or a release a crash cut short. Returns how many images went.
  std::size_t release_ended_runs();
  // The same for one ended run (`cairn resume RUN`); why its files stay in
  // its image, when they do. Nothing for a run that has not ended.
  std::optional<std::string> release_ended_run(const std::string& run_id);

 private:
  // The run, when no live process other than this one executes it: else
  // busy (not_found when there is none).
  storage::run_record idle_run(const std::string& run_id);
  // The row submit() inserts for `request`; throws what submit() refuses.
  storage::new_run new_run_of(run_request request);
  // For a run whose files this host writes before it is executed (a fork's,
  // an import's): its workspace folder now, when new_run_of left it to the
  // worker that first executes it (a shared journal).
  void give_workspace_now(storage::new_run& run);
  // drive_run() but for a run whose stored data cannot be read (storage_error(unreadable)).
  task<storage::run_record> execute_run(const std::string& run_id, run_observer& watch, bool revive_failed);
  // Backends are made once per engine: making one checks the bwrap version
  // and sweeps orphaned sandboxes.
  runtime::sandbox_backend& backend(const std::string& name);
  // execute() but for a run taken over meanwhile, which throws
  // storage_error(fenced); a run whose stored data cannot be read ends failed.
  task<storage::run_record> drive_run(const std::string& run_id, run_observer* observer, bool revive_failed);
  const std::filesystem::path& home() const;
  attempt_options attempt_options_of(const storage::run_record& run) const;
  // engine_options::workspace_root made canonical, as the workspaces in it are.
  std::filesystem::path workspace_root() const;
  // Where this worker keeps the run's quota image (run_paths.hpp).
  std::filesystem::path image_of(const storage::run_record& run) const;
  // Why this worker cannot reach the run's files (its workspace is another
  // worker's, or missing here though steps were committed), or nullopt.
  std::optional<std::string> unreachable(const storage::run_record& run);
  // Why this host does not execute the run as its row asks (host_allows), or
  // nullopt; always nullopt on a SQLite journal.
  std::optional<std::string> not_allowed(const storage::run_record& run, const policy& rules) const;
  // Whether this host may release the run's files: it reaches them, and on a
  // shared journal made them (its own home's folder, or beside its image).
  bool files_are_ours(const storage::run_record& run);
  // Readies the shared root for a run whose workspace lies there, moving its
  // image there from where an older cairn kept it (HOME/images); throws
  // engine_error(busy) naming the image when it cannot be moved.
  void ready_run_files(const storage::run_record& run);
  // Gives a run created without a workspace its own, on this host
  // (engine_options::workspace_root), before its first sandbox.
  task<void> assign_workspace(const storage::run_record& run);
  ledger::workspace_assignment workspace_for(const storage::run_record& run);
  // Claims the run, gives it a workspace when it has none and begins its
  // first attempt, in one commit; returns the attempt's number.
  task<int> take_run(const storage::run_record& run);
  // Whether the run must end rather than begin an attempt (a cancel asked
  // for, its deadline passed, a tool call in doubt), and the ending itself:
  // nullopt when the run may go on.
  bool must_end_before_attempt(const storage::run_record& run);
  task<std::optional<storage::run_record>> end_before_attempt(const storage::run_record& run, const policy& rules,
                                                               run_observer& watch);
  // Records the end, releases the workspace, cancels unfinished children.
  // `error` is why it did not complete (none when it did).
  // `release_files` false: the run's workspace is not touched (a row this
  // host refused to trust names it).
  task<storage::run_record> end_run(const std::string& run_id, storage::run_status status, json output,
                                    protocol::error_info error, run_observer& watch, bool release_files = true);
  void release_workspace(runtime::sandbox_backend& sandboxes, const storage::run_record& run, run_observer& watch);
  // cancel() as a coroutine: end_run cancels children on the event loop
  // that ends their parent, with no loop nested in it.
  task<cancel_outcome> cancel_async(std::string run_id, std::string reason);
  task<void> cancel_children(std::string run_id, std::string reason);
  // Sleeps `delay` unless the host starts shutting down (then false).
  task<bool> pause(std::chrono::milliseconds delay, const std::string& run_id);

  storage::journal& journal_;
  engine_options options_;
  std::shared_ptr<cairn::engine::ledger> ledger_;
  std::map<std::string, std::shared_ptr<runtime::sandbox_backend>> backends_;
  // Made at the first attempt and kept: a listener is a thread and a socket,
  // which each attempt of a program that executes runs one after the other
  // would otherwise make and remove again.
  std::optional<wake_listening> listening_;
  std::set<std::string> refused_;  // runs whose refusal (unreachable()) this engine journaled
};

// Can a waiting run move now (its timer is due, its signal is queued or timed
// out, its child ended, it was cancelled or ran out of time)?
bool wait_is_over(storage::journal& journal, const storage::run_record& run);

// Whether executing `run` now has anything to do: it has not ended (a failed
// or in-doubt one counts only when revived, as `cairn resume` does) and, if
// it waits, its wait is over. execute_run's first look, and tests/sim's.
bool needs_execution(storage::journal& journal, const storage::run_record& run, bool revive_failed);

// A fresh run id: "run-" and 12 hex digits.
std::string new_run_id();

}  // namespace cairn::engine
