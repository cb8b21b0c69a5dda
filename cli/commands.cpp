#include "cli/commands.hpp"

#include <iostream>
#include <set>

#include <fmt/format.h>

#include "cli/format.hpp"
#include "engine/doctor.hpp"
#include "engine/owner.hpp"

namespace cairn::cli {
namespace {

// Prints each step the moment it is journaled.
class progress_printer : public engine::run_observer {
 public:
  explicit progress_printer(bool quiet) : quiet_(quiet) {}

  void on_attempt(const storage::run_record& run, int attempt) override {
    say(fmt::format("run {}: attempt {} in a {} sandbox, workspace {}", run.id, attempt, run.sandbox,
                    run.workspace));
  }
  void on_step(const storage::step_record& step) override {
    end_stream();
    say(step_line(step));
  }
  void on_retry(const protocol::retry_msg& m) override {
    say(fmt::format("       step {} '{}' attempt {} failed ({}); retrying in {} ms", m.seq, m.name, m.attempt,
                    m.error.message, m.delay_ms));
  }
  // LLM tokens print as they stream, on one line; other events one per line.
  void on_emit(const json& data) override {
    if (data.is_object() && data.value("type", "") == "token" && data.contains("text") && data["text"].is_string()) {
      if (quiet_) return;
      if (!streaming_) std::cout << "       " << data.value("tool", "tool") << " > ";
      streaming_ = true;
      std::cout << data["text"].get<std::string>() << std::flush;
      return;
    }
    end_stream();
    say("       emit " + preview(data, 100));
  }
  void on_attempt_failed(int attempt, const std::string& reason, bool will_retry) override {
    say(fmt::format("attempt {} crashed: {}{}", attempt, reason, will_retry ? "; retrying from the journal" : ""));
  }
  void on_warning(const std::string& message) override { std::cerr << "warning: " << message << std::endl; }

