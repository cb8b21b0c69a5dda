#include "engine/tools/tool.hpp"

namespace cairn::engine {

std::string_view to_string(idempotency i) { return i == idempotency::idempotent ? "idempotent" : "at_most_once"; }

}  // namespace cairn::engine
