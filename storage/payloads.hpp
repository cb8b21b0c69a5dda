// Payloads stored by content. A model request carries the whole conversation
// so far; journaled as it is, a run of N model calls would store the
// conversation N times. Instead every long string of a journaled value is
// stored once per run, under its SHA-256, and the value keeps a reference in
// its place: the journal grows with what is new.
//
// A reference is a string "\0sha256:HEX". A string of the value that itself
// starts with "\0" is kept with one more "\0" in front, so no value the
// agent sends can pose as a reference.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace cairn::storage {

using json = nlohmann::json;

// Strings of at least this many bytes are stored by content.
inline constexpr std::size_t payload_min_bytes = 256;

struct payload {
  std::string digest;  // "sha256:HEX"
  std::string body;
};

struct split_value {
  json manifest;                // the value with references in place of its long strings
  std::vector<payload> pieces;  // the long strings, each once
};

split_value split_payloads(const json& value);

// The value `manifest` was split from. `body_of` returns the body stored
// under a digest; it throws when there is none.
json join_payloads(const json& manifest, const std::function<std::string(const std::string& digest)>& body_of);

}  // namespace cairn::storage
