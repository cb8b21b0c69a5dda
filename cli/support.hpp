// What the cairn subcommands share: the live printer of a run, the engine's
// options for this machine, error handling, and the final report.
#pragma once

#include <initializer_list>
#include <iostream>
#include <mutex>
#include <string>

#include "cli/commands.hpp"
#include "cli/format.hpp"
#include "cli/paths.hpp"
#include "engine/engine.hpp"

namespace cairn::cli {

using json = nlohmann::json;

// Prints each step the moment it is journaled. `prefix` names a child run.
// Safe to use from several threads (each line is written whole).
class progress_printer : public engine::run_observer {
 public:
  explicit progress_printer(bool quiet, std::string prefix = "") : quiet_(quiet), prefix_(std::move(prefix)) {}

  void on_attempt(const storage::run_record& run, int attempt) override;
  void on_step(const storage::step_record& step) override;
  void on_retry(const engine::effects::retry_due& m) override;
  void on_emit(const json& data) override;
  void on_attempt_failed(int attempt, const std::string& reason, bool will_retry) override;
  void on_warning(const std::string& message) override;
  void on_wait(const storage::run_record& run, const storage::wait_spec& wait) override;

 private:
  void say(const std::string& line);
  void end_stream();
  bool quiet_;
  std::string prefix_;
  bool streaming_ = false;
};

engine::engine_options options_for(const paths& p);

// Runs `body`, turning every expected failure into one message and an exit
// code. The message may quote an agent (a step name in a non-determinism
// error), so it is escaped.
template <class F>
int guarded(F&& body) {
  const auto say = [](const std::exception& e) { std::cerr << "cairn: " << terminal_text(e.what()) << "\n"; };
  try {
    return body();
  } catch (const engine::engine_error& e) {
    say(e);
    return e.code() == engine::errc::busy ? 4 : 2;
  } catch (const storage::storage_error& e) {
    say(e);
    return 3;
  } catch (const std::filesystem::filesystem_error& e) {
    say(e);
    return 3;
  } catch (const engine::policy_error& e) {
    say(e);
    return 2;
  } catch (const std::runtime_error& e) {  // e.g. an unreadable host config file, a sandbox that cannot be made
    say(e);
    return 3;
  }
}

// The exit code of a command that followed `run` to where it is: 0
// completed or waiting, 1 failed, cancelled or in doubt.
int exit_code_of(const storage::run_record& run);
// Prints how the run ended (or what it waits for); its exit_code_of.
int report_end(const paths& p, const storage::run_record& run, bool as_json);
// The steps already journaled, before a resumed run goes on.
void print_history(storage::journal& journal, const std::string& run_id, bool quiet);

// After a run was queued: "" when a `cairn serve` holds the journal, else a
// line saying how the run will be executed (queue_commands.cpp).
std::string no_daemon_hint(storage::journal& journal, const paths& p, const std::string& run_id);

// The run request of `cairn run` and `cairn submit`; nullopt (after saying
// why) when the arguments are wrong.
std::optional<engine::run_request> make_request(const run_args& args);

// Executes `root` and its child runs in this process until the root ends
// (completed, failed, cancelled, in doubt), waiting out its timers, signals
// and children; returns its final record. Runs that another live process
// holds are left to it (and waited for). With `until_idle`, returns as soon
// as nothing in the tree can move without outside help (the root may then
// be waiting, e.g. for a signal).
// SIGTERM, SIGHUP or SIGINT (from systemd, `timeout`, a closed terminal, a
// shell's kill or Ctrl-C) stops it as they stop `cairn serve`: a run between
// steps is handed back at once, one inside a step gets its drain period to
// finish it, a waiting one is suspended; each sandbox is taken down and its
// workspace released. It then returns the run as it was left.
storage::run_record follow(const paths& p, const std::string& root, bool quiet, bool until_idle = false);

// `handler` for each of `signals` (sigaction, no flags).
void on_signals(std::initializer_list<int> signals, void (*handler)(int));
// From now on SIGTERM, SIGHUP and SIGINT stop follow() gracefully (above)
// instead of killing the command.
void stop_follow_on_signals();
// The signal that stopped follow(), 0 when none did.
int stop_signal();
// After follow() was stopped by `signal`: says (on stderr; with --json the
// run also on stdout) what became of the run and how to continue it.
// Returns 128 + signal, as a shell reports a command the signal ended.
int report_stopped(const storage::run_record& run, int signal, bool as_json);

}  // namespace cairn::cli
