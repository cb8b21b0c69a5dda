#include <sys/stat.h>

#include <iostream>
#include <optional>
#include <string>
#include <string_view>

#include <CLI/CLI.hpp>

#include "cli/commands.hpp"
#include "cli/format.hpp"
#include "cli/home_trust.hpp"
#include "engine/host_memory.hpp"
#include "protocol/messages.hpp"
#include "protocol/version.hpp"
#include "storage/postgres/postgres_journal.hpp"
#include "storage/sqlite/sqlite_journal.hpp"

namespace {

using json = nlohmann::json;

// What `cairn run` and `cairn submit` take: the agent and how to run it.
// A value that is a path is named FILE or DIR: --help shows it, and the shell
// completions (scripts/completions.py) complete it as one.
void add_run_options(CLI::App* cmd, cairn::cli::run_args& args) {
  cmd->add_option("agent", args.agent, "the agent program (built with the cairn SDK)")
      ->required()
      ->type_name("FILE");
  cmd->add_option("--input", args.input, "the run's input, a JSON value");
  cmd->add_option("--id", args.id, "run id; also the idempotency key (default: generated); letters, digits, '.', "
                                   "'_', '-', at most 128");
  cmd->add_option("--workspace", args.workspace, "host folder mounted at /workspace (default $CAIRN_HOME/workspaces/ID)")
      ->type_name("DIR");
  cmd->add_option("--sandbox", args.sandbox, "bwrap (default) or none (no isolation)")
      ->check(CLI::IsMember({"bwrap", "none"}));
  cmd->add_option("--max-attempts", args.max_attempts, "sandbox crashes tolerated before the run fails")
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--policy", args.policy, "policy file: the tools the run may call, its limits (default: no "
                                           "tools, no network)")
      ->type_name("FILE");
}


// `cairn --version` (or -V), before any subcommand: the version, and the
// protocol and journal schemas it speaks; with --json as JSON. Exit 0.
int print_version(bool as_json) {
  const json v = {{"cairn", cairn::protocol::cairn_version()},
                  {"protocol", cairn::protocol::version},
                  {"journal_schema",
                   {{"sqlite", cairn::storage::sqlite::schema_version()},
                    {"postgresql", cairn::storage::postgres::schema_version()}}}};
  if (as_json) std::cout << v.dump(2) << std::endl;
  else
    std::cout << "cairn " << cairn::protocol::cairn_version() << "\nprotocol v" << cairn::protocol::version
              << ", journal schema v" << v["journal_schema"]["sqlite"] << " (SQLite), v"
              << v["journal_schema"]["postgresql"] << " (PostgreSQL)" << std::endl;
  return 0;
}

}  // namespace

