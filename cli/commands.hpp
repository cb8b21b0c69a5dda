// The `cairn` subcommands. Each returns the process exit code:
// 0 success (run completed), 1 the run failed, 2 bad usage or input,
// 3 the environment is broken (journal, sandbox), 4 the run is busy elsewhere.
#pragma once

#include <string>

#include "cli/paths.hpp"
#include "engine/engine.hpp"
#include "engine/retention.hpp"

namespace cairn::cli {

struct run_args {
  std::string agent;
  std::string input = "{}";
  std::string id;
  std::string workspace;
  std::string sandbox = "bwrap";
  int max_attempts = 3;
  std::string policy;  // file; empty: the default policy
  std::string from;    // submit only: a batch file (cli/batch_file.hpp), "-" stdin; empty: one run
};

struct settle_args {
  std::string run_id;
  std::uint64_t seq = 0;
  std::string result;  // JSON, for --result
  std::string error;   // for --error
  bool retry = false;
};

int run_command(const paths& p, const run_args& args, bool as_json);
// `agent`: `cairn resume RUN --agent PATH`, the run resumes on that agent ("" for its own version).
int resume_command(const paths& p, const std::string& run_id, bool all, const std::string& agent, bool as_json);
// `cairn fork RUN --at SEQ` (cli/fork_command.cpp).
struct fork_args {
  std::string run_id;
  std::uint64_t seq = 0;
  std::string id;
  std::string agent;
  std::optional<std::string> input;  // JSON; none: the run's own
  bool detach = false;               // leave the fork pending instead of executing it here
};
int fork_command(const paths& p, const fork_args& args, bool as_json);
// `cairn export RUN [-o FILE]` and `cairn import FILE [--id NEW]`
// (cli/archive_commands.cpp). `output` "": stdout; `file` "-": stdin.
int export_command(const paths& p, const std::string& run_id, const std::string& output);
int import_command(const paths& p, const std::string& file, const std::string& id, bool as_json);
// `cairn workers`: the workers sharing the journal, their leases and runs.
// `all`: also the dead workers a registering worker forgets (forgettable()).
int workers_command(const paths& p, bool all, bool as_json);
// `cairn ls`: its filters, as given (checked by ls_command).
struct ls_args {
  std::string status, agent, since, before;
  std::optional<std::int64_t> limit;
};
int ls_command(const paths& p, const ls_args& args, bool as_json);
// `cairn logs`: a run's journal and its agent's output (cli/logs_command.cpp).
struct logs_args {
  std::string run_id;
  bool follow = false;
  std::optional<std::uint64_t> tail;  // the last N entries of the journal and lines of output
};
int logs_command(const paths& p, const logs_args& args, bool as_json);
int show_command(const paths& p, const std::string& run_id, bool as_json);
int doctor_command(const paths& p, bool as_json);
// Lists the files of a run's workspace under `path` ("" all), or prints the
// file `path`; never wakes the run (see engine/workspace_files.hpp).
int workspace_command(const paths& p, const std::string& run_id, const std::string& path, bool as_json);
// The files of a run's checkpoint after step `seq`, and what changed between two steps.
int workspace_at_command(const paths& p, const std::string& run_id, std::uint64_t seq, const std::string& path,
                         bool as_json);
int diff_command(const paths& p, const std::string& run_id, std::uint64_t from, std::uint64_t to, bool as_json);
int settle_command(const paths& p, const settle_args& args, bool as_json);

// retention_commands.cpp: removing ended runs and their files.
int rm_command(const paths& p, const std::vector<std::string>& run_ids, bool as_json);
// `cairn gc` and the retention settings of `cairn serve`, as given.
struct gc_args {
  std::string older_than;             // a time ago ("30d") or a UTC date; "" any age
  std::vector<std::string> statuses;  // ended statuses; none: all three
  std::optional<std::size_t> keep_last;
  bool dry_run = false;
};
// The rule `args` says; engine_error(bad_request) naming the bad option.
engine::retention_rule retention_rule_of(const gc_args& args, std::int64_t now_ms);
int gc_command(const paths& p, const gc_args& args, bool as_json);

// queue_commands.cpp: the daemon and what talks to runs it may hold.
struct serve_args {
  int max_concurrent = 8;
  int suspend_after_ms = 2000;
  bool verbose = false;  // every step, not only each run's start and end
  int warm = 0;          // pooled sandboxes (runtime::warm_pool_options)
  std::string warm_policy;  // whose limits they get; empty: the default policy
  bool prestart = false;    // pooled sandboxes start the agent too (warm_pool_options::start_agents)
  int lease_seconds = 15;   // how long the worker's lease lasts unrenewed (engine/worker_lease.hpp)
  std::string workspace_root;  // shared storage for workspaces of runs made without one; empty: CAIRN_HOME's
  std::string log_format = "text";  // or "json": one object per line (time, level, event, run, message)
  std::string log_level = "info";   // the least level logged: debug, info, warn, error (--verbose: debug)
  std::string config_file;          // --config: read again at SIGHUP for what can change live (the log's and retention's settings)
  // [serve.retention]: ended runs removed in the background, every
  // `retention_every`; none unless one of the rule's fields is given.
  gc_args retention;
  std::string retention_every = "10m";
};
int submit_command(const paths& p, const run_args& args, bool as_json);
// `cairn submit --from`: every run of the batch file args.from, queued in one transaction.
int submit_batch_command(const paths& p, const run_args& args, bool as_json);
int serve_command(const paths& p, const serve_args& args);
int signal_command(const paths& p, const std::string& run_id, const std::string& name, const std::string& data,
                   bool as_json);
int cancel_command(const paths& p, const std::string& run_id, const std::string& reason, bool wait, bool as_json);

}  // namespace cairn::cli
