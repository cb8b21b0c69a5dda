// Text as the host quotes it in messages, logs and tables: UTF-8 read one
// sequence at a time, and cut to a size without breaking it. Every layer
// quotes text (an agent's step names, a tool's stderr, a server's answer),
// so this lives in the lowest.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

namespace cairn::protocol {

// The code point of the UTF-8 sequence at text[i] and its length, or length 0
// when it is not valid UTF-8 (overlong, surrogate, out of range, cut short).
std::pair<char32_t, std::size_t> decode_utf8(std::string_view text, std::size_t i);

// Whether all of `text` is valid UTF-8 (exactly what nlohmann::json accepts
// when it serializes a string strictly).
bool is_utf8(std::string_view text);

// `text` when it fits in `max_bytes`, else its start followed by "...", the
// whole at most `max_bytes` bytes (max_bytes >= 3). The result is valid UTF-8
// whatever `text` holds: a cut falls between sequences, and a byte that is not
// UTF-8 becomes U+FFFD.
std::string clip(std::string_view text, std::size_t max_bytes);

// As clip, keeping the end: "..." followed by the end of `text`. For output
// whose last lines say what went wrong (a program's stderr).
std::string clip_tail(std::string_view text, std::size_t max_bytes);

}  // namespace cairn::protocol
