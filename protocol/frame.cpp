#include "protocol/frame.hpp"

#include <algorithm>

#include "protocol/bounded_json.hpp"


namespace cairn::protocol {
namespace {

std::uint32_t read_be32(const char* p) {
  auto b = reinterpret_cast<const unsigned char*>(p);
  return (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[2]} << 8) |
         std::uint32_t{b[3]};
}

}  // namespace

std::string encode_frame(const json& message, std::size_t max_frame) {
  if (!message.is_object()) throw protocol_error("a frame must carry a JSON object");
  // Invalid UTF-8 in a string is replaced rather than thrown on: an agent's
  // output may contain arbitrary bytes and must still reach the journal.
  std::string payload = message.dump(-1, ' ', false, json::error_handler_t::replace);
  if (payload.size() > max_frame)
    throw protocol_error("message of " + std::to_string(payload.size()) +
                         " bytes exceeds the frame limit of " + std::to_string(max_frame) + " bytes");
  std::string frame;
  frame.reserve(frame_header_size + payload.size());
  auto n = static_cast<std::uint32_t>(payload.size());
  frame.push_back(static_cast<char>(n >> 24));
  frame.push_back(static_cast<char>(n >> 16));
  frame.push_back(static_cast<char>(n >> 8));
  frame.push_back(static_cast<char>(n));
  frame += payload;
  return frame;
}

void frame_decoder::feed(std::string_view bytes) {
  if (consumed_ > 0 && consumed_ == buffer_.size()) {
    buffer_.clear();
    consumed_ = 0;
  }
  buffer_.append(bytes);
  check_header();
}

void frame_decoder::check_header() {
  if (buffered() < frame_header_size) return;
  std::uint32_t n = read_be32(buffer_.data() + consumed_);
  if (n == 0) throw protocol_error("frame with a zero length prefix");
  if (n > max_frame_)
    throw protocol_error("frame length prefix of " + std::to_string(n) +
                         " bytes exceeds the limit of " + std::to_string(max_frame_) + " bytes");
}

std::optional<json> frame_decoder::next() {
  if (buffered() < frame_header_size) return std::nullopt;
  check_header();
  std::uint32_t n = read_be32(buffer_.data() + consumed_);
  if (buffered() < frame_header_size + n) return std::nullopt;
  std::string_view payload(buffer_.data() + consumed_ + frame_header_size, n);
  consumed_ += frame_header_size + n;
  json message = parse_bounded(payload, "frame payload", {max_depth, max_frame_});
  if (!message.is_object()) throw protocol_error("frame payload is JSON but not an object");
  if (consumed_ == buffer_.size()) {
    buffer_.clear();
    consumed_ = 0;
  } else if (consumed_ > (1u << 20)) {
    buffer_.erase(0, consumed_);
    consumed_ = 0;
  }
  // A bad header after this frame is reported by the next call, so this
  // complete message (perhaps the agent's `fail`) is not lost.
  return message;
}

}  // namespace cairn::protocol