namespace {

// The first word of the command line that is no option nor an option's
// value, when it names no subcommand of `app`; nullopt when it names one
// (or there is none: CLI11 says what is missing).
std::optional<std::string> unknown_command(CLI::App& app, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view word = argv[i];
    if (word == "--") return std::nullopt;
    if (word.starts_with("-")) {
      // The options of the top level that take a value as the next word.
      if (word == "--db" || word == "--allow" || word == "--config") ++i;
      continue;
    }
    for (const auto* sub : app.get_subcommands([](const CLI::App*) { return true; }))
      if (sub->check_name(std::string(word))) return std::nullopt;
    return std::string(word);
  }
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  cairn::engine::keep_heap_for_runs();
  if (argc >= 2 && (std::string_view(argv[1]) == "--version" || std::string_view(argv[1]) == "-V")) {
    bool as_json = false;
    for (int i = 2; i < argc; ++i) as_json |= std::string_view(argv[i]) == "--json";
    return print_version(as_json);
  }
  CLI::App app{"cairn: durable, sandboxed AI agent workflows"};
  app.require_subcommand(1);
  // A key of --config that no option has (a typo) is an error, not ignored; subcommands inherit it.
  app.allow_config_extras(CLI::config_extras_mode::error);
  // Taken before parsing (print_version); here so that --help lists it.
  app.add_flag("-V,--version", "print cairn's version, protocol and journal schemas (with --json: as JSON), then exit");
  std::string db;
  bool as_json = false;
  app.add_option("--db", db, "journal database (default $CAIRN_HOME/cairn.db, CAIRN_HOME defaults to ./.cairn)")
      ->envname("CAIRN_DB");
  std::vector<std::string> allow;
  app.add_option("--allow", allow,
                 "on a shared (PostgreSQL) journal, what this host also executes when a run asks for it: "
                 "sandbox-none, command-tools, any-workspace (comma-separated; default none of them)")
      ->delimiter(',')
      ->check(CLI::IsMember({"sandbox-none", "command-tools", "any-workspace"}))
      ->envname("CAIRN_ALLOW");
  // Options from a file, for a service (packaging/cairn.service): the global
  // ones at its top (db, allow), a subcommand's in its section ([serve]);
  // what the command line gives wins.
  app.set_config("--config", "",
                 "read options from a TOML file: db and allow at the top, serve's under [serve] "
                 "(max-concurrent = 16, log-format = \"json\", ...); the command line wins")
      ->check(CLI::ExistingFile);
  // Global options are taken after the subcommand too: `cairn run AGENT --db X`.
  app.fallthrough();
  // Every usage error says where the usage is.
  app.failure_message([](const CLI::App* top, const CLI::Error& e) {
    std::string command = "cairn";
    for (const CLI::App* sub = top; !sub->get_subcommands().empty();) {
      sub = sub->get_subcommands().front();
      command += " " + sub->get_name();
    }
    return "cairn: " + std::string(e.what()) + "\nRun '" + command + " --help' for what it takes.\n";
  });

  cairn::cli::run_args run;
  auto* run_cmd = app.add_subcommand("run", "start a run of AGENT and follow it to the end");
  add_run_options(run_cmd, run);
  run_cmd->add_flag("--json", as_json, "print the final run as JSON instead of progress");

  cairn::cli::run_args submit;
  auto* submit_cmd = app.add_subcommand("submit", "queue a run of AGENT for `cairn serve` and print its id at once");
  add_run_options(submit_cmd, submit);
  submit_cmd->add_flag("--json", as_json, "print the queued run as JSON instead of its id (with --from: an array of "
                                          "the runs, each with \"created\": false when its id existed already)");
  submit_cmd
      ->add_option("--from", submit.from,
                   "queue many runs of AGENT in one transaction, all or none: one per line of this JSON Lines file "
                   "(- for stdin). A line is the run's input, or {\"input\": ..., \"id\": \"...\"} when it has "
                   "the key \"input\" (id optional, as --id); blank lines are skipped. Prints one run id per line. "
                   "At most 10,000 runs and 64 MiB per file")
      ->type_name("FILE")
      ->excludes(submit_cmd->get_option("--input"))
      ->excludes(submit_cmd->get_option("--id"))
      ->excludes(submit_cmd->get_option("--workspace"));

  cairn::cli::serve_args serve;
  auto* serve_cmd = app.add_subcommand("serve", "the daemon: run submitted runs, fire timers, deliver signals, "
                                                "resume what a dead host left");
  serve_cmd->add_option("--max-concurrent", serve.max_concurrent, "runs executed at once (default 8)")
      ->check(CLI::Range(1, 4096));
  serve_cmd->add_option("--suspend-after", serve.suspend_after_ms,
                        "ms a run may wait (timer, signal, child) before its sandbox is deleted (default 2000)")
      ->check(CLI::Range(0, 86'400'000));
  auto* warm_option = serve_cmd->add_option("--warm", serve.warm,
                        "sandboxes kept ready for runs to take (default 0); runs whose limits differ from the "
                        "pool's start cold")
      ->check(CLI::Range(0, 1024));
  serve_cmd->add_option("--warm-policy", serve.warm_policy,
                        "a policy file whose limits the pooled sandboxes get (default: the default policy's)")
      ->check(CLI::ExistingFile);
  serve_cmd->add_flag("--prestart", serve.prestart,
                      "with --warm: each pooled sandbox also starts the agent of the last new run, which then waits "
                      "for its run, so that agent's next runs skip its start (exec, loading, imports); such an agent "
                      "learns its run id from the start message only, not from CAIRN_RUN_ID")
      ->needs(warm_option);
  serve_cmd->add_flag("--verbose", serve.verbose, "log every step, not only each run's start and end (--log-level debug)");
  serve_cmd->add_option("--log-format", serve.log_format,
                        "text (default) or json: one object per line with time, level, event, run and message")
      ->check(CLI::IsMember({"text", "json"}));
  serve_cmd->add_option("--log-level", serve.log_level, "the least level logged: debug, info (default), warn, error")
      ->check(CLI::IsMember({"debug", "info", "warn", "error"}));
  serve_cmd->add_option("--lease", serve.lease_seconds,
                        "seconds this worker's lease lasts unrenewed (default 15): once it has expired (the "
                        "process died, was paused or cut off), other workers on the journal take its runs over")
      ->check(CLI::Range(1, 3600));
  serve_cmd->add_option("--workspace-root", serve.workspace_root,
                        "a folder on storage every worker reaches: workspaces this worker assigns are made there, "
                        "so any worker may resume their runs (default: $CAIRN_HOME/workspaces, this machine only)")
      ->type_name("DIR");

