// `cairn logs RUN [--follow] [--tail N] [--json]`: the run's journal (its
// steps and notable events, merged by time, as `cairn run` and `cairn show`
// print them) and its agent's output (HOME/logs/ID.log), each output line
// after "  | ". Each pass prints what the journal gained since the last,
// then what the log gained: the backlog shows the journal first, then the
// output so far; while following, both appear as they happen.
//
// --follow waits on what announces a change: wake-ups from the process that
// executes the run (storage/wakeup.hpp: a wait, an end, a hand-back),
// inotify on the logs folder (the agent printed) and, for SQLite, on the
// journal's folder (a step committed: its WAL grew); PostgreSQL announces no
// step, so a periodic look (every `safety_net`) finds those.
#include <poll.h>

#include <csignal>
#include <deque>
#include <iostream>
#include <optional>

#include <fmt/format.h>

#include "cli/commands.hpp"
#include "cli/format.hpp"
#include "cli/support.hpp"
#include "engine/owner.hpp"
#include "engine/run_log.hpp"
#include "engine/run_paths.hpp"
#include "engine/wakeups.hpp"
#include "storage/wakeup.hpp"

namespace cairn::cli {
namespace {

constexpr std::uint64_t chunk_bytes = 1 << 20;    // of the journal, per read
constexpr std::size_t read_bytes = 64 << 10;       // of the log, per read
constexpr std::size_t max_line_bytes = 4096;       // shown of one line of output; the rest is counted
constexpr int safety_net_ms = 1000;
constexpr std::string_view output_prefix = "  | ";

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// Where each entry goes: stdout, or (for the journal's backlog under
// --tail) a window of the last N.
class printer {
 public:
  printer(bool as_json, std::optional<std::uint64_t> tail) : json_(as_json), tail_(tail) {}

  void step(const storage::step_record& s) {
    line(json_ ? dump({{"type", "step"}, {"step", to_json(s)}}) : step_line(s));
  }
  void event(const storage::event_record& e) {
    line(json_ ? dump({{"type", "event"}, {"event", to_json(e)}}) : event_line(e));
  }
  // A line the agent printed (without its newline); `cut`: its bytes not shown.
  void output(std::string_view text, std::uint64_t cut) {
    const std::string more = cut ? fmt::format(" [{} more bytes of this line]", cut) : "";
    line(json_ ? dump({{"type", "output"}, {"line", std::string(text)}, {"cut_bytes", cut}})
               : std::string(output_prefix) + terminal_text(text) + more);
  }
  // cairn's own word about the run (a wait, where the output is).
  void note(const std::string& text) {
    if (json_) line(dump({{"type", "note"}, {"message", text}}));
    else line("cairn: " + terminal_text(text));
  }
  // Ends the window: what it kept is printed.
  void end_window() {
    for (const auto& l : window_) std::cout << l << '\n';
    window_.clear();
    tail_.reset();
    std::cout << std::flush;
  }

 private:
  void line(std::string text) {
    if (!tail_) {
      std::cout << text << '\n';
      return;
    }
    if (*tail_ == 0) return;
    window_.push_back(std::move(text));
    if (window_.size() > *tail_) window_.pop_front();
  }
  bool json_;
  std::optional<std::uint64_t> tail_;
  std::deque<std::string> window_;
};

// What of the journal was printed: prints what came after, steps and notable
// events merged by time, holding at most a chunk of each at once.
class journal_cursor {
 public:
  void print_new(storage::journal& journal, const std::string& run_id, printer& out) {
    std::deque<storage::step_record> steps;
    std::deque<storage::event_record> events;
    bool steps_done = false, events_done = false;
    for (;;) {
      if (steps.empty() && !steps_done) {
        auto chunk = journal.steps_from(run_id, next_seq_, UINT64_MAX, chunk_bytes);
        steps_done = chunk.empty();
        steps.insert(steps.end(), std::make_move_iterator(chunk.begin()), std::make_move_iterator(chunk.end()));
      }
      if (events.empty() && !events_done) {
        auto chunk = journal.events_from(run_id, last_event_, chunk_bytes);
        events_done = chunk.empty();
        events.insert(events.end(), std::make_move_iterator(chunk.begin()), std::make_move_iterator(chunk.end()));
      }
      if (steps.empty() && events.empty()) return;
      if (!steps.empty() && (events.empty() || steps.front().finished_at_ms <= events.front().at_ms)) {
        out.step(steps.front());
        next_seq_ = steps.front().result.seq + 1;
        steps.pop_front();
      } else {
        if (notable(events.front())) out.event(events.front());
        last_event_ = events.front().id;
        events.pop_front();
      }
    }
  }

 private:
  std::uint64_t next_seq_ = 0;
  std::int64_t last_event_ = 0;
};

// The log's bytes as lines of at most max_line_bytes, a partial line held
// until its newline comes (or the run ends).
class output_lines {
 public:
  void feed(std::string_view data, printer& out) {
    while (!data.empty()) {
      const auto nl = data.find('\n');
      const auto piece = data.substr(0, nl);
      const auto room = max_line_bytes - partial_.size();
      partial_.append(piece.substr(0, room));
      cut_ += piece.size() - std::min(room, piece.size());
      if (nl == std::string_view::npos) return;
      flush(out);
      data.remove_prefix(nl + 1);
    }
  }
  void flush(printer& out) {
    if (partial_.empty() && cut_ == 0) return;
    out.output(partial_, cut_);
    partial_.clear();
    cut_ = 0;
  }

