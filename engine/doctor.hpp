// `cairn doctor`: can this machine run sandboxed agents, and can it write the
// journal? Each failed check carries its fix.
#pragma once

#include <filesystem>
#include <vector>

#include "runtime/sandbox.hpp"

namespace cairn::engine {

std::vector<runtime::doctor_check> doctor(const std::filesystem::path& db);

}  // namespace cairn::engine
