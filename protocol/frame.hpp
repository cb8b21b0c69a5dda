// The frame codec shared by host and agent. Format (protocol/PROTOCOL.md §1):
// a 4-byte big-endian payload length, then that many bytes of one UTF-8 JSON
// object. A length of zero or above the receiver's limit is an error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace cairn::protocol {

using json = nlohmann::json;

inline constexpr std::size_t default_max_frame = 16u << 20;  // 16 MiB
inline constexpr std::size_t frame_header_size = 4;
// Deepest nesting of arrays/objects a receiver accepts (PROTOCOL.md §1).
inline constexpr std::size_t max_depth = 128;

// A peer broke the wire format or the message rules. The message names what
// was wrong, for the run's error and the user.
class protocol_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Serializes `message` (which must be a JSON object) into one frame.
// Throws protocol_error when the payload would exceed `max_frame`.
std::string encode_frame(const json& message, std::size_t max_frame = default_max_frame);

// Reassembles frames from a byte stream fed in arbitrary pieces.
class frame_decoder {
 public:
  explicit frame_decoder(std::size_t max_frame = default_max_frame) : max_frame_(max_frame) {}

  // Appends bytes. Throws protocol_error as soon as a header announces a
  // length of zero or above the limit, before buffering the payload.
  void feed(std::string_view bytes);

  // The next complete message, or nullopt when more bytes are needed.
  // Throws protocol_error for a payload that is not one valid JSON object or
  // nests deeper than max_depth.
  std::optional<json> next();

  // True when bytes of an unfinished frame are buffered (a truncated frame
  // if the stream has ended).
  bool has_partial() const { return buffered() > 0; }

  std::size_t max_frame() const { return max_frame_; }

 private:
  std::size_t buffered() const { return buffer_.size() - consumed_; }
  void check_header();

  std::size_t max_frame_;
  std::string buffer_;
  std::size_t consumed_ = 0;
};

}  // namespace cairn::protocol
