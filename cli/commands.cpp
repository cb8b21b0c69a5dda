#include "cli/commands.hpp"

#include <unistd.h>

#include <iostream>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli/format.hpp"
#include "cli/support.hpp"
#include "engine/doctor.hpp"
#include "engine/owner.hpp"
#include "engine/workspace_files.hpp"
#include "protocol/bounded_json.hpp"

namespace cairn::cli {
namespace {

// What `read` returns, or nothing and a line in `notes` when a row cannot be
// loaded (storage's errc::unreadable): `cairn show` shows what it can.
template <class F>
auto readable(F&& read, std::vector<std::string>& notes) -> decltype(read()) {
  try {
    return read();
  } catch (const storage::storage_error& e) {
    if (e.code() != storage::errc::unreadable) throw;
    notes.push_back(e.what());
    return {};
  }
}

}  // namespace

int run_command(const paths& p, const run_args& args, bool as_json) {
  return guarded([&] {
    auto request = make_request(args);
    if (!request) return 2;
    stop_follow_on_signals();
    auto journal = storage::open_journal(p.db);
    engine::engine eng(*journal, options_for(p));
    auto [run, created] = eng.start(*request);  // owned by this process: no daemon takes it meanwhile
    if (!created) {
      if (!as_json)
        std::cout << fmt::format("run {} already exists ({}); the id is an idempotency key", run.id,
                                 storage::to_string(run.status))
                  << std::endl;
      if (run.status != storage::run_status::pending && run.status != storage::run_status::running &&
          run.status != storage::run_status::waiting)
        return report_end(p, run, as_json);
      print_history(*journal, run.id, as_json);
    }
    auto end = follow(p, run.id, as_json);
    if (const int signal = stop_signal()) return report_stopped(end, signal, as_json);
    return report_end(p, end, as_json);
  });
}

int resume_command(const paths& p, const std::string& run_id, bool all, const std::string& agent, bool as_json) {
  return guarded([&] {
    stop_follow_on_signals();
    auto journal = storage::open_journal(p.db);
    engine::engine eng(*journal, options_for(p));
    if (!all) {
      if (!agent.empty()) {
        const auto replaced = eng.replace_agent(run_id, agent);
        if (!as_json) std::cout << terminal_text(replaced) << std::endl;
      }
      // A failed run gets a fresh set of attempts; one in doubt is told what to settle.
      auto run = eng.reopen(run_id);
      if (run.status == storage::run_status::in_doubt) return report_end(p, eng.execute(run_id), as_json);
      // Its files, if a crash kept them in its image as it ended, go to its folder.
      if (auto kept = eng.release_ended_run(run_id)) std::cerr << "warning: " << terminal_text(*kept) << std::endl;
      print_history(*journal, run_id, as_json);
      if (run.status == storage::run_status::waiting && !as_json) {
        // A signal sent while nobody executed the run wakes it now: no need to send it.
        const auto queued = [&] {
          if (!run.wait || run.wait->kind != "signal") return false;
          for (const auto& s : journal->signals(run_id))
            if (s.name == run.wait->key && !s.delivered_seq) return true;
          return false;
        };
        if (queued())
          std::cout << fmt::format("run {} waited for signal '{}' (step {}), which is queued: it goes on now", run_id,
                                   terminal_text(run.wait->key), run.wait->seq)
                    << std::endl;
        else std::cout << fmt::format("run {} {}", run_id, describe_wait(run)) << std::endl;
      }
      auto end = follow(p, run_id, as_json);
      if (const int signal = stop_signal()) return report_stopped(end, signal, as_json);
      return report_end(p, end, as_json);
    }
    if (const auto released = eng.release_ended_runs(); released && !as_json)
      std::cout << fmt::format("released the files of {} ended run{} from their images", released,
                               released == 1 ? "" : "s")
                << std::endl;
    auto orphans = eng.orphaned_runs();
    if (orphans.empty() && !as_json) std::cout << "nothing to resume: no run was left unfinished" << std::endl;
    int worst = 0;
    json results = json::array();
    // A child is followed with its whole tree, from the top run down.
    std::set<std::string> roots;
    for (auto run : orphans) {
      while (!run.parent_id.empty())
        if (auto parent = journal->find_run(run.parent_id)) run = *parent;
        else break;
      if (!roots.insert(run.id).second) continue;
      if (!as_json) std::cout << fmt::format("resuming {} (left {} by {})", run.id, storage::to_string(run.status),
                                             run.owner.empty() ? "nobody" : engine::describe_owner(run.owner))
                              << std::endl;
      print_history(*journal, run.id, as_json);
      auto end = follow(p, run.id, as_json, true);
      if (const int signal = stop_signal()) {
        // The runs not reached yet stay as they were, for the next `cairn resume --all`.
        if (as_json) std::cout << results.dump(2, ' ', false, json::error_handler_t::replace) << std::endl;
        return report_stopped(end, signal, false);
      }
      results.push_back(to_json(end));
      worst = std::max(worst, as_json ? exit_code_of(end) : report_end(p, end, false));
    }
    if (as_json) std::cout << results.dump(2, ' ', false, json::error_handler_t::replace) << std::endl;
    return worst;
  });
}

int ls_command(const paths& p, const ls_args& args, bool as_json) {
  return guarded([&] {
    storage::run_query q;
    if (!args.status.empty()) q.status = storage::parse_run_status(args.status);
    q.agent = args.agent;
    if (!args.since.empty()) try {
        q.since_ms = time_since(args.since, storage::now_ms());
      } catch (const std::invalid_argument& e) {
        throw engine::engine_error(engine::errc::bad_request, std::string("--since: ") + e.what());
      }
    q.before = args.before;
    q.limit = args.limit;
    auto journal = storage::open_journal(p.db, {.read_only = true});
    if (!q.before.empty() && !journal->find_run(q.before))
      throw engine::engine_error(engine::errc::not_found, fmt::format("no run '{}' in {} to list the runs before",
                                                                      q.before, shown_db(p)));
    auto runs = journal->list_runs(q);
    if (as_json) {
      json out = json::array();
      for (const auto& r : runs) {
        // A listing's row: what a run's page (`cairn show`) adds is left there.
        auto row = to_json(r);
        for (const char* heavy : {"input", "output", "policy"}) row.erase(heavy);
        out.push_back(std::move(row));
      }
      std::cout << out.dump(2, ' ', false, json::error_handler_t::replace) << std::endl;
    } else {
      std::cout << runs_table(*journal, runs);
      if (q.limit && !runs.empty() && runs.size() == static_cast<std::size_t>(*q.limit))
        std::cout << fmt::format("(the first {}; the next: cairn ls --before {} --limit {})", runs.size(),
                                 terminal_text(runs.back().id), *q.limit)
                  << std::endl;
    }
    return 0;
  });
}

int workers_command(const paths& p, bool all, bool as_json) {
  return guarded([&] {
    auto journal = storage::open_journal(p.db, {.read_only = true});
    auto workers = journal->workers();
    const auto now = storage::now_ms();
    // Killed workers long gone, holding nothing: the next worker to register deletes them.
    const auto dead = all ? 0 : std::erase_if(workers, [&](const auto& w) { return forgettable(w, now); });
    if (as_json) {
      json out = json::array();
      for (const auto& w : workers) out.push_back(to_json(w, now));
      std::cout << out.dump(2, ' ', false, json::error_handler_t::replace) << std::endl;
    } else if (workers.empty() && dead == 0) {
      std::cout << fmt::format("no worker has registered in {}: start `cairn serve`", shown_db(p)) << std::endl;
    } else {
      if (!workers.empty()) std::cout << workers_table(workers, now);
      if (dead > 0)
        std::cout << fmt::format("{} dead worker{} not shown: {} lease expired over {} minutes ago and {} no run "
                                 "(`cairn workers --all` lists them; the next worker to start forgets them)",
                                 dead, dead == 1 ? "" : "s", dead == 1 ? "its" : "their",
                                 storage::journal::forgotten_worker_ms / 60'000, dead == 1 ? "it holds" : "they hold")
                  << std::endl;
    }
    return 0;
  });
}

int workspace_command(const paths& p, const std::string& run_id, const std::string& path, bool as_json) {
  return guarded([&] {
    std::optional<storage::run_record> run;
    {
      auto journal = storage::open_journal(p.db, {.read_only = true});
      run = journal->find_run(run_id);
    }
    if (!run) throw engine::engine_error(engine::errc::not_found, fmt::format("no run '{}' in {}", run_id, shown_db(p)));
    if (run->workspace.empty())
      throw engine::engine_error(engine::errc::not_found,
                                 fmt::format("run {} has no workspace yet: the worker that first executes it makes one",
                                             run_id));
    if (!run->workspace_host.empty() && run->workspace_host != engine::current_owner().hostname)
      throw engine::engine_error(engine::errc::not_found,
                                 fmt::format("the workspace of run {} is on {}: run `cairn workspace` there", run_id,
                                             run->workspace_host));
    engine::workspace_files files(p.home, *run);
    if (files.is_file(path) && !as_json) {
      if (!::isatty(STDOUT_FILENO)) {
        files.read(path, UINT64_MAX, [](const char* data, std::size_t size) { std::cout.write(data, size); });
        std::cout.flush();
        if (!std::cout) throw engine::engine_error(engine::errc::bad_request, "writing to stdout failed");
        return 0;
      }
      // An agent wrote it: to a terminal it goes escaped, and only its start.
      constexpr std::uint64_t shown = 1 << 20;
      std::string text;
      files.read(path, shown, [&](const char* data, std::size_t size) { text.append(data, size); });
      std::cout << terminal_text(text, true);
      if (!text.empty() && text.back() != '\n') std::cout << "\n";
      if (text.size() == shown)
        std::cerr << "(the first MiB only, escaped: redirect stdout to a file for its bytes)" << std::endl;
      return 0;
    }
    auto entries = files.list(path);
    if (as_json) {
      json out = {{"run", run->id}, {"status", storage::to_string(run->status)}, {"source", files.source()},
                  {"entries", json::array()}};
      for (const auto& e : entries) {
        json entry = {{"path", e.path}, {"type", std::string(1, e.type)}};
        if (e.type == 'f') entry["size"] = e.size;
        if (e.type == 'l') entry["target"] = e.target;
        out["entries"].push_back(entry);
      }
      std::cout << out.dump(2, ' ', false, json::error_handler_t::replace) << std::endl;
      return 0;
    }
    std::cout << fmt::format("run {} ({}): {} entries, from {}\n", run->id, storage::to_string(run->status),
                             entries.size(), terminal_text(files.source()));
    for (const auto& e : entries)
      std::cout << fmt::format("{} {:>12}  {}{}\n", e.type, e.type == 'f' ? std::to_string(e.size) : "-",
                               terminal_text(e.path), e.type == 'l' ? " -> " + terminal_text(e.target) : "");
    return 0;
  });
}

// Reads a history in chunks of about chunk_bytes (at least one record
// each), handing each record to `each`: `cairn show` of a history of any
// size holds one chunk at a time. A chunk the journal cannot read
// (errc::unreadable) is noted, and the rest of that history skipped.
template <class Read, class Each>
void stream_history(Read read, Each each, std::vector<std::string>& unreadable) {
  for (std::int64_t after = -1;;) {
    auto chunk = readable([&] { return read(after); }, unreadable);
    if (chunk.empty()) return;
    for (auto& record : chunk) after = each(record);
  }
}

constexpr std::uint64_t chunk_bytes = 4 << 20;

int show_command(const paths& p, const std::string& run_id, bool as_json) {
  return guarded([&] {
    auto journal = storage::open_journal(p.db, {.read_only = true});
    auto run = journal->find_run(run_id);
    if (!run) throw engine::engine_error(engine::errc::not_found, fmt::format("no run '{}' in {}", run_id, p.db.string()));
    std::vector<std::string> unreadable;
    auto steps = [&](auto each) {
      stream_history(
          [&](std::int64_t after) {
            return journal->steps_from(run_id, static_cast<std::uint64_t>(after + 1), UINT64_MAX, chunk_bytes);
          },
          [&](const storage::step_record& s) {
            each(s);
            return static_cast<std::int64_t>(s.result.seq);
          },
          unreadable);
    };
    auto events = [&](auto each) {
      stream_history([&](std::int64_t after) { return journal->events_from(run_id, std::max<std::int64_t>(after, 0), chunk_bytes); },
                     [&](const storage::event_record& e) {
                       each(e);
                       return e.id;
                     },
                     unreadable);
    };
    auto signals = readable([&] { return journal->signals(run_id); }, unreadable);
    const auto origin = readable([&] { return engine::forked_from(*journal, run_id); }, unreadable);
    std::vector<engine::fork_link> forks;  // found as its events are read
    const auto kept = readable([&] { return journal->run_state(run_id); }, unreadable);
    const auto journal_bytes = journal->bytes_of_run(run_id);
    if (as_json) {
      // Written as it is read: the same document `json::dump` would make, one
      // step or event at a time.
      const auto text = [](const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); };
      std::cout << "{\"run\": " << text(to_json(*run)) << ",\n\"state\": " << text(kept ? *kept : json())
                << ",\n\"journal_bytes\": " << journal_bytes << ",\n\"steps\": [";
      const char* sep = "\n  ";
      steps([&](const storage::step_record& s) { std::cout << std::exchange(sep, ",\n  ") << text(to_json(s)); });
      std::cout << "],\n\"events\": [";
      sep = "\n  ";
      events([&](const storage::event_record& e) {
        if (auto fork = engine::fork_made(e)) forks.push_back(std::move(*fork));
        std::cout << std::exchange(sep, ",\n  ") << text(to_json(e));
      });
      json rest = {{"signals", json::array()}, {"children", json::array()}};
      for (const auto& sig : signals) rest["signals"].push_back(to_json(sig));
      for (const auto& c : journal->children(run_id)) rest["children"].push_back(c.id);
      if (!unreadable.empty()) rest["unreadable"] = unreadable;
      json links = json::array();
      for (const auto& f : forks) links.push_back({{"run", f.run}, {"seq", f.seq}});
      std::cout << "],\n\"signals\": " << text(rest["signals"]) << ",\n\"children\": " << text(rest["children"])
                << ",\n\"forked_from\": " << text(origin ? json{{"run", origin->run}, {"seq", origin->seq}} : json())
                << ",\n\"forks\": " << text(links);
      if (rest.contains("unreadable")) std::cout << ",\n\"unreadable\": " << text(rest["unreadable"]);
      std::cout << "\n}" << std::endl;
      return 0;
    }
    std::cout << run_summary(*run)
              << (origin ? fmt::format("  forked from {} at step {}\n", terminal_text(origin->run), origin->seq) : "")
              << policy_summary(run->policy) << state_summary(kept, journal_bytes, journal->step_count(run_id)) << "\n"
              << steps_header();
    steps([](const storage::step_record& s) { std::cout << step_row(s); });
    bool any_notable = false;
    events([&](const storage::event_record& e) {
      if (auto fork = engine::fork_made(e)) forks.push_back(std::move(*fork));
      if (!notable(e)) return;
      if (!std::exchange(any_notable, true)) std::cout << "\nevents\n";
      std::cout << event_line(e) << "\n";
    });
    if (!signals.empty()) std::cout << "\nsignals\n";
    for (const auto& sig : signals)
      std::cout << fmt::format("  {}  {:<16} {}  {}\n", format_time(sig.sent_at_ms), terminal_text(sig.name),
                               sig.delivered_seq ? fmt::format("delivered at step {}", *sig.delivered_seq) : "queued",
                               preview(sig.payload, 60));
    auto children = journal->children(run_id);
    if (!children.empty()) std::cout << "\nchildren\n";
    for (const auto& c : children)
      std::cout << fmt::format("  {:<24} {:<10} {}\n", terminal_text(c.id), storage::to_string(c.status),
                               terminal_text(std::filesystem::path(c.agent).filename().string()));
    if (!forks.empty()) std::cout << "\nforks\n";
    for (const auto& f : forks) {
      const auto fork = readable([&] { return journal->find_run(f.run); }, unreadable);
      std::cout << fmt::format("  {:<24} at step {:<6} {}\n", terminal_text(f.run), f.seq,
                               fork ? storage::to_string(fork->status) : "removed");
    }
    if (!unreadable.empty()) std::cout << "\nnot shown\n";
    for (const auto& why : unreadable) std::cout << "  " << terminal_text(why) << "\n";
    return 0;
  });
}

int doctor_command(const paths& p, bool as_json) {
  auto checks = engine::doctor(p.db, shown_db(p), p.home / "config.json");
  std::vector<std::string> failed;
  json out = json::array();
  for (const auto& c : checks) {
    if (!c.ok) failed.push_back(c.name);
    out.push_back({{"check", c.name}, {"ok", c.ok}, {"detail", c.detail}, {"fix", c.fix}});
    // A detail may quote a journal server's error message: escaped, as the agents' text is.
    if (!as_json) {
      std::cout << fmt::format("{} {:<22} {}", c.ok ? "ok  " : "FAIL", c.name, terminal_text(c.detail)) << "\n";
      if (!c.ok && !c.fix.empty()) std::cout << fmt::format("     {:<22} fix: {}", "", terminal_text(c.fix)) << "\n";
    }
  }
  if (as_json) std::cout << out.dump(2, ' ', false, json::error_handler_t::replace) << std::endl;
  else if (failed.empty())
    std::cout << "this machine can run sandboxed agents" << std::endl;
  else
    std::cout << fmt::format("not ready yet: {} failed (see each fix above)", fmt::join(failed, ", ")) << std::endl;
  return failed.empty() ? 0 : 3;
}

int settle_command(const paths& p, const settle_args& args, bool as_json) {
  return guarded([&] {
    engine::settlement s;
    if (args.retry) {
      s.outcome = engine::settlement::how::retry;
    } else if (!args.error.empty()) {
      s.outcome = engine::settlement::how::error;
      s.error = args.error;
    } else {
      s.outcome = engine::settlement::how::result;
      try {
        s.result = protocol::parse_bounded(args.result, "--result",
                                           {protocol::max_output_depth, protocol::default_max_frame});
      } catch (const protocol::json_error& e) {
        std::cerr << "cairn settle: " << e.what() << "\n";
        return 2;
      }
    }
    auto journal = storage::open_journal(p.db);
    engine::engine eng(*journal, options_for(p));
    auto run = eng.settle(args.run_id, args.seq, s);
    if (as_json) {
      std::cout << to_json(run).dump(2, ' ', false, json::error_handler_t::replace) << std::endl;
    } else {
      static constexpr const char* what[] = {"recorded its result", "recorded it as failed",
                                             "it will be called again"};
      // Settled, the run is pending again: a `cairn serve` of the journal takes it.
      const auto hint = no_daemon_hint(*journal, p, run.id);
      std::cout << fmt::format("settled step {} of run {}: {}. {}", args.seq, run.id, what[static_cast<int>(s.outcome)],
                               hint.empty() ? fmt::format("A `cairn serve` of this journal continues it (`cairn logs "
                                                          "{} --follow` shows it)",
                                                          run.id)
                                            : fmt::format("Continue with `cairn resume {}`", run.id))
                << std::endl;
    }
    return 0;
  });
}

}  // namespace cairn::cli