  std::string signal_run, signal_name, signal_data = "null";
  auto* signal_cmd = app.add_subcommand("signal", "send a signal to a run (ctx.wait_signal); queued until it waits");
  signal_cmd->add_option("run", signal_run, "run id")->required();
  signal_cmd->add_option("name", signal_name, "signal name, e.g. approval")->required();
  signal_cmd->add_option("--data", signal_data, "the payload, a JSON value (default null)");
  signal_cmd->add_flag("--json", as_json, "print the queued signal as JSON");

  std::string cancel_run, cancel_reason = "cancelled with `cairn cancel`";
  bool cancel_no_wait = false;
  auto* cancel_cmd = app.add_subcommand("cancel", "cancel a run and its children: the agent is told, then killed "
                                                  "after its grace period");
  cancel_cmd->add_option("run", cancel_run, "run id")->required();
  cancel_cmd->add_option("--reason", cancel_reason, "what the agent and the journal are told");
  cancel_cmd->add_flag("--no-wait", cancel_no_wait, "return once the cancel is requested");
  cancel_cmd->add_flag("--json", as_json, "print the run as JSON");

  // [serve.retention] in --config (a section of its own, hence a hidden
  // subcommand CLI11 fills from the file); `cairn gc` takes the same rule.
  auto* retention_cmd = serve_cmd->add_subcommand("retention", "remove ended runs in the background")
                            ->configurable()
                            ->group("");
  const std::vector<std::string> ended = {"completed", "failed", "cancelled"};
  retention_cmd->add_option("--older-than", serve.retention.older_than, "runs that ended longer ago than this (30d)");
  retention_cmd->add_option("--status", serve.retention.statuses, "runs with these statuses")
      ->check(CLI::IsMember(ended));
  retention_cmd->add_option("--keep-last", serve.retention.keep_last, "keep the newest N of them");
  retention_cmd->add_option("--every", serve.retention_every, "how often a pass runs (default 10m)");

  std::vector<std::string> rm_ids;
  auto* rm_cmd = app.add_subcommand("rm", "remove ended runs: their journal rows, log, workspace and quota image");
  rm_cmd->add_option("run", rm_ids, "run ids")->required();
  rm_cmd->add_flag("--json", as_json, "JSON output: what was removed, refused and kept");

  cairn::cli::gc_args gc;
  auto* gc_cmd = app.add_subcommand("gc", "remove the ended runs a rule selects, and give their space back");
  gc_cmd->add_option("--older-than", gc.older_than,
                     "runs that ended longer ago than this: a time (90s, 15m, 2h, 30d) or a UTC date (2026-12-07)");
  gc_cmd->add_option("--status", gc.statuses, "only runs with these statuses (default: completed failed cancelled)")
      ->check(CLI::IsMember(ended));
  gc_cmd->add_option("--keep-last", gc.keep_last, "keep the newest N of the runs selected");
  gc_cmd->add_flag("--dry-run", gc.dry_run, "list what would be removed; change nothing");
  gc_cmd->add_flag("--json", as_json, "JSON output: the summary");