 private:
  std::string partial_;
  std::uint64_t cut_ = 0;
};

// Where the agent's output of `run` is when this machine has no log of it:
// the host that holds it or its workspace, when that is another.
std::optional<std::string> output_elsewhere(const storage::run_record& run) {
  const auto& here = engine::current_owner().hostname;
  if (auto holder = engine::owner_id::parse(run.owner); holder && holder->hostname != here) return holder->hostname;
  if (!run.workspace_host.empty() && run.workspace_host != here) return run.workspace_host;
  return std::nullopt;
}

class run_logs {
 public:
  run_logs(const paths& p, const storage::run_record& run, printer& out)
      : p_(p), id_(run.id), log_(engine::run_log(p.home, run.id)), out_(out) {}

  engine::run_log_reader& log() { return log_; }

  // Prints what the journal and the log gained.
  void pass(storage::journal& journal, const storage::run_record& run) {
    journal_.print_new(journal, id_, out_);
    out_.end_window();  // --tail of the log is where its reader starts
    for (;;) {
      auto chunk = log_.read(read_bytes);
      if (chunk.skipped) {
        lines_.flush(out_);
        out_.note(fmt::format("{} bytes of output were dropped from the log (limits.max_log_bytes) before they "
                              "could be shown",
                              chunk.skipped));
      }
      if (chunk.data.empty()) break;
      lines_.feed(chunk.data, out_);
    }
    say_where_output_is(run);
  }
  void end_output() { lines_.flush(out_); }

 private:
  // Said once per state of the log: missing (and where it is instead), refused.
  void say_where_output_is(const storage::run_record& run) {
    using state = engine::run_log_reader::state;
    const auto now = log_.last_state();
    if (now == said_) return;
    said_ = now;
    if (now == state::refused) {
      out_.note(log_.refusal());
    } else if (now == state::missing) {
      if (auto host = output_elsewhere(run))
        out_.note(fmt::format("the agent's output of run {} is on {}, in its CAIRN_HOME/logs/{}.log: run `cairn logs "
                              "{}` there",
                              id_, *host, id_, id_));
      else
        out_.note(fmt::format("no output from the agent of run {} yet (its log: {})", id_,
                              engine::run_log(p_.home, id_).string()));
    }
  }

  const paths& p_;
  std::string id_;
  engine::run_log_reader log_;
  printer& out_;
  journal_cursor journal_;
  output_lines lines_;
  engine::run_log_reader::state said_ = engine::run_log_reader::state::readable;
};

engine::stop_flag* logs_stop = nullptr;
volatile std::sig_atomic_t logs_stopped_by = 0;

void stop_logs(int signal) {
  if (logs_stopped_by == 0) logs_stopped_by = signal;
  if (logs_stop) logs_stop->raise();
}

}  // namespace

int logs_command(const paths& p, const logs_args& args, bool as_json) {
  return guarded([&] {
    static engine::stop_flag stop;
    static engine::wake_event woken;
    if (args.follow) {
      logs_stop = &stop;
      on_signals({SIGTERM, SIGINT, SIGHUP}, stop_logs);
    }
    auto journal = storage::open_journal(p.db, {.read_only = true});
    auto run = journal->find_run(args.run_id);
    if (!run)
      throw engine::engine_error(engine::errc::not_found, fmt::format("no run '{}' in {}", args.run_id, shown_db(p)));
    // Listening before the first look: a change made meanwhile still wakes the loop.
    std::unique_ptr<storage::wake_listener> listener;
    std::optional<engine::log_change_watch> changes;
    if (args.follow) {
      try {
        listener = std::make_unique<storage::wake_listener>(p.db, [id = run->id](const std::string& run_id, storage::change) {
          if (run_id.empty() || run_id == id) woken.signal();
        });
      } catch (const storage::storage_error& e) {
        std::cerr << "cairn: " << terminal_text(e.what()) << "; looking every second instead" << std::endl;
      }
      changes.emplace(p.home, p.db);
    }

    printer out(as_json, args.tail);
    run_logs logs(p, *run, out);
    if (args.tail) logs.log().seek_last_lines(*args.tail);
    std::string said_wait;
    for (;;) {
      run = journal->find_run(args.run_id);
      if (!run) throw engine::engine_error(engine::errc::not_found, fmt::format("run '{}' was removed", args.run_id));
      logs.pass(*journal, *run);
      if (storage::is_finished(run->status) || !args.follow) break;
      if (run->status == storage::run_status::waiting) {
        const auto wait = fmt::format("run {} {}", run->id, describe_wait(*run));
        if (wait != std::exchange(said_wait, wait)) out.note(wait);
      } else {
        said_wait.clear();
      }
      std::cout << std::flush;
      pollfd fds[] = {{stop.fd(), POLLIN, 0}, {woken.fd(), POLLIN, 0}, {changes && *changes ? changes->fd() : -1, POLLIN, 0}};
      ::poll(fds, std::size(fds), safety_net_ms);
      if (stop.raised()) {
        logs.end_output();
        std::cout << std::flush;
        return 128 + static_cast<int>(logs_stopped_by);
      }
      woken.take();
      if (changes && *changes) changes->drain();
    }
    logs.end_output();
    std::cout << std::flush;
    if (!storage::is_finished(run->status)) {
      if (!as_json)
        std::cerr << fmt::format("run {} is {}: `cairn logs {} --follow` follows it to its end", run->id,
                                 storage::to_string(run->status), run->id)
                  << std::endl;
      return 0;
    }
    if (as_json) {
      std::cout << dump({{"type", "end"}, {"run", to_json(*run)}}) << std::endl;
      return exit_code_of(*run);
    }
    return report_end(p, *run, false);
  });
}

}  // namespace cairn::cli
