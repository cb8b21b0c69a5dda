// URL handling of the HTTP client (engine/tools/http_client.hpp), through its
// public functions only: parse_url on the input's first line and, when it
// parses, resolve_location of the rest against it (a Location header).
// Beyond not crashing, it asserts:
// - every failure is a tool_error of type "refused";
// - every URL either gives is what `url` promises: scheme http or https, a
//   host in lowercase and without brackets, a port, a target that starts
//   with '/' and holds no fragment, space, control or non-ASCII byte;
// - such a URL re-serialises (to_string) and re-parses to the same URL.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "engine/tools/http_client.hpp"
#include "engine/tools/tool.hpp"
#include "tests/fuzz/contract.hpp"

using cairn::fuzz::require;
using namespace cairn::engine;

namespace {

void check(const http::url& u) {
  require(u.scheme == "http" || u.scheme == "https", "the scheme is not http or https");
  require(!u.host.empty(), "the host is empty");
  require(std::none_of(u.host.begin(), u.host.end(), [](char c) { return (c >= 'A' && c <= 'Z') || c == '[' || c == ']'; }),
          "the host has an upper-case letter or a bracket");
  require(u.port != 0, "the port is 0");
  require(u.target.starts_with('/'), "the target does not start with '/'");
  require(std::all_of(u.target.begin(), u.target.end(), [](char c) { return c > 0x20 && c < 0x7f && c != '#'; }),
          "the target holds a fragment, a space, a control or a non-ASCII byte");
  const http::url again = http::parse_url(u.to_string());
  require(again.scheme == u.scheme && again.host == u.host && again.port == u.port && again.target == u.target,
          "a URL does not re-parse from its to_string() to the same URL");
}

// What `f` gives, or nothing when it refused the URL.
template <typename F>
std::optional<http::url> unless_refused(F f) {
  try {
    return f();
  } catch (const tool_error& e) {
    require(e.type() == "refused", "a URL failed with a tool_error other than refused");
    return std::nullopt;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto newline = std::min(text.find('\n'), text.size());
  const auto base = unless_refused([&] { return http::parse_url(text.substr(0, newline)); });
  if (!base) return 0;
  check(*base);
  if (newline == text.size()) return 0;
  if (const auto location = unless_refused([&] { return http::resolve_location(*base, text.substr(newline + 1)); }))
    check(*location);
  return 0;
}
