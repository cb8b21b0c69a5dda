// The policy parser (engine/policy.hpp) on any text, read as load_policy_file
// reads a file (parse_bounded, then parse_policy). Beyond not crashing, it
// asserts:
// - only json_error and policy_error escape;
// - a parsed policy's normalized form holds every value the text gave, and,
//   stored as text and parsed again (as a resumed run's policy is), gives the
//   same policy: it parses, and to_json of it is the same normalized form;
// - it grants each tool it names, and its normalized form lists those.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "engine/policy.hpp"
#include "protocol/bounded_json.hpp"
#include "tests/fuzz/contract.hpp"

using cairn::fuzz::require;
using namespace cairn;

namespace {

// Whether every value of `given` is in `normalized` at the same place (an
// object's keys one by one, anything else as a whole).
bool holds(const engine::json& given, const engine::json& normalized) {
  if (!given.is_object() || !normalized.is_object()) return given == normalized;
  for (const auto& [key, value] : given.items())
    if (!normalized.contains(key) || !holds(value, normalized[key])) return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  engine::json given;
  engine::policy policy;
  try {
    given = protocol::parse_bounded(text, "policy");
    policy = engine::parse_policy(given);
  } catch (const protocol::json_error&) {
    return 0;
  } catch (const engine::policy_error&) {
    return 0;
  }
  const engine::json normalized = engine::to_json(policy);
  require(holds(given, normalized), "the normalized form lost or changed a value the policy gave");
  const engine::policy again = engine::parse_policy(protocol::parse_bounded(normalized.dump(), "normalized policy"));
  require(engine::to_json(again) == normalized, "the normalized form does not parse back to the same policy");
  const auto tools = policy.tool_names();
  require(normalized["tools"].size() == tools.size(), "the normalized form lists other tools than the policy names");
  for (const auto& tool : tools)
    require(policy.grants(tool) && normalized["tools"].contains(tool), "a named tool is not granted or not listed");
  return 0;
}