  std::string resume_id, resume_agent;
  bool resume_all = false;
  auto* resume_cmd = app.add_subcommand("resume", "continue a run from its journal");
  resume_cmd->add_option("run", resume_id, "run id");
  resume_cmd->add_flag("--all", resume_all, "every run left unfinished by a dead host process");
  resume_cmd->add_option("--agent", resume_agent, "resume the run on this agent, not the version it began with "
                                                  "(journaled; new code takes its ctx.patched branches)");
  resume_cmd->add_flag("--json", as_json, "print the final runs as JSON");

  cairn::cli::fork_args fork;
  auto* fork_cmd = app.add_subcommand(
      "fork", "a new run from RUN's journal up to step SEQ and its workspace there, going on with a fixed agent or "
              "another input: no step, tool or model call up to SEQ runs again; follow it to the end (RUN may "
              "still be running: its steps are durable)");
  fork_cmd->add_option("run", fork.run_id, "the run to fork")->required();
  fork_cmd->add_option("--at", fork.seq, "the last step the fork keeps (cairn show RUN numbers them); a call in doubt "
                                         "up to it must be settled first")
      ->required()
      ->type_name("SEQ");
  fork_cmd->add_option("--id", fork.id, "the fork's run id (default: generated)");
  fork_cmd->add_option("--agent", fork.agent, "the agent it goes on with; its replay of the steps up to SEQ must "
                                              "match them (default: the program now at RUN's agent path)")
      ->type_name("FILE");
  fork_cmd->add_option("--input", fork.input, "its input, a JSON value (default: RUN's)");
  fork_cmd->add_flag("--detach", fork.detach, "leave the fork pending for `cairn serve` (or `cairn resume`) and "
                                              "print its id, as `cairn submit` does");
  fork_cmd->add_flag("--json", as_json, "JSON output: the final run (with --detach: the fork, forked_from and "
                                        "workspace_restored)");
  fork_cmd->footer("The fork shares RUN's policy and sandbox, and the child runs RUN started up to SEQ: their "
                   "steps are copied, and it may join them. `cairn show` links a fork and its run both ways.");

  std::string export_id, export_output;
  auto* export_cmd = app.add_subcommand(
      "export", "write run RUN (its row, steps, events, signals, kept state and the workspace pieces its checkpoints "
                "name) as one zstd-compressed tar archive, to stdout or -o FILE, for `cairn import` on another machine "
                "or journal");
  export_cmd->add_option("run", export_id, "the run to export")->required();
  export_cmd->add_option("-o,--output", export_output, "write the archive to FILE (default: stdout, never a terminal)")
      ->type_name("FILE");
  export_cmd->footer("A run still running may be exported: the archive holds what its journal durably holds. The child "
                     "runs it started are not exported (its steps keep their results).");

  std::string import_file, import_id;
  auto* import_cmd = app.add_subcommand(
      "import", "add the run of an archive `cairn export` wrote to this journal, all of it or nothing, with its "
                "workspace at its last checkpoint; print its id");
  import_cmd->add_option("file", import_file, "the archive, or - for stdin")->required()->type_name("FILE");
  import_cmd->add_option("--id", import_id, "the run's id here (default: its id in the archive)");
  import_cmd->add_flag("--json", as_json, "JSON output: the imported run, imported_from and workspace_restored");
  import_cmd->footer("A completed, failed, cancelled, waiting or in-doubt run keeps its status; a run exported while "
                     "running is imported pending, held by nobody (cairn resume goes on with it). Everything is "
                     "checked before anything is written: a truncated, altered or hostile archive, or one of a newer "
                     "format, is refused with exit code 2 and the journal is left as it was.");

