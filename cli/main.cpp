#include <iostream>

#include <CLI/CLI.hpp>

#include "cli/commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{"cairn: durable, sandboxed AI agent workflows"};
  app.require_subcommand(1);
  std::string db;
  bool as_json = false;
  app.add_option("--db", db, "journal database (default $CAIRN_HOME/cairn.db, CAIRN_HOME defaults to ./.cairn)");

  cairn::cli::run_args run;
  auto* run_cmd = app.add_subcommand("run", "start a run of AGENT and follow it to the end");
  run_cmd->add_option("agent", run.agent, "the agent program (built with the cairn SDK)")->required();
  run_cmd->add_option("--input", run.input, "the run's input, a JSON value");
  run_cmd->add_option("--id", run.id, "run id; also the idempotency key (default: generated)");
  run_cmd->add_option("--workspace", run.workspace, "host folder mounted at /workspace (default $CAIRN_HOME/workspaces/ID)");
  run_cmd->add_option("--sandbox", run.sandbox, "bwrap (default) or none (no isolation)")
      ->check(CLI::IsMember({"bwrap", "none"}));
  run_cmd->add_option("--max-attempts", run.max_attempts, "sandbox crashes tolerated before the run fails")
      ->check(CLI::Range(1, 1000));
  run_cmd->add_option("--policy", run.policy, "policy file: the tools the run may call, its limits (default: no "
                                             "tools, no network)");
  run_cmd->add_flag("--json", as_json, "print the final run as JSON instead of progress");

  std::string resume_id;
  bool resume_all = false;
  auto* resume_cmd = app.add_subcommand("resume", "continue a run from its journal");
  resume_cmd->add_option("run", resume_id, "run id");
  resume_cmd->add_flag("--all", resume_all, "every run left unfinished by a dead host process");
  resume_cmd->add_flag("--json", as_json, "print the final runs as JSON");

  auto* ls_cmd = app.add_subcommand("ls", "list runs, newest first");
  ls_cmd->add_flag("--json", as_json, "JSON output");

  std::string show_id;
  auto* show_cmd = app.add_subcommand("show", "a run and its step journal");
  show_cmd->add_option("run", show_id, "run id")->required();
  show_cmd->add_flag("--json", as_json, "JSON output");

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

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  const auto paths = cairn::cli::resolve_paths(db);
  if (*run_cmd) return cairn::cli::run_command(paths, run, as_json);
  if (*resume_cmd) {
    if (resume_all == !resume_id.empty()) {
      std::cerr << "cairn resume: give a run id or --all\n";
      return 2;
    }
    return cairn::cli::resume_command(paths, resume_id, resume_all, as_json);
  }
  if (*ls_cmd) return cairn::cli::ls_command(paths, as_json);
  if (*show_cmd) return cairn::cli::show_command(paths, show_id, as_json);
  if (*doctor_cmd) return cairn::cli::doctor_command(paths, as_json);
  if (*settle_cmd) return cairn::cli::settle_command(paths, settle, as_json);
  return 2;
}