 private:
  void say(const std::string& line) const {
    if (!quiet_) std::cout << line << std::endl;
  }
  void end_stream() {
    if (streaming_) std::cout << std::endl;
    streaming_ = false;
  }
  bool quiet_;
  bool streaming_ = false;
};

engine::engine_options options_for(const paths& p) {
  engine::engine_options o;
  o.log_dir = p.logs;
  o.llm = engine::llm_endpoint_from_host(p.home / "config.json");
  return o;
}

// Runs `body`, turning every expected failure into one message and an exit code.
template <class F>
int guarded(F&& body) {
  try {
    return body();
  } catch (const engine::engine_error& e) {
    std::cerr << "cairn: " << e.what() << "\n";
    return e.code() == engine::errc::busy ? 4 : 2;
  } catch (const storage::storage_error& e) {
    std::cerr << "cairn: " << e.what() << "\n";
    return 3;
  } catch (const runtime::sandbox_error& e) {
    std::cerr << "cairn: " << e.what() << "\n";
    return 3;
  } catch (const std::filesystem::filesystem_error& e) {
    std::cerr << "cairn: " << e.what() << "\n";
    return 3;
  } catch (const engine::policy_error& e) {
    std::cerr << "cairn: " << e.what() << "\n";
    return 2;
  } catch (const std::runtime_error& e) {  // e.g. an unreadable host config file
    std::cerr << "cairn: " << e.what() << "\n";
    return 3;
  }
}

int report_end(const storage::run_record& run, bool as_json) {
  if (as_json) {
    std::cout << to_json(run).dump(2, ' ', false, json::error_handler_t::replace) << std::endl;
  } else if (run.status == storage::run_status::completed) {
    double secs = (run.finished_at_ms.value_or(run.updated_at_ms) - run.created_at_ms) / 1000.0;
    std::cout << fmt::format("run {} completed in {:.2f} s\n{}", run.id, secs, run.output.dump(2, ' ', false, json::error_handler_t::replace)) << std::endl;
  }
  if (run.status == storage::run_status::completed) return 0;
  if (run.error)
    std::cerr << fmt::format("run {} {}: {}", run.id,
                             run.status == storage::run_status::in_doubt ? "stopped in doubt" : "failed",
                             run.error->message)
              << std::endl;
  return 1;
}

void print_history(storage::journal& journal, const std::string& run_id, bool quiet) {
  auto steps = journal.steps(run_id);
  if (quiet || steps.empty()) return;
  std::cout << fmt::format("run {}: {} step{} already journaled, replaying them", run_id, steps.size(),
                           steps.size() == 1 ? "" : "s")
            << std::endl;
  for (const auto& s : steps) std::cout << step_line(s) << std::endl;
}

}  // namespace

int run_command(const paths& p, const run_args& args, bool as_json) {
  return guarded([&] {
    engine::run_request request;
    try {
      request.input = json::parse(args.input);
    } catch (const json::parse_error& e) {
      std::cerr << "cairn run: --input is not valid JSON: " << e.what() << "\n";
      return 2;
    }
    std::error_code ec;
    if (!std::filesystem::is_regular_file(args.agent, ec)) {
      std::cerr << (ec && ec != std::errc::no_such_file_or_directory ? fmt::format("cairn run: cannot reach agent program '{}': {}\n", args.agent, ec.message())
                       : fmt::format("cairn run: agent program '{}' not found (build it first: make build)\n",
                                     args.agent));
      return 2;
    }
    request.id = args.id.empty() ? engine::new_run_id() : args.id;
    request.agent = args.agent;
    request.sandbox = args.sandbox;
    request.max_attempts = args.max_attempts;
    if (!args.policy.empty()) request.policy = engine::load_policy_file(args.policy);
    request.workspace = args.workspace.empty() ? p.workspaces / request.id : std::filesystem::path(args.workspace);

    storage::journal journal(p.db);
    engine::engine eng(journal, options_for(p));
    auto [run, created] = eng.submit(request);
    if (!created) {
      if (!as_json)
        std::cout << fmt::format("run {} already exists ({}); the id is an idempotency key", run.id,
                                 storage::to_string(run.status))
                  << std::endl;
      if (run.status == storage::run_status::failed || run.status == storage::run_status::completed ||
          run.status == storage::run_status::in_doubt)
        return report_end(run, as_json);
      print_history(journal, run.id, as_json);
    }
    progress_printer printer(as_json);
    return report_end(eng.execute(run.id, &printer), as_json);
  });
}

int resume_command(const paths& p, const std::string& run_id, bool all, bool as_json) {
  return guarded([&] {
    storage::journal journal(p.db);
    engine::engine eng(journal, options_for(p));
    progress_printer printer(as_json);
    if (!all) {
      print_history(journal, run_id, as_json);
      return report_end(eng.execute(run_id, &printer), as_json);
    }
    auto orphans = eng.orphaned_runs();
    if (orphans.empty() && !as_json) std::cout << "nothing to resume: no run was left unfinished" << std::endl;
    int worst = 0;
    json results = json::array();
    for (const auto& run : orphans) {
      if (!as_json) std::cout << fmt::format("resuming {} (left {} by {})", run.id, storage::to_string(run.status),
                                             run.owner.empty() ? "nobody" : engine::describe_owner(run.owner))
                              << std::endl;
      print_history(journal, run.id, as_json);
      auto end = eng.execute(run.id, &printer);
      results.push_back(to_json(end));
      worst = std::max(worst, as_json ? (end.status == storage::run_status::completed ? 0 : 1)
                                      : report_end(end, false));
    }
    if (as_json) std::cout << results.dump(2, ' ', false, json::error_handler_t::replace) << std::endl;
    return worst;
  });
}

int ls_command(const paths& p, bool as_json) {
  return guarded([&] {
    storage::journal journal(p.db, {.read_only = true});
    auto runs = journal.list_runs();
    if (as_json) {
      json out = json::array();
      for (const auto& r : runs) out.push_back(to_json(r));
      std::cout << out.dump(2, ' ', false, json::error_handler_t::replace) << std::endl;
    } else {
      std::cout << runs_table(journal, runs);
    }
    return 0;
  });
}

int show_command(const paths& p, const std::string& run_id, bool as_json) {
  return guarded([&] {
    storage::journal journal(p.db, {.read_only = true});
    auto run = journal.find_run(run_id);
    if (!run) throw engine::engine_error(engine::errc::not_found, fmt::format("no run '{}' in {}", run_id, p.db.string()));
    auto steps = journal.steps(run_id);
    auto events = journal.events(run_id);
    if (as_json) {
      json out = {{"run", to_json(*run)}, {"steps", json::array()}, {"events", json::array()}};
      for (const auto& s : steps) out["steps"].push_back(to_json(s));
      for (const auto& e : events) out["events"].push_back(to_json(e));
      std::cout << out.dump(2, ' ', false, json::error_handler_t::replace) << std::endl;
      return 0;
    }
    std::cout << run_summary(*run) << policy_summary(run->policy) << "\n" << steps_table(steps);
    std::string notable;
    for (const auto& e : events) {
      static const std::set<std::string> shown = {"attempt_crashed", "step_retry",      "run_failed",
                                                  "run_in_doubt",    "tool_settled",    "limit_exceeded",
                                                  "sandbox_warning"};
      if (shown.count(e.kind))
        notable += fmt::format("  {}  {:<16} {}{}\n", format_time(e.at_ms), e.kind,
                               e.seq ? fmt::format("seq {} ", *e.seq) : "", preview(e.data, 90));
    }
    if (!notable.empty()) std::cout << "\nevents\n" << notable;
    return 0;
  });
}

int doctor_command(const paths& p, bool as_json) {
  auto checks = engine::doctor(p.db, p.home / "config.json");
  bool ok = true;
  json out = json::array();
  for (const auto& c : checks) {
    ok = ok && c.ok;
    out.push_back({{"check", c.name}, {"ok", c.ok}, {"detail", c.detail}, {"fix", c.fix}});
    if (!as_json) {
      std::cout << fmt::format("{} {:<22} {}", c.ok ? "ok  " : "FAIL", c.name, c.detail) << "\n";
      if (!c.ok && !c.fix.empty()) std::cout << fmt::format("     {:<22} fix: {}", "", c.fix) << "\n";
    }
  }
  if (as_json) std::cout << out.dump(2, ' ', false, json::error_handler_t::replace) << std::endl;
  else std::cout << (ok ? "this machine can run sandboxed agents" : "this machine cannot run sandboxed agents yet")
                 << std::endl;
  return ok ? 0 : 3;
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
      s.result = json::parse(args.result, nullptr, false);
      if (s.result.is_discarded()) {
        std::cerr << "cairn settle: --result is not valid JSON\n";
        return 2;
      }
    }
    storage::journal journal(p.db);
    engine::engine eng(journal, options_for(p));
    auto run = eng.settle(args.run_id, args.seq, s);
    if (as_json) {
      std::cout << to_json(run).dump(2, ' ', false, json::error_handler_t::replace) << std::endl;
    } else {
      static constexpr const char* what[] = {"recorded its result", "recorded it as failed",
                                             "it will be called again"};
      std::cout << fmt::format("settled step {} of run {}: {}. Continue with `cairn resume {}`", args.seq, run.id,
                               what[static_cast<int>(s.outcome)], run.id)
                << std::endl;
    }
    return 0;
  });
}

}  // namespace cairn::cli
