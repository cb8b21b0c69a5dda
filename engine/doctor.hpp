// `cairn doctor`: can this machine run sandboxed agents, and can it write the
// journal? Each failed check carries its fix.
#pragma once

#include <filesystem>
#include <vector>

#include "runtime/sandbox.hpp"

namespace cairn::engine {

// `config_file` is the host config that may name the LLM endpoint.
std::vector<runtime::doctor_check> doctor(const std::filesystem::path& db, const std::filesystem::path& config_file);

}  // namespace cairn::engine
