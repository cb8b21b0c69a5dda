#include "engine/agent_versions.hpp"

#include <fmt/format.h>

#include "runtime/sandbox.hpp"

namespace cairn::engine {
namespace {

namespace fs = std::filesystem;

// The agent at `program`: a child of a kept version lies in the copy, in CAIRN_HOME.
runtime::agent_version identify(const fs::path& program, const std::vector<fs::path>& private_paths) {
  return runtime::identify_agent(program, private_paths_for(program, private_paths));
}

// The agent identified and kept: the effect that records it.
effects::agent_chosen chosen(runtime::agent_version v, const fs::path& store,
                             const std::vector<fs::path>& private_paths, bool replaced) {
  effects::agent_chosen c;
  auto kept = runtime::keep_agent(v, store, private_paths_for(v.program, private_paths));
  if (auto* program = std::get_if<fs::path>(&kept)) c.kept = program->string();
  else c.unkept = std::get<std::string>(kept);
  c.version = std::move(v);
  c.replaced = replaced;
  return c;
}

fs::path program_of(const effects::agent_chosen& c) { return c.kept.empty() ? c.version.program : fs::path(c.kept); }

std::string describe(const runtime::agent_version& v) {
  return v.script ? fmt::format("{} ({} files, {} bytes, with its folder)", v.id, v.files, v.bytes) : v.id;
}

}  // namespace

fs::path agent_store(const fs::path& home) { return home / "agents"; }

agent_choice choose_agent(const storage::run_record& run, const std::optional<run_agent>& recorded,
                          const fs::path& store, const std::vector<fs::path>& private_paths) {
  agent_choice choice;
  if (!recorded) {
    auto c = chosen(identify(run.agent, private_paths), store, private_paths, false);
    choice.program = program_of(c);
    choice.effects.push_back(std::move(c));
    return choice;
  }
  std::optional<runtime::agent_version> now;
  std::string now_text;
  try {
    now = identify(recorded->agent, private_paths);
    now_text = "is now " + describe(*now);
  } catch (const runtime::sandbox_error& e) {
    now_text = fmt::format("is gone ({})", e.what());
  }
  auto kept = runtime::find_kept_agent(store, recorded->version, recorded->program);
  if (now && now->id == recorded->version) {
    // This host has no copy yet (a run another worker began, a copy removed): it keeps one now.
    if (!kept) {
      auto c = chosen(std::move(*now), store, private_paths, false);
      choice.program = program_of(c);
      return choice;
    }
    choice.program = *kept;
    return choice;
  }
  const std::string changed = fmt::format("the agent changed since this run started: {} was {} and {}",
                                          recorded->agent, recorded->version, now_text);
  if (kept) {
    choice.program = *kept;
    choice.effects.push_back(effects::agent_changed{recorded->agent, recorded->version, now ? now->id : "", kept->string()});
    choice.warning = fmt::format("{}; run {} resumes on the copy kept when it started, {}. To resume it on the agent "
                                 "as it is now instead: cairn resume {} --agent {}",
                                 changed, run.id, kept->string(), run.id, recorded->agent);
    return choice;
  }
  choice.refusal = fmt::format("{}; the copy kept when it started is not in {} (the run began on another worker of a "
                               "shared journal, or the copy was removed), so it cannot resume on the version it began "
                               "with. Put that version back at {}, or resume it on the agent as it is now: cairn "
                               "resume {} --agent {}",
                               changed, store.string(), recorded->agent, run.id, recorded->agent);
  return choice;
}

effects::agent_chosen replacement_agent(const fs::path& program, const fs::path& store,
                                        const std::vector<fs::path>& private_paths) {
  return chosen(identify(program, private_paths), store, private_paths, true);
}

std::vector<fs::path> private_paths_for(const fs::path& program, std::vector<fs::path> private_paths) {
  std::erase_if(private_paths, [&](const fs::path& p) {
    const auto rel = program.lexically_normal().lexically_relative(p.lexically_normal());
    return !rel.empty() && *rel.begin() != "..";
  });
  return private_paths;
}

}  // namespace cairn::engine
