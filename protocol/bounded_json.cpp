#include "protocol/bounded_json.hpp"

#include <algorithm>
#include <memory>
#include <vector>

namespace cairn::protocol {

std::size_t nesting_depth(std::string_view text) {
  std::size_t depth = 0, deepest = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

std::size_t nesting_depth(const nlohmann::json& value) {
  std::size_t deepest = 0;
  std::vector<std::pair<const nlohmann::json*, std::size_t>> todo{{&value, 0}};
  while (!todo.empty()) {
    auto [v, depth] = todo.back();
    todo.pop_back();
    if (!v->is_structured()) continue;
    deepest = std::max(deepest, depth + 1);
    for (const auto& child : *v) todo.emplace_back(&child, depth + 1);
  }
  return deepest;
}

namespace {

// An output for nlohmann's serializer that only counts.
class byte_counter : public nlohmann::detail::output_adapter_protocol<char> {
 public:
  void write_character(char) override { ++bytes; }
  void write_characters(const char*, std::size_t length) override { bytes += length; }
  std::size_t bytes = 0;
};

}  // namespace

std::size_t dumped_size(const nlohmann::json& value) {
  auto counter = std::make_shared<byte_counter>();
  nlohmann::detail::serializer<nlohmann::json> out(counter, ' ', nlohmann::json::error_handler_t::replace);
  out.dump(value, false, false, 0);
  return counter->bytes;
}

nlohmann::json parse_bounded(std::string_view text, std::string_view what, const json_bounds& bounds) {
  if (text.size() > bounds.max_bytes)
    throw json_error(std::string(what) + " is " + std::to_string(text.size()) + " bytes, over the limit of " +
                     std::to_string(bounds.max_bytes) + " bytes");
  if (nesting_depth(text) > bounds.max_depth)
    throw json_error(std::string(what) + " nests deeper than " + std::to_string(bounds.max_depth) + " levels");
  // nlohmann's reader ends a text at a NUL byte, so "{}\0anything" would pass
  // as {}; no JSON text holds a raw NUL.
  if (text.find('\0') != std::string_view::npos) throw json_error(std::string(what) + " is not valid JSON");
  auto value = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) throw json_error(std::string(what) + " is not valid JSON");
  return value;
}

}  // namespace cairn::protocol
