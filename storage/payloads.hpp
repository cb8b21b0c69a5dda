// Payloads stored by content. A model request carries the whole conversation
// so far, and a tool's output comes back in every later request; journaled as
// they are, a run of N model calls would store the conversation N times.
// Instead the long parts of a journaled value are stored once per run in the
// payloads table, under a digest, and the value (its manifest) keeps a
// reference in their place: the journal grows with what is new.
//
// In a manifest:
// - a string of at least payload_min_bytes is a reference "\0KEY", KEY being
//   "sha256:HEX" (the body is the string's bytes) or "zstd:HEX" (the body is
//   a zstd frame of them, with its size in the frame's header; used only
//   when it is shorter). HEX is the SHA-256 of the string either way, so a
//   string has one key however many values, steps or events name it.
// - an array whose items take at least payload_min_bytes is
//   ["\0list", HEAD, ITEM...]: HEAD references the last of a chain of chunks,
//   ITEMs are what follows it. A chunk's body is the JSON array
//   [PREVIOUS_CHUNK_REFERENCE or null, ITEM...]. Chunks close where their
//   items reach chunk_min_bytes, so the chunks of a list are those of any
//   list it begins: a conversation that grows by a message stores only the
//   chunk it closes, and each request holds one reference and a short tail.
// - any other string that starts with "\0" is kept with one more "\0" in
//   front, so no value the agent sends can pose as a reference or a list.
//
// Decoding reads at most decode_max_bytes of bodies and nests at most
// protocol::max_depth lists deep, whatever the journal holds: a damaged or
// forged chain (a cycle, a list inside itself) is storage_error(corrupt),
// never unbounded work.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace cairn::storage {

using json = nlohmann::json;

// Strings (and arrays whose items take) at least this many bytes are stored by content.
inline constexpr std::size_t payload_min_bytes = 256;
// A chunk of a stored array closes once its items take this many bytes.
inline constexpr std::size_t chunk_min_bytes = 512;
// The most bytes of bodies, decompressed, that decoding one value reads: four
// times the largest frame an agent may send by default.
inline constexpr std::uint64_t decode_max_bytes = std::uint64_t{64} << 20;

struct payload {
  std::string digest;  // the key: "sha256:HEX" or "zstd:HEX"
  std::string body;
};

struct split_value {
  json manifest;                // the value with references in place of its long parts
  std::vector<payload> pieces;  // the bodies it references, each once
};

split_value split_payloads(const json& value);

// The body stored under a key, nullopt when the journal holds none.
using payload_lookup = std::function<std::optional<std::string>(const std::string& digest)>;

// The value `manifest` was split from. A missing body, a malformed
// reference or chunk, or decoding past its bounds is storage_error(corrupt),
// its message beginning with `what` (which value). `bytes`, when given, has
// the bodies read added, decompressed.
json join_payloads(const json& manifest, const payload_lookup& body_of, const std::string& what,
                   std::uint64_t* bytes = nullptr);

// A step's output as the steps table keeps it: its JSON text when it names
// no payload (as every cairn wrote it), else "~" and its manifest's text
// ("~" begins no JSON text, so the two never meet).
struct stored_output {
  std::string text;
  std::vector<payload> pieces;
};
stored_output encode_output(const json& output);
// Whether `text` (a steps.output column) is a manifest, and the JSON text to
// parse: the manifest's, or the output's itself.
bool is_output_manifest(const std::string& text);
std::string_view output_json(const std::string& text);

}  // namespace cairn::storage