  cairn::cli::ls_args ls;
  auto* ls_cmd = app.add_subcommand("ls", "list runs, newest first");
  ls_cmd->add_option("--status", ls.status, "only runs with this status")
      ->check(CLI::IsMember({"pending", "running", "waiting", "completed", "failed", "cancelled", "in_doubt"}));
  ls_cmd->add_option("--agent", ls.agent, "only runs of this agent: its path, or its last components (count.py)");
  ls_cmd->add_option("--since", ls.since, "only runs created since: a time ago (90s, 15m, 2h, 3d) or a UTC date "
                                          "(2026-12-07, 2026-12-07T14:30)");
  ls_cmd->add_option("--limit", ls.limit, "at most this many runs")->check(CLI::NonNegativeNumber);
  ls_cmd->add_option("--before", ls.before, "the runs created before this run: the next page after it");
  ls_cmd->add_flag("--json", as_json, "JSON output: each run's row, without its input, output and policy (cairn show has them)");

  auto* workers_cmd = app.add_subcommand("workers", "the `cairn serve` workers sharing the journal: their host, the "
                                                   "runs each holds, their lease and refused writes");
  bool workers_all = false;
  workers_cmd->add_flag("--all", workers_all,
                        "also the dead workers whose leases expired over 5 minutes ago and that hold no run");
  workers_cmd->add_flag("--json", as_json, "JSON output");

  std::string show_id;
  auto* show_cmd = app.add_subcommand("show", "a run and its step journal");
  show_cmd->add_option("run", show_id, "run id")->required();
  show_cmd->add_flag("--json", as_json, "JSON output");

  cairn::cli::logs_args logs;
  auto* logs_cmd = app.add_subcommand("logs", "a run's steps and events and its agent's output; --follow until it ends, "
                                              "whichever process executes it");
  logs_cmd->add_option("run", logs.run_id, "run id")->required();
  logs_cmd->add_flag("-f,--follow", logs.follow, "keep printing as the run goes on; exit when it ends, with the code "
                                                 "`cairn run` would give");
  logs_cmd->add_option("--tail", logs.tail, "only the last N steps and events, and the last N lines of output")
      ->type_name("N");
  logs_cmd->add_flag("--json", as_json, "one JSON object per line: {\"type\": \"step\"|\"event\"|\"output\"|\"note\"|\"end\", ...}");

  std::string workspace_id, workspace_path;
  auto* workspace_cmd = app.add_subcommand(
      "workspace", "list a run's workspace files, or print one; live, suspended or ended, without waking it");
  workspace_cmd->add_option("run", workspace_id, "run id")->required();
  workspace_cmd->add_option("path", workspace_path, "a file or folder in /workspace (default: all)");
  workspace_cmd->add_flag("--json", as_json, "JSON output (a listing)");
  std::int64_t workspace_at = -1;
  workspace_cmd
      ->add_option("--at", workspace_at,
                   "the files as the checkpoint of step SEQ holds them (read from the journal), not as they are now")
      ->type_name("SEQ")
      ->check(CLI::NonNegativeNumber);

  std::string diff_id;
  std::uint64_t diff_from = 0, diff_to = 0;
  auto* diff_cmd =
      app.add_subcommand("diff", "what a run's steps changed in its workspace, between two steps' checkpoints");
  diff_cmd->add_option("run", diff_id, "run id")->required();
  diff_cmd->add_option("from", diff_from, "the earlier step (SEQ)")->required();
  diff_cmd->add_option("to", diff_to, "the later step (SEQ)")->required();
  diff_cmd->add_flag("--json", as_json, "JSON output");

  auto* doctor_cmd = app.add_subcommand("doctor", "can this machine sandbox agents and write the journal?");
  doctor_cmd->add_flag("--json", as_json, "JSON output");

  cairn::cli::settle_args settle;
  auto* settle_cmd = app.add_subcommand("settle", "record what happened to a tool call left in doubt by a crash");
  settle_cmd->add_option("run", settle.run_id, "run id")->required();
  settle_cmd->add_option("seq", settle.seq, "the step in doubt (cairn show RUN names it)")->required();
  auto* outcome = settle_cmd->add_option_group("outcome", "what happened to the call")->require_option(1);
  outcome->add_option("--result", settle.result, "it happened and returned this JSON");
  outcome->add_option("--error", settle.error, "it did not happen, or failed: the agent sees this error");
  outcome->add_flag("--retry", settle.retry, "it did not happen: call it again");
  settle_cmd->add_flag("--json", as_json, "print the run as JSON");

