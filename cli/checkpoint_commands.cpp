// `cairn workspace RUN --at SEQ` and `cairn diff RUN A B`: a run's files as
// the checkpoint of one of its steps holds them, and what changed between
// two steps (engine/workspace_checkpoints.hpp). Read from the journal alone:
// the run's own workspace is not touched.
#include <unistd.h>

#include <climits>
#include <iostream>

#include <fmt/format.h>

#include "cli/commands.hpp"
#include "cli/format.hpp"
#include "cli/support.hpp"
#include "engine/engine.hpp"
#include "engine/workspace_checkpoints.hpp"

namespace cairn::cli {
namespace {

std::unique_ptr<storage::journal> journal_with_run(const paths& p, const std::string& run_id) {
  auto journal = storage::open_journal(p.db, {.read_only = true});
  if (!journal->find_run(run_id))
    throw engine::engine_error(engine::errc::not_found, fmt::format("no run '{}' in {}", run_id, shown_db(p)));
  return journal;
}

// "a/b" from "a/b", "/workspace/a/b", "./a/b/"; "" for the whole workspace.
std::string relative(const std::string& path) {
  std::string p = std::filesystem::path(path).lexically_normal().generic_string();
  if (p.starts_with("/workspace")) p.erase(0, 10);
  while (p.starts_with("/") || p.starts_with("./")) p.erase(0, p[0] == '/' ? 1 : 2);
  while (p.ends_with("/")) p.pop_back();
  return p == "." ? "" : p;
}

json entry_json(const std::string& path, const engine::checkpoint_entry& e) {
  json j = {{"path", path}, {"type", std::string(1, e.type)}, {"mode", fmt::format("{:04o}", e.mode)}};
  if (e.type == 'f') j["size"] = e.size;
  if (e.type == 'l') j["target"] = e.target;
  return j;
}

std::string entry_line(const std::string& path, const engine::checkpoint_entry& e) {
  return fmt::format("{} {:04o} {:>12}  {}{}", e.type, e.mode, e.type == 'f' ? std::to_string(e.size) : "-",
                     terminal_text(path), e.type == 'l' ? " -> " + terminal_text(e.target) : "");
}

}  // namespace

int workspace_at_command(const paths& p, const std::string& run_id, std::uint64_t seq, const std::string& path,
                         bool as_json) {
  return guarded([&] {
    auto journal = journal_with_run(p, run_id);
    const auto state = engine::checkpoint_at(*journal, run_id, seq);
    const std::string want = relative(path);
    if (!want.empty() && !state.contains(want))
      throw engine::engine_error(engine::errc::not_found,
                                 fmt::format("run {} had no '{}' in its workspace after step {}", run_id,
                                             terminal_text(want), seq));
    if (!want.empty() && state.at(want).type == 'f' && !as_json) {
      const auto& file = state.at(want);
      if (!::isatty(STDOUT_FILENO)) {
        engine::read_checkpoint_file(*journal, file, UINT64_MAX,
                                     [](const char* data, std::size_t size) { std::cout.write(data, size); });
        std::cout.flush();
        if (!std::cout) throw engine::engine_error(engine::errc::bad_request, "writing to stdout failed");
        return 0;
      }
      // An agent wrote it: to a terminal it goes escaped, and only its start.
      constexpr std::uint64_t shown = 1 << 20;
      std::string text;
      engine::read_checkpoint_file(*journal, file, shown,
                                   [&](const char* data, std::size_t size) { text.append(data, size); });
      std::cout << terminal_text(text, true);
      if (!text.empty() && text.back() != '\n') std::cout << "\n";
      if (file.size > shown) std::cerr << "(the first MiB only, escaped: redirect stdout to a file for its bytes)\n";
      return 0;
    }
    std::vector<std::pair<std::string, const engine::checkpoint_entry*>> entries;
    for (const auto& [at, e] : state)
      if (want.empty() || at == want || at.starts_with(want + "/")) entries.emplace_back(at, &e);
    if (as_json) {
      json out = {{"run", run_id}, {"at", seq}, {"entries", json::array()}};
      for (const auto& [at, e] : entries) out["entries"].push_back(entry_json(at, *e));
      std::cout << out.dump(2, ' ', false, json::error_handler_t::replace) << std::endl;
      return 0;
    }
    std::cout << fmt::format("run {} after step {}: {} entries, from its checkpoints\n", run_id, seq, entries.size());
    for (const auto& [at, e] : entries) std::cout << entry_line(at, *e) << "\n";
    return 0;
  });
}

int diff_command(const paths& p, const std::string& run_id, std::uint64_t from, std::uint64_t to, bool as_json) {
  return guarded([&] {
    auto journal = journal_with_run(p, run_id);
    const auto changes =
        engine::diff_states(engine::checkpoint_at(*journal, run_id, from), engine::checkpoint_at(*journal, run_id, to));
    if (as_json) {
      json out = {{"run", run_id}, {"from", from}, {"to", to}, {"changes", json::array()}};
      for (const auto& c : changes) {
        json j = {{"change", std::string(1, c.how)}, {"path", c.path}};
        if (c.before) j["before"] = entry_json(c.path, *c.before);
        if (c.after) j["after"] = entry_json(c.path, *c.after);
        out["changes"].push_back(j);
      }
      std::cout << out.dump(2, ' ', false, json::error_handler_t::replace) << std::endl;
      return 0;
    }
    std::cout << fmt::format("run {}, step {} to step {}: {} changes\n", run_id, from, to, changes.size());
    for (const auto& c : changes) {
      const auto& e = c.after ? *c.after : *c.before;
      std::string size = e.type == 'f' ? std::to_string(e.size) : "-";
      if (c.how == 'M' && c.before->type == 'f' && e.type == 'f') size = fmt::format("{} -> {}", c.before->size, e.size);
      std::cout << fmt::format("{} {:>22}  {}{}\n", c.how, size, terminal_text(c.path),
                               e.type == 'l' ? " -> " + terminal_text(e.target) : e.type == 'd' ? "/" : "");
    }
    return 0;
  });
}

}  // namespace cairn::cli
