#include "engine/tools/tool.hpp"

namespace cairn::engine {

namespace {
test_tools granted;
}  // namespace

void grant_test_tools(test_tools make) { granted = std::move(make); }

const test_tools& granted_test_tools() { return granted; }

std::string_view to_string(idempotency i) { return i == idempotency::idempotent ? "idempotent" : "at_most_once"; }

}  // namespace cairn::engine
