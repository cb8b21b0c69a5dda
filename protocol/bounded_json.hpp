// The one reader for JSON that enters the host from outside: agent frames,
// signal payloads, tool and command outputs, model and HTTP replies, policy
// files, and what the journal loads. Copying, comparing or printing a json
// value recurses once per level, so a 120 KB text nested 60,000 deep would
// overflow the stack of whoever touches it; every such text is refused here,
// before a value exists.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "protocol/frame.hpp"

namespace cairn::protocol {

// What a text may be. max_depth counts nested arrays and objects (a scalar
// is depth 0, `[]` depth 1).
struct json_bounds {
  std::size_t max_depth = protocol::max_depth;
  std::size_t max_bytes = default_max_frame;
};

// The text was not valid JSON, nested too deep, or too long. what() starts
// with `what` as given to parse_bounded ("signal payload nests deeper than
// 128 levels"), so a caller can show it as it is.
class json_error : public protocol_error {
 public:
  using protocol_error::protocol_error;
};

// Parses `text` within `bounds`. `what` names the text in errors. Throws
// json_error; never recurses deeper than bounds.max_depth.
nlohmann::json parse_bounded(std::string_view text, std::string_view what, const json_bounds& bounds = {});

// Deepest nesting of arrays and objects in a JSON text, counted without
// parsing (and without recursion).
std::size_t nesting_depth(std::string_view text);

// Deepest nesting of a value already built (without recursion), for values
// that did not come through parse_bounded.
std::size_t nesting_depth(const nlohmann::json& value);

// The bytes of value.dump() (compact, invalid UTF-8 replaced, as the journal
// stores values), counted without building the text. Recurses once per
// level: only for values whose depth is bounded.
std::size_t dumped_size(const nlohmann::json& value);

}  // namespace cairn::protocol
