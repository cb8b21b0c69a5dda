// parse_bounded and its measures (protocol/bounded_json.hpp) on any text. The
// first input byte picks the bounds: a depth of 0 to 15, and a byte limit of
// the text's size or one byte less; the rest is the text. Beyond not
// crashing, it asserts:
// - only json_error escapes, its what() starting with the name given;
// - a text is refused exactly when it is longer than the limit, nests deeper
//   than the bound (nesting_depth of the text), or is not JSON;
// - a parsed value is no deeper than the bound, as deep as its text says,
//   dumped_size() is the size of its dump, and it parses back from its dump.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "protocol/bounded_json.hpp"
#include "tests/fuzz/contract.hpp"

using cairn::fuzz::require;
using namespace cairn::protocol;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  json_bounds bounds;
  bounds.max_depth = data[0] & 0x0f;
  bounds.max_bytes = (data[0] & 0x10) != 0 && !text.empty() ? text.size() - 1 : text.size();

  const bool fits = text.size() <= bounds.max_bytes && nesting_depth(text) <= bounds.max_depth;
  // One JSON text (RFC 8259). nlohmann's accept, like its parse, ends a text at a NUL byte.
  const bool is_json = text.find('\0') == std::string_view::npos && nlohmann::json::accept(text);
  nlohmann::json value;
  try {
    value = parse_bounded(text, "fuzzed text", bounds);
  } catch (const json_error& e) {
    require(std::string_view(e.what()).starts_with("fuzzed text "), "a json_error does not start with the name given");
    require(!fits || !is_json, "a JSON text within the bounds was refused");
    return 0;
  }
  require(fits && is_json, "a text beyond the bounds, or not JSON, was parsed");
  require(nesting_depth(value) <= bounds.max_depth, "a parsed value nests deeper than the bound");
  // No deeper than its text: shallower where a repeated name's later, flatter
  // member replaced an earlier, deeper one ({"c":[{}],"c":1}: JSON leaves
  // repeated names to the parser, and nlohmann keeps the last).
  require(nesting_depth(value) <= nesting_depth(text), "a value nests deeper than its text");
  const std::string dumped = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  require(dumped_size(value) == dumped.size(), "dumped_size() differs from the size of the dump");
  require(parse_bounded(dumped, "dumped text", {bounds.max_depth, dumped.size()}) == value,
          "a value does not parse back from its dump");
  return 0;
}
