#include "cli/support.hpp"

#include <unistd.h>

#include <csignal>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string_view>

#include <fmt/format.h>

#include "cli/format.hpp"
#include "engine/effects.hpp"
#include "engine/run_paths.hpp"
#include "engine/scheduler.hpp"
#include "protocol/bounded_json.hpp"

namespace cairn::cli {
namespace {

std::mutex output;

// Whether following the run is over: it finished, or it stopped in doubt
// (not finished, but nothing moves it until `cairn settle`).
bool stopped(storage::run_status s) { return storage::is_finished(s) || s == storage::run_status::in_doubt; }

}  // namespace

// Every line is one line: whatever an agent put in it is escaped here.
void progress_printer::say(const std::string& line) {
  if (quiet_) return;
  std::lock_guard lock(output);
  std::cout << prefix_ << terminal_text(line) << std::endl;
}

void progress_printer::end_stream() {
  if (!streaming_) return;
  std::lock_guard lock(output);
  std::cout << std::endl;
  streaming_ = false;
}

void progress_printer::on_attempt(const storage::run_record& run, int attempt) {
  say(fmt::format("run {}: attempt {} in a {} sandbox, workspace {}", run.id, attempt, run.sandbox, run.workspace));
}

void progress_printer::on_step(const storage::step_record& step) {
  end_stream();
  say(step_line(step));
}

void progress_printer::on_retry(const engine::effects::retry_due& m) {
  say(fmt::format("       step {} '{}' attempt {} failed ({}); retrying in {} ms", m.seq, m.name, m.attempt,
                  m.error.message, m.delay_ms));
}

// LLM tokens print as they stream; each line of the text starts with the
// tool's label, so none can pass for a line of cairn's. Other events one per line.
void progress_printer::on_emit(const json& data) {
  if (data.is_object() && data.value("type", "") == "token" && data.contains("text") && data["text"].is_string()) {
    if (quiet_) return;
    const auto& tool = data.value("tool", json("tool"));
    const std::string label = prefix_ + "       " + terminal_text(tool.is_string() ? tool.get<std::string>() : "tool") + " > ";
    std::string text = terminal_text(data["text"].get<std::string>(), true);
    for (auto at = text.find('\n'); at != std::string::npos; at = text.find('\n', at + 1 + label.size()))
      text.insert(at + 1, label);
    std::lock_guard lock(output);
    if (!streaming_) std::cout << label;
    streaming_ = true;
    std::cout << text << std::flush;
    return;
  }
  end_stream();
  say("       emit " + preview(data, 100));
}

void progress_printer::on_attempt_failed(int attempt, const std::string& reason, bool will_retry) {
  say(fmt::format("attempt {} crashed: {}{}", attempt, reason, will_retry ? "; retrying from the journal" : ""));
}

void progress_printer::on_warning(const std::string& message) {
  std::lock_guard lock(output);
  std::cerr << "warning: " << terminal_text(message) << std::endl;
}

void progress_printer::on_wait(const storage::run_record& run, const storage::wait_spec&) {
  say(fmt::format("run {} {}; suspended, it holds no sandbox", run.id, describe_wait(run)));
}

engine::engine_options options_for(const paths& p) {
  engine::engine_options o;
  o.home = p.home;
  o.allow = p.allow;
  o.llm = engine::llm_endpoint_from_host(p.home / "config.json");
  return o;
}

int exit_code_of(const storage::run_record& run) {
  return run.status == storage::run_status::completed || run.status == storage::run_status::waiting ? 0 : 1;
}

int report_end(const paths& p, const storage::run_record& run, bool as_json) {
  if (as_json) {
    std::cout << to_json(run).dump(2, ' ', false, json::error_handler_t::replace) << std::endl;
  } else if (run.status == storage::run_status::completed) {
    double secs = (run.finished_at_ms.value_or(run.updated_at_ms) - run.created_at_ms) / 1000.0;
    std::cout << fmt::format("run {} completed in {:.2f} s\n{}", terminal_text(run.id), secs,
                             terminal_text(run.output.dump(2, ' ', false, json::error_handler_t::replace), true))
              << std::endl;
  }
  if (run.status == storage::run_status::completed) return 0;
  if (run.status == storage::run_status::waiting) {
    if (!as_json) std::cout << fmt::format("run {} {}", run.id, describe_wait(run)) << std::endl;
    return 0;
  }
  static const std::map<storage::run_status, std::string> verb = {{storage::run_status::in_doubt, "stopped in doubt"},
                                                                  {storage::run_status::cancelled, "was cancelled"},
                                                                  {storage::run_status::failed, "failed"}};
  if (run.error && verb.count(run.status))
    std::cerr << fmt::format("run {} {}: {}", terminal_text(run.id), verb.at(run.status),
                             terminal_text(run.error->message))
              << std::endl;
  // Where to look next: what the agent printed, when this machine has it.
  std::error_code ec;
  const auto log = engine::run_log(p.home, run.id);
  if (run.status == storage::run_status::failed && std::filesystem::file_size(log, ec) > 0 && !ec)
    std::cerr << fmt::format("its agent's output: {}", terminal_text(log.string())) << std::endl;
  return 1;
}

void print_history(storage::journal& journal, const std::string& run_id, bool quiet) {
  if (quiet) return;
  const auto count = journal.step_count(run_id);
  if (count == 0) return;
  std::cout << fmt::format("run {}: {} step{} already journaled, replaying them", run_id, count,
                           count == 1 ? "" : "s")
            << std::endl;
  // Streamed in bounded chunks: a history of any size is printed in the
  // memory of one chunk (at least one step), not of the whole.
  constexpr std::uint64_t chunk_bytes = 4 << 20;
  for (std::uint64_t next = 0;;) {
    const auto chunk = journal.steps_from(run_id, next, UINT64_MAX, chunk_bytes);
    if (chunk.empty()) break;
    for (const auto& s : chunk) std::cout << step_line(s) << '\n';
    next = chunk.back().result.seq + 1;
  }
  std::cout << std::flush;
}

namespace {

// Why `agent` cannot start as an agent, said before any run is made: not
// executable, or neither a compiled program nor a script naming its
// interpreter (execvp would hand such a file to /bin/sh, whose errors then
// crash the run once per attempt).
std::optional<std::string> agent_program_problem(const std::string& agent) {
  if (::access(agent.c_str(), X_OK) != 0)
    return fmt::format("agent program '{}' is not executable: chmod +x it", agent);
  char head[4] = {};
  std::ifstream in(agent, std::ios::binary);
  in.read(head, sizeof head);
  const auto got = in.gcount();
  if (got >= 2 && head[0] == '#' && head[1] == '!') return std::nullopt;
  if (got == 4 && std::string_view(head, 4) == "\x7f" "ELF") return std::nullopt;
  return fmt::format("agent program '{}' is neither a compiled program nor a script that names its interpreter: "
                     "make its first line one such as `#!/usr/bin/env python3` or `#!/usr/bin/env node`",
                     agent);
}

}  // namespace

// The run request of `cairn run` and `cairn submit`; nullopt (after saying
// why) when the arguments are wrong.
std::optional<engine::run_request> make_request(const run_args& args) {
  engine::run_request request;
  try {
    request.input = protocol::parse_bounded(args.input, "--input", {protocol::max_input_depth, protocol::default_max_frame});
  } catch (const protocol::json_error& e) {
    std::cerr << "cairn: " << e.what() << "\n";
    return std::nullopt;
  }
  std::error_code ec;
  if (!std::filesystem::is_regular_file(args.agent, ec)) {
    std::cerr << (ec && ec != std::errc::no_such_file_or_directory
                      ? fmt::format("cairn: cannot reach agent program '{}': {}\n", args.agent, ec.message())
                      : fmt::format("cairn: agent program '{}' not found (build it first: make build)\n", args.agent));
    return std::nullopt;
  }
  if (auto problem = agent_program_problem(args.agent)) {
    std::cerr << "cairn: " << terminal_text(*problem) << "\n";
    return std::nullopt;
  }
  request.id = args.id.empty() ? engine::new_run_id() : args.id;
  request.agent = args.agent;
  request.sandbox = args.sandbox;
  request.max_attempts = args.max_attempts;
  if (!args.policy.empty()) request.policy = engine::load_policy_file(args.policy);
  request.workspace = args.workspace;
  return request;
}

namespace {

engine::stop_flag& follow_stop() {
  static engine::stop_flag flag;
  return flag;
}
volatile std::sig_atomic_t stopped_by = 0;

void stop_following(int signal) {
  if (stopped_by == 0) stopped_by = signal;
  follow_stop().raise();  // async-signal-safe
}

}  // namespace

void on_signals(std::initializer_list<int> signals, void (*handler)(int)) {
  struct sigaction sa {};
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  for (int signal : signals) sigaction(signal, &sa, nullptr);
}

void stop_follow_on_signals() {
  follow_stop();  // made before any handler can run
  on_signals({SIGTERM, SIGHUP, SIGINT}, stop_following);
}

int stop_signal() { return stopped_by; }

int report_stopped(const storage::run_record& run, int signal, bool as_json) {
  if (as_json) std::cout << to_json(run).dump(2, ' ', false, json::error_handler_t::replace) << std::endl;
  const char* name = signal == SIGTERM ? "SIGTERM" : signal == SIGHUP ? "SIGHUP" : signal == SIGINT ? "SIGINT" : "a signal";
  std::string left;
  if (run.status == storage::run_status::waiting) left = "is waiting (suspended, no sandbox)";
  else if (run.status == storage::run_status::pending) left = "was handed back (pending, no sandbox)";
  else left = "is " + std::string(storage::to_string(run.status));
  std::cerr << fmt::format("cairn: stopped by {}: run {} {}; every journaled step is kept; continue it with `cairn "
                           "resume {}`{}",
                           name, terminal_text(run.id), left, terminal_text(run.id),
                           run.status == storage::run_status::waiting ? " (or let `cairn serve` wake it)" : "")
            << std::endl;
  return 128 + signal;
}

storage::run_record follow(const paths& p, const std::string& root, bool quiet, bool until_idle) {
  engine::scheduler_options o;
  o.db = p.db;
  o.engine = options_for(p);
  std::set<std::string> tree = {root};
  o.accept = [&tree](const storage::run_brief& b) {
    if (tree.count(b.id)) return true;
    if (b.parent_id.empty() || !tree.count(b.parent_id)) return false;
    tree.insert(b.id);
    return true;
  };
  std::mutex printers_mutex;
  std::map<std::string, std::unique_ptr<progress_printer>> printers;
  o.observer_for = [&](const std::string& id) -> engine::run_observer* {
    std::lock_guard lock(printers_mutex);
    auto& slot = printers[id];
    if (!slot) slot = std::make_unique<progress_printer>(quiet, id == root ? "" : "  [" + id + "] ");
    return slot.get();
  };
  o.on_return = [&](const storage::run_record& run) {
    if (run.id == root || quiet || !stopped(run.status)) return;
    std::lock_guard lock(output);
    std::cout << fmt::format("  [{}] child run {}", terminal_text(run.id), storage::to_string(run.status)) << std::endl;
  };
  // A child that fails to start is tried again (a scheduler's way); the run
  // followed itself is not: this command ends with why (its workspace is
  // not here, say), rather than repeat it every few seconds.
  std::optional<std::string> refused;
  o.on_error = [&root, &refused](const std::string& id, const std::string& error) {
    std::lock_guard lock(output);
    if (id == root) refused = error;
    else std::cerr << terminal_text(fmt::format("warning: run {}: {}", id, error)) << std::endl;
  };
  engine::scheduler runs(std::move(o));
  runs.run([&](storage::journal& journal) {
    if (std::lock_guard lock(output); refused) return true;
    auto run = journal.find_run(root);
    if (!run || stopped(run->status)) return true;
    if (!until_idle) return false;
    // Idle: nothing in the tree can move until a signal, a timer or another host does something.
    for (const auto& b : journal.schedulable(storage::now_ms()))
      if (tree.count(b.id) || tree.count(b.parent_id)) return false;
    return true;
  }, follow_stop());
  if (refused) throw engine::engine_error(engine::errc::busy, *refused);
  auto journal = storage::open_journal(p.db);
  return *journal->find_run(root);
}

}  // namespace cairn::cli
