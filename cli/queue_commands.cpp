#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <ctime>
#include <cstring>
#include <fstream>
#include <optional>
#include <thread>

#include <CLI/CLI.hpp>
#include <fmt/chrono.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli/batch_file.hpp"
#include "cli/commands.hpp"
#include "cli/format.hpp"
#include "cli/support.hpp"
#include "engine/liveness.hpp"
#include "engine/owner.hpp"
#include "engine/run_paths.hpp"
#include "engine/scheduler.hpp"
#include "engine/wakeups.hpp"
#include "protocol/bounded_json.hpp"

namespace cairn::cli {
namespace {

// The stop flag of the `cairn serve` of this process, raised by SIGTERM and SIGINT.
engine::stop_flag* serve_stop = nullptr;

void request_stop(int) {
  if (serve_stop) serve_stop->raise();
}

// SIGHUP (`systemctl reload`): read --config again.
engine::wake_event* serve_reload = nullptr;

void request_reload(int) {
  if (serve_reload) serve_reload->signal();
}

std::string now_stamp() { return format_time(storage::now_ms()); }

// The log of `cairn serve`, on stdout: a line per record, as text ("TIME
// MESSAGE") or as one JSON object (--log-format json), at the levels from
// --log-level up. Whatever an agent put in a message (names, errors) is
// escaped here: for a terminal in text, as \uXXXX in JSON (ensure_ascii).
enum class level { debug, info, warn, error };
constexpr std::string_view level_names[] = {"debug", "info", "warn", "error"};

struct log_settings {
  std::atomic<bool> json{false};
  std::atomic<level> least{level::info};
};
log_settings logging;  // set by serve_command before its first record, and at a reload

std::string iso_time(std::int64_t ms) {
  const std::time_t secs = ms / 1000;
  std::tm utc{};
  gmtime_r(&secs, &utc);
  return fmt::format("{:%Y-%m-%dT%H:%M:%S}.{:03}Z", utc, ms % 1000);
}

// `lifecycle`: the daemon's start, stop and end, logged at any --log-level
// (a supervisor waits for "started").
void log_record(level l, std::string_view event, const std::string& run, const std::string& message,
                bool lifecycle = false) {
  if (l < logging.least && !lifecycle) return;
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  if (!logging.json) {
    std::cout << now_stamp() << "  " << terminal_text(message) << std::endl;
    return;
  }
  json record = {{"time", iso_time(storage::now_ms())},
                 {"level", level_names[static_cast<int>(l)]},
                 {"event", event},
                 {"message", message}};
  if (!run.empty()) record["run"] = run;
  std::cout << record.dump(-1, ' ', /*ensure_ascii=*/true, json::error_handler_t::replace) << std::endl;
}

void log_line(const std::string& line) { log_record(level::info, "note", "", line); }

// `format` and `least` as --log-format and --log-level take them (checked there).
void set_logging(const std::string& format, const std::string& least) {
  logging.json = format == "json";
  const auto* found = std::find(std::begin(level_names), std::end(level_names), least);
  logging.least = found == std::end(level_names) ? level::info : static_cast<level>(found - std::begin(level_names));
}

// The retention settings a running serve applies ([serve.retention]), as
// the start gave them and the last SIGHUP read them again.
struct retention_settings {
  std::mutex mutex;
  gc_args rule;
  std::string every;
  engine::wake_event changed;  // a reload changed them: a pass now
};
retention_settings retention;

bool retention_on(const gc_args& rule) {
  return !rule.older_than.empty() || !rule.statuses.empty() || rule.keep_last.has_value();
}

// How long between two passes: "10m" as `cairn ls --since` takes a time ago.
std::chrono::milliseconds retention_period(const std::string& every) {
  const auto now = storage::now_ms();
  try {
    return std::chrono::milliseconds(std::max<std::int64_t>(1000, now - time_since(every, now)));
  } catch (const std::invalid_argument& e) {
    throw engine::engine_error(engine::errc::bad_request, std::string("retention every: ") + e.what());
  }
}

// [serve.retention] of the config file: what the command line gave, with
// what the file says on top (read again at each SIGHUP).
void read_retention(const std::vector<CLI::ConfigItem>& items, gc_args& rule, std::string& every) {
  for (const auto& item : items) {
    if (item.parents != std::vector<std::string>{"serve", "retention"} || item.inputs.empty()) continue;
    if (item.name == "older-than") rule.older_than = item.inputs[0];
    if (item.name == "status") rule.statuses = item.inputs;
    if (item.name == "keep-last") rule.keep_last = std::stoull(item.inputs[0]);
    if (item.name == "every") every = item.inputs[0];
  }
}

// At SIGHUP: the log's settings again from the [serve] section of the
// config file (what the command line set stays), and the retention
// settings of [serve.retention]; the rest of serve's options take effect
// at its next start.
void reload_logging(const serve_args& args) {
  if (args.config_file.empty()) {
    log_record(level::info, "reloaded", "", "SIGHUP: no --config file to read again; nothing changed",
               /*lifecycle=*/true);
    return;
  }
  std::string format = args.log_format, least = args.verbose ? "debug" : args.log_level;
  gc_args rule = args.retention;
  std::string every = args.retention_every;
  try {
    const auto items = CLI::ConfigTOML().from_file(args.config_file);
    read_retention(items, rule, every);
    retention_rule_of(rule, storage::now_ms());  // refused as at the start: the settings stay
    retention_period(every);
    for (const auto& item : items) {
      if (item.parents != std::vector<std::string>{"serve"} || item.inputs.size() != 1) continue;
      if (item.name == "log-format" && (item.inputs[0] == "text" || item.inputs[0] == "json")) format = item.inputs[0];
      if (item.name == "log-level" && std::find(std::begin(level_names), std::end(level_names), item.inputs[0]) !=
                                          std::end(level_names))
        least = item.inputs[0];
    }
  } catch (const std::exception& e) {
    log_record(level::error, "reloaded", "",
               fmt::format("SIGHUP: {} cannot be read ({}); the log's settings are unchanged", args.config_file,
                           e.what()),
               /*lifecycle=*/true);
    return;
  }
  set_logging(format, least);
  {
    std::lock_guard lock(retention.mutex);
    retention.rule = rule;
    retention.every = every;
  }
  retention.changed.signal();
  log_record(level::info, "reloaded", "",
             fmt::format("SIGHUP: read {} again: log-format {}, log-level {}, retention {}; its other options take "
                         "effect at the next start",
                         args.config_file, format, least, retention_on(rule) ? "every " + every : "off"),
             /*lifecycle=*/true);
}

// The daemon's retention: a pass at the start and every `every`, removing
// the ended runs the rule selects a few per transaction (engine/retention.hpp),
// on a journal connection of its own, until `stop`.
void apply_retention(const paths& p, const std::filesystem::path& workspace_root, const engine::stop_flag& stop) {
  std::unique_ptr<storage::journal> journal;
  for (;;) {
    gc_args rule;
    std::string every;
    {
      std::lock_guard lock(retention.mutex);
      rule = retention.rule;
      every = retention.every;
    }
    const bool on = retention_on(rule);
    if (on) try {
        if (!journal) journal = storage::open_journal(p.db);
        const auto now = storage::now_ms();
        std::vector<std::string> ids;
        for (const auto& r : engine::select_runs(*journal, retention_rule_of(rule, now), now)) ids.push_back(r.id);
        const auto report = engine::remove_runs(*journal, {p.home, workspace_root}, ids, {},
                                                [&stop] { return stop.raised(); });
        for (const auto& [id, why] : report.refused) log_record(level::debug, "retention", id, "retention: " + why);
        for (const auto& line : report.notes) log_record(level::warn, "retention", "", "retention: " + line);
        if (!report.removed.empty())
          log_record(level::info, "retention", "",
                     fmt::format("retention: removed {} ended run{} (journal rows {}, files {}); journal {} -> {}",
                                 report.removed.size(), report.removed.size() == 1 ? "" : "s",
                                 format_bytes(report.journal_bytes), format_bytes(report.file_bytes),
                                 format_bytes(report.before.bytes), format_bytes(report.after.bytes)));
      } catch (const std::exception& e) {
        // The next pass tries again on a fresh connection; runs go on meanwhile.
        log_record(level::error, "retention", "", std::string("retention: ") + e.what());
        journal.reset();
      }
    std::array<pollfd, 2> events{pollfd{retention.changed.fd(), POLLIN, 0}, pollfd{stop.fd(), POLLIN, 0}};
    const auto period = on ? static_cast<int>(std::min<std::int64_t>(retention_period(every).count(), INT32_MAX)) : -1;
    if (::poll(events.data(), events.size(), period) < 0 && errno != EINTR) return;
    if (stop.raised()) return;
    retention.changed.take();
  }
}

// What `cairn serve` prints: each run's attempts and how each execution ends.
class serve_log : public engine::run_observer {
 public:
  void on_attempt(const storage::run_record& run, int attempt) override {
    log_record(level::info, "attempt_started", run.id,
               fmt::format("run {}: attempt {} ({})", run.id, attempt,
                           std::filesystem::path(run.agent).filename().string()));
  }
  void on_step(const storage::step_record& step) override {
    log_record(level::debug, "step", step.run_id, fmt::format("run {}:{}", step.run_id, step_line(step)));
  }
  void on_attempt_failed(int attempt, const std::string& reason, bool will_retry) override {
    log_record(level::warn, "attempt_crashed", "",
               fmt::format("attempt {} crashed: {}{}", attempt, reason, will_retry ? "; retrying" : ""));
  }
  void on_warning(const std::string& message) override { log_record(level::warn, "warning", "", "warning: " + message); }
  void on_sandbox(const std::string& run_id, bool pooled, bool agent_started, std::chrono::microseconds took) override {
    if (pooled)
      log_record(level::info, "warm_sandbox", run_id,
                 fmt::format("run {}: warm sandbox from the pool{}, ready in {:.1f} ms", run_id,
                             agent_started ? ", its agent started already" : "", took.count() / 1000.0));
  }
};

// Whether a `cairn serve` (a worker with a current lease) serves the journal.
bool served(storage::journal& journal) { return engine::worker_leases(journal).any_alive(); }

// no_daemon_hint after a batch: `cairn resume --all` takes every pending run.
std::string no_daemon_hint_for_batch(storage::journal& journal, const paths& p) {
  if (served(journal)) return "";
  return fmt::format("no `cairn serve` holds {}: start one, or execute the queued runs in this process with "
                     "`cairn resume --all`",
                     shown_db(p));
}

}  // namespace

std::string no_daemon_hint(storage::journal& journal, const paths& p, const std::string& run_id) {
  if (served(journal)) return "";
  return fmt::format("no `cairn serve` holds {}: unless a `cairn run` follows this run, start one or continue it "
                     "with `cairn resume {}`",
                     shown_db(p), run_id);
}

int submit_command(const paths& p, const run_args& args, bool as_json) {
  if (!args.from.empty()) return submit_batch_command(p, args, as_json);
  return guarded([&] {
    auto request = make_request(args);
    if (!request) return 2;
    auto journal = storage::open_journal(p.db);
    engine::engine eng(*journal, options_for(p));
    auto [run, created] = eng.submit(*request);
    if (as_json) std::cout << to_json(run).dump(2, ' ', false, json::error_handler_t::replace) << std::endl;
    else std::cout << run.id << std::endl;
    if (!created)
      std::cerr << fmt::format("run {} already exists ({}); the id is an idempotency key", run.id,
                               storage::to_string(run.status))
                << std::endl;
    if (auto hint = no_daemon_hint(*journal, p, run.id); !hint.empty()) std::cerr << hint << std::endl;
    return 0;
  });
}

int submit_batch_command(const paths& p, const run_args& args, bool as_json) {
  return guarded([&] {
    auto request = make_request(args);
    if (!request) return 2;
    std::vector<batch_run> lines;
    try {
      std::ifstream file;
      if (args.from != "-") {
        std::error_code ec;
        if (std::filesystem::is_directory(args.from, ec)) throw batch_error(args.from + " is a folder, not a file");
        file.open(args.from, std::ios::binary);
        if (!file) throw batch_error(fmt::format("cannot open {}: {}", args.from, std::strerror(errno)));
      }
      lines = read_batch(args.from == "-" ? std::cin : file, args.from == "-" ? "stdin" : args.from);
    } catch (const batch_error& e) {
      std::cerr << "cairn submit: " << terminal_text(e.what()) << "; nothing was queued\n";
      return 2;
    }
    std::vector<engine::run_request> requests;
    requests.reserve(lines.size());
    for (auto& line : lines) {
      auto& r = requests.emplace_back(*request);
      r.id = std::move(line.id);
      r.input = std::move(line.input);
    }
    lines = {};
    auto journal = storage::open_journal(p.db);
    engine::engine eng(*journal, options_for(p));
    const auto runs = eng.submit_many(std::move(requests));
    // One line per run, printed as it is read: a batch is never all in memory twice.
    if (as_json) std::cout << "[\n";
    std::vector<std::string> existing;
    for (std::size_t i = 0; i < runs.size(); ++i) {
      const auto& [id, created] = runs[i];
      if (as_json) {
        auto listed = to_json(*journal->find_run(id));
        listed["created"] = created;
        std::cout << "  " << listed.dump(-1, ' ', false, json::error_handler_t::replace)
                  << (i + 1 < runs.size() ? ",\n" : "\n");
      } else {
        std::cout << id << '\n';
      }
      if (!created) existing.push_back(id);
    }
    if (as_json) std::cout << "]\n";
    std::cout << std::flush;
    if (!existing.empty()) {
      constexpr std::size_t shown = 10;
      std::cerr << fmt::format("{} of the {} runs existed already and are left as they are (an id is an idempotency "
                               "key): {}{}",
                               existing.size(), runs.size(),
                               fmt::join(existing.begin(), existing.begin() + std::min(shown, existing.size()), ", "),
                               existing.size() > shown ? fmt::format(" and {} more", existing.size() - shown) : "")
                << std::endl;
    }
    if (auto hint = no_daemon_hint_for_batch(*journal, p); !hint.empty()) std::cerr << hint << std::endl;
    return 0;
  });
}

namespace {

int serve(const paths& p, const serve_args& args) {
    // Refused now, not at the first pass.
    retention_rule_of(args.retention, storage::now_ms());
    retention_period(args.retention_every);
    {
      std::lock_guard lock(retention.mutex);
      retention.rule = args.retention;
      retention.every = args.retention_every;
    }
    static engine::stop_flag stop_requested;
    serve_stop = &stop_requested;
    static engine::wake_event reload_requested;
    serve_reload = &reload_requested;
    on_signals({SIGTERM, SIGINT}, request_stop);
    on_signals({SIGHUP}, request_reload);

    engine::scheduler_options o;
    o.db = p.db;
    o.engine = options_for(p);
    o.engine.suspend_after = std::chrono::milliseconds(args.suspend_after_ms);
    if (!args.workspace_root.empty()) {
      // Canonical, as the workspaces made in it are: the root is compared with them.
      std::error_code ec;
      auto root = std::filesystem::weakly_canonical(std::filesystem::absolute(args.workspace_root), ec).lexically_normal();
      if (ec) root = std::filesystem::absolute(args.workspace_root).lexically_normal();
      if (!root.has_filename()) root = root.parent_path();
      o.engine.workspace_root = root;
      engine::check_unswappable(root, "--workspace-root");
      // Refused now rather than at each run's first execution: the rules of --workspace hold for every run's folder in it.
      auto journal = storage::open_journal(p.db);
      engine::checked_workspace(*journal, p.home, o.engine.workspace_root / "RUN_ID", "RUN_ID");
      // What an older cairn kept in this home for runs of the root goes beside them, before any run is taken.
      for (const auto& problem : engine::adopt_images_of_root(*journal, p.home, root))
        log_record(level::warn, "warning", "", "warning: " + problem);
    }
    {
      // What a cancel elsewhere or a crash left in this host's image folders.
      auto journal = storage::open_journal(p.db);
      engine::engine cleanup(*journal, o.engine);
      if (const auto released = cleanup.release_ended_runs())
        log_line(fmt::format("released the files of {} ended run{}", released, released == 1 ? "" : "s"));
    }
    o.max_concurrent = args.max_concurrent;
    // Many serves may share the journal: each holds a lease in its workers.
    o.lease = engine::lease_settings{std::chrono::seconds(args.lease_seconds), o.engine.workspace_root.string()};
    o.on_note = [](const std::string& note) { log_line(note); };
    runtime::warm_pool_options warm;
    warm.size = static_cast<std::size_t>(args.warm);
    warm.folder = p.home / "warm";
    warm.limits = (args.warm_policy.empty() ? engine::default_policy() : engine::load_policy_file(args.warm_policy)).limits;
    warm.start_agents = args.prestart;
    // One backend for every lane, so one pool; made now, so it fills before the first run.
    o.engine.backends = engine::shared_backends(engine::default_backends(warm));
    if (warm.size > 0)
      for (const auto& check : o.engine.backends("bwrap")->check())
        if (check.name == "workspace quota" && check.ok && check.detail.find("FUSE") != std::string::npos &&
            warm.limits.max_workspace_bytes > 0)
          log_record(level::warn, "warning", "", "cairn serve: --warm: without root a run's quota image is mounted through FUSE, where a pooled "
                   "sandbox cannot see it: runs with limits.workspace_mb > 0 start cold; the pool serves runs "
                   "whose policy (and --warm-policy) sets workspace_mb 0");
    // For tests only: an idle check hours long proves that wake-ups, not the check, move runs.
    if (const char* ms = std::getenv("CAIRN_TEST_IDLE_CHECK_MS")) o.idle_check = std::chrono::milliseconds(std::atoll(ms));
    serve_log log;
    o.observer_for = [&log](const std::string&) { return &log; };
    o.on_return = [](const storage::run_record& run) {
      switch (run.status) {
        case storage::run_status::waiting:
          log_record(level::info, "run_waiting", run.id, fmt::format("run {} {}", run.id, describe_wait(run)));
          break;
        case storage::run_status::pending:
          log_record(level::info, "run_handed_back", run.id,
                     fmt::format("run {} handed back: it continues from its journal when a host takes it", run.id));
          break;
        default:
          log_record(run.status == storage::run_status::completed ? level::info : level::warn,
                     "run_" + std::string(storage::to_string(run.status)), run.id,
                     fmt::format("run {} {}{}", run.id, storage::to_string(run.status),
                                 run.error ? ": " + run.error->message : ""));
      }
    };
    o.on_error = [](const std::string& id, const std::string& error) {
      log_record(level::error, "run_not_executed", id, fmt::format("run {}: not executed: {}", id, error));
    };
    log_record(level::info, "started", "", fmt::format("cairn serve: journal {}, up to {} runs at once{}, pid {}, lease {} s (SIGTERM stops it "
                         "gracefully)",
                         shown_db(p), args.max_concurrent,
                         warm.size > 0 ? fmt::format(", {} sandboxes kept warm{}", warm.size,
                                                     warm.start_agents ? " (agents started in them)" : "")
                                       : "",
                         engine::current_owner().pid, args.lease_seconds),
               /*lifecycle=*/true);
    const auto workspace_root = o.engine.workspace_root;
    engine::scheduler runs(std::move(o));
    std::thread reloader([&args] {
      for (;;) {
        std::array<pollfd, 2> events{pollfd{reload_requested.fd(), POLLIN, 0}, pollfd{stop_requested.fd(), POLLIN, 0}};
        if (::poll(events.data(), events.size(), -1) < 0 && errno != EINTR) return;
        if (stop_requested.raised()) return;
        if (reload_requested.take()) reload_logging(args);
      }
    });
    std::thread retainer([&p, &workspace_root] { apply_retention(p, workspace_root, stop_requested); });
    std::thread announce([&runs] {
      stop_requested.wait();
      const auto busy = runs.busy();
      log_record(level::info, "stopping", "", fmt::format("stopping: no new runs; {} run{} in flight finish{} the current step or suspend{}", busy,
                           busy == 1 ? "" : "s", busy == 1 ? "es" : "", busy == 1 ? "s" : ""),
                 /*lifecycle=*/true);
    });
    {
      // However run() ends (it throws when the journal cannot be reached), the
      // announcer is woken and joined: destroying it joinable would end the
      // process in std::terminate instead of with the error.
      struct join_announcer {
        std::thread& t;
        std::thread& r;
        std::thread& k;
        ~join_announcer() {
          stop_requested.raise();
          t.join();
          r.join();
          k.join();
        }
      } joined{announce, reloader, retainer};
      runs.run(nullptr, stop_requested);
    }
    log_record(level::info, "stopped", "", "stopped; nothing journaled is lost", /*lifecycle=*/true);
    return 0;
}

}  // namespace

int serve_command(const paths& p, const serve_args& args) {
  set_logging(args.log_format, args.verbose ? "debug" : args.log_level);
  return guarded([&] {
    try {
      return serve(p, args);
    } catch (const std::exception& e) {
      // A machine reading the log learns why it ends; stderr says it as every command does.
      if (logging.json) log_record(level::error, "fatal", "", std::string("cairn serve: ") + e.what(), /*lifecycle=*/true);
      throw;
    }
  });
}

int signal_command(const paths& p, const std::string& run_id, const std::string& name, const std::string& data,
                   bool as_json) {
  return guarded([&] {
    json payload;
    try {
      payload = protocol::parse_bounded(data, "--data", {engine::max_signal_depth, protocol::default_max_frame});
    } catch (const protocol::json_error& e) {
      std::cerr << "cairn signal: " << e.what() << "; nothing was sent\n";
      return 2;
    }
    auto journal = storage::open_journal(p.db);
    engine::engine eng(*journal, options_for(p));
    auto sig = eng.signal(run_id, name, payload);
    auto run = journal->find_run(run_id);
    if (as_json) {
      std::cout << to_json(sig).dump(2, ' ', false, json::error_handler_t::replace) << std::endl;
      return 0;
    }
    const bool awaited = run->status == storage::run_status::waiting && run->wait && run->wait->kind == "signal" &&
                         run->wait->key == name;
    std::cout << fmt::format("signal '{}' queued for run {} ({}); {}", name, run_id, storage::to_string(run->status),
                             awaited ? "the run waits for it and takes it at its next wake-up"
                                     : "it is delivered once, when the run waits for it")
              << std::endl;
    if (run->status == storage::run_status::waiting)
      if (auto hint = no_daemon_hint(*journal, p, run_id); !hint.empty()) std::cerr << hint << std::endl;
    return 0;
  });
}

int cancel_command(const paths& p, const std::string& run_id, const std::string& reason, bool wait, bool as_json) {
  return guarded([&] {
    auto journal = storage::open_journal(p.db);
    engine::engine eng(*journal, options_for(p));
    // Listening before the cancel: the run's end, announced by the process
    // that executes it, cannot come before we hear.
    std::optional<engine::wake_listening> listening;
    engine::wake_event ended;
    std::optional<engine::wake_registration> watching;
    if (wait) {
      listening.emplace(p.db);
      watching.emplace(run_id, ended);
    }
    auto outcome = eng.cancel(run_id, reason);
    auto run = *journal->find_run(run_id);
    if (outcome == engine::engine::cancel_outcome::requested) {
      if (!as_json)
        std::cout << fmt::format("cancel requested: run {} is executed by {}, which tells the agent and kills its "
                                 "sandbox if it has not stopped after the grace period",
                                 run_id, engine::describe_owner(run.owner))
                  << std::endl;
      if (!wait) return 0;
      while (run.status != storage::run_status::cancelled && run.status != storage::run_status::completed &&
             run.status != storage::run_status::failed) {
        // A host that dies announces nothing: its death is looked for once a second.
        ended.wait_until(engine::clock::now() + std::chrono::seconds(1));
        run = *journal->find_run(run_id);
        if (run.owner.empty() || engine::check_owner(*journal, run.owner) == engine::owner_state::dead) {
          if (run.status == storage::run_status::cancelled) break;
          eng.cancel(run_id, reason);  // its host died meanwhile: cancel it here
          run = *journal->find_run(run_id);
        }
      }
    }
    if (as_json) {
      std::cout << to_json(run).dump(2, ' ', false, json::error_handler_t::replace) << std::endl;
      return 0;
    }
    std::cout << fmt::format("run {} {}", run_id,
                             run.status == storage::run_status::cancelled
                                 ? "cancelled" + std::string(journal->children(run_id).empty() ? "" : ", and its unfinished children with it")
                                 : fmt::format("ended {} before the cancel reached it", storage::to_string(run.status)))
              << std::endl;
    return 0;
  });
}

}  // namespace cairn::cli
