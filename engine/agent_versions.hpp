// Which agent a run's attempts execute. A run keeps the version of the agent
// it began with (runtime/agent_version.hpp): at its first attempt the agent
// at its path is identified, a copy of it is kept in CAIRN_HOME/agents by
// content, and every attempt after (a crash's, a wake-up's, days later)
// executes that copy, whatever was rebuilt at the path meanwhile. When the
// agent at the path changed, the attempt says so; when no copy is there (a
// worker of a shared journal that did not keep it, a copy removed) and the
// agent changed, the run cannot go on as it began and is refused, naming
// `cairn resume RUN --agent PATH`, which replaces its version on purpose.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "engine/effects.hpp"
#include "engine/run_state.hpp"

namespace cairn::engine {

// Where this host keeps agents' copies: HOME/agents.
std::filesystem::path agent_store(const std::filesystem::path& home);

struct agent_choice {
  std::filesystem::path program;  // what the attempts execute; empty when refused
  std::vector<effect> effects;    // to journal before the attempt
  std::string warning;            // for whoever follows the run ("" none)
  std::string refusal;            // why the run cannot go on ("" when it can)
};

// The choice for run `run` whose recorded version is `recorded` (none: it
// has not been identified yet). `private_paths` as sandbox_spec's. Throws
// runtime::sandbox_error(bad_spec) when a run's first agent cannot be read.
agent_choice choose_agent(const storage::run_record& run, const std::optional<run_agent>& recorded,
                          const std::filesystem::path& store, const std::vector<std::filesystem::path>& private_paths);

// `cairn resume RUN --agent PATH`: the agent at `program`, identified and
// kept, as the version run `run_id` executes from now on (an agent_replaced
// event, by request). Throws runtime::sandbox_error(bad_spec) when it cannot
// be read.
effects::agent_chosen replacement_agent(const std::filesystem::path& program, const std::filesystem::path& store,
                                        const std::vector<std::filesystem::path>& private_paths);

// `private_paths` without those that hold `program` (a kept copy lies in
// CAIRN_HOME, which its sandbox may show: cairn made it, and it holds only
// the agent).
std::vector<std::filesystem::path> private_paths_for(const std::filesystem::path& program,
                                                     std::vector<std::filesystem::path> private_paths);

}  // namespace cairn::engine
