// `cairn rm` and `cairn gc`: removing ended runs, their files, and the
// space they held (engine/retention.hpp).
#include <iostream>

#include <fmt/format.h>

#include "cli/commands.hpp"
#include "cli/format.hpp"
#include "cli/support.hpp"
#include "engine/retention.hpp"

namespace cairn::cli {
namespace {

engine::run_file_places places_of(const paths& p) { return {p.home, {}}; }

json to_json(const engine::removal_report& r) {
  json refused = json::array();
  for (const auto& [id, why] : r.refused) refused.push_back({{"id", id}, {"why", why}});
  return {{"removed", r.removed},
          {"refused", refused},
          {"kept", r.notes},
          {"journal_bytes", r.journal_bytes},
          {"file_bytes", r.file_bytes},
          {"journal_size_before", r.before.bytes},
          {"journal_size_after", r.after.bytes}};
}

// What the report says a person should read: refusals and kept files, on stderr.
void print_refusals(const engine::removal_report& r) {
  for (const auto& [id, why] : r.refused) std::cerr << "cairn: not removed: " << terminal_text(why) << "\n";
  for (const auto& line : r.notes) std::cerr << "cairn: " << terminal_text(line) << "\n";
}

std::string freed_line(const engine::removal_report& r) {
  return fmt::format("journal rows {}, files {}; journal {} -> {}", format_bytes(r.journal_bytes),
                     format_bytes(r.file_bytes), format_bytes(r.before.bytes), format_bytes(r.after.bytes));
}

}  // namespace

int rm_command(const paths& p, const std::vector<std::string>& run_ids, bool as_json) {
  return guarded([&] {
    auto journal = storage::open_journal(p.db);
    int worst = 0;
    std::vector<std::string> removable;
    for (const auto& id : run_ids) {
      try {
        engine::check_removable(*journal, id);
        removable.push_back(id);
      } catch (const engine::engine_error& e) {
        std::cerr << "cairn: " << terminal_text(e.what()) << "\n";
        worst = std::max(worst, e.code() == engine::errc::busy ? 4 : 2);
      }
    }
    const auto report = engine::remove_runs(*journal, places_of(p), removable);
    print_refusals(report);
    if (!report.refused.empty()) worst = std::max(worst, 2);
    if (as_json) {
      std::cout << to_json(report).dump(2, ' ', true, json::error_handler_t::replace) << std::endl;
    } else if (!report.removed.empty()) {
      std::cout << fmt::format("removed {} run{}: {}\n  {}", report.removed.size(), report.removed.size() == 1 ? "" : "s",
                               terminal_text(fmt::format("{}", fmt::join(report.removed, " "))), freed_line(report))
                << std::endl;
    }
    return worst;
  });
}

engine::retention_rule retention_rule_of(const gc_args& args, std::int64_t now_ms) {
  engine::retention_rule rule;
  if (!args.statuses.empty()) {
    rule.statuses.clear();
    for (const auto& s : args.statuses) {
      const auto status = storage::parse_run_status(s);
      if (!status || !storage::is_finished(*status))
        throw engine::engine_error(engine::errc::bad_request,
                                   fmt::format("--status {}: only ended runs are removed: give completed, failed or "
                                               "cancelled",
                                               terminal_text(s)));
      rule.statuses.push_back(*status);
    }
  }
  if (!args.older_than.empty()) try {
      rule.older_than = std::chrono::milliseconds(std::max<std::int64_t>(0, now_ms - time_since(args.older_than, now_ms)));
    } catch (const std::invalid_argument& e) {
      throw engine::engine_error(engine::errc::bad_request, std::string("--older-than: ") + e.what());
    }
  rule.keep_last = args.keep_last;
  return rule;
}

int gc_command(const paths& p, const gc_args& args, bool as_json) {
  return guarded([&] {
    const auto now = storage::now_ms();
    const auto rule = retention_rule_of(args, now);
    auto journal = storage::open_journal(p.db);
    const auto selected = engine::select_runs(*journal, rule, now);
    if (args.dry_run) {
      std::uint64_t bytes = 0;
      json runs = json::array();
      for (const auto& r : selected) {
        const auto held = journal->bytes_of_run(r.id);
        bytes += held;
        runs.push_back({{"id", r.id},
                        {"status", storage::to_string(r.status)},
                        {"ended_at_ms", r.ended_at_ms},
                        {"journal_bytes", held}});
      }
      if (as_json) {
        std::cout << json{{"dry_run", true}, {"runs", runs}, {"journal_bytes", bytes}}.dump(2, ' ', true) << std::endl;
        return 0;
      }
      for (const auto& r : selected)
        std::cout << terminal_text(fmt::format("{}  {}  ended {}", r.id, storage::to_string(r.status),
                                               format_time(r.ended_at_ms)))
                  << "\n";
      std::cout << fmt::format("would remove {} run{} (journal rows {}); --dry-run: nothing was changed",
                               selected.size(), selected.size() == 1 ? "" : "s", format_bytes(bytes))
                << std::endl;
      return 0;
    }
    std::vector<std::string> ids;
    ids.reserve(selected.size());
    for (const auto& r : selected) ids.push_back(r.id);
    const auto report = engine::remove_runs(*journal, places_of(p), ids);
    print_refusals(report);
    if (as_json) {
      auto out = to_json(report);
      out["dry_run"] = false;
      std::cout << out.dump(2, ' ', true, json::error_handler_t::replace) << std::endl;
      return 0;
    }
    std::cout << fmt::format("removed {} run{}{}; {}", report.removed.size(), report.removed.size() == 1 ? "" : "s",
                             report.refused.empty() ? "" : fmt::format(" ({} refused)", report.refused.size()),
                             freed_line(report))
              << std::endl;
    return 0;
  });
}

}  // namespace cairn::cli