  // A command cairn does not have is named, with those it has: CLI11 alone
  // would say "A subcommand is required" of `cairn logs RUN`.
  if (auto unknown = unknown_command(app, argc, argv)) {
    std::string known;
    for (const auto* sub : app.get_subcommands([](const CLI::App*) { return true; }))
      known += (known.empty() ? "" : ", ") + sub->get_name();
    std::cerr << "cairn: no command '" << cairn::cli::terminal_text(*unknown) << "'"
              << (*unknown == "version" ? " (the version is `cairn --version`)" : "") << "; the commands are " << known
              << "\nRun 'cairn --help' for what it takes.\n";
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  auto paths = cairn::cli::resolve_paths(db);
  for (const auto& what : allow) {
    paths.allow.sandbox_none |= what == "sandbox-none";
    paths.allow.command_tools |= what == "command-tools";
    paths.allow.any_workspace |= what == "any-workspace";
  }
  try {
    for (const auto& warning : cairn::cli::secure_home(paths)) std::cerr << "warning: " << warning << "\n";
  } catch (const std::exception& e) {
    std::cerr << "cairn: " << e.what() << "\n";
    return 3;
  }
  // Everything cairn creates from here on is its user's alone (0700 / 0600);
  // what the sandbox uid must pass through is opened up explicitly.
  ::umask(077);
  if (*run_cmd) return cairn::cli::run_command(paths, run, as_json);
  if (*resume_cmd) {
    if (resume_all == !resume_id.empty()) {
      std::cerr << "cairn: give a run id or --all\nRun 'cairn resume --help' for what it takes.\n";
      return 2;
    }
    if (resume_all && !resume_agent.empty()) {
      std::cerr << "cairn: --agent resumes one run: give its id, not --all\n";
      return 2;
    }
    return cairn::cli::resume_command(paths, resume_id, resume_all, resume_agent, as_json);
  }
  if (*fork_cmd) return cairn::cli::fork_command(paths, fork, as_json);
  if (*export_cmd) return cairn::cli::export_command(paths, export_id, export_output);
  if (*import_cmd) return cairn::cli::import_command(paths, import_file, import_id, as_json);
  if (*ls_cmd) return cairn::cli::ls_command(paths, ls, as_json);
  if (*rm_cmd) return cairn::cli::rm_command(paths, rm_ids, as_json);
  if (*gc_cmd) return cairn::cli::gc_command(paths, gc, as_json);
  if (*workers_cmd) return cairn::cli::workers_command(paths, workers_all, as_json);
  if (*logs_cmd) return cairn::cli::logs_command(paths, logs, as_json);
  if (*show_cmd) return cairn::cli::show_command(paths, show_id, as_json);
  if (*workspace_cmd && workspace_at >= 0)
    return cairn::cli::workspace_at_command(paths, workspace_id, static_cast<std::uint64_t>(workspace_at),
                                            workspace_path, as_json);
  if (*workspace_cmd) return cairn::cli::workspace_command(paths, workspace_id, workspace_path, as_json);
  if (*diff_cmd) return cairn::cli::diff_command(paths, diff_id, diff_from, diff_to, as_json);
  if (*doctor_cmd) return cairn::cli::doctor_command(paths, as_json);
  if (*settle_cmd) return cairn::cli::settle_command(paths, settle, as_json);
  if (*submit_cmd) return cairn::cli::submit_command(paths, submit, as_json);
  if (*serve_cmd) {
    if (auto* config = app.get_config_ptr(); config && config->count() > 0) serve.config_file = config->as<std::string>();
    return cairn::cli::serve_command(paths, serve);
  }
  if (*signal_cmd) return cairn::cli::signal_command(paths, signal_run, signal_name, signal_data, as_json);
  if (*cancel_cmd) return cairn::cli::cancel_command(paths, cancel_run, cancel_reason, !cancel_no_wait, as_json);
  return 2;
}
