// The host's end of an agent's channel: a connected stream socket carrying
// frames (protocol/frame.hpp). Owns the fd.
#pragma once

#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>

#include "protocol/frame.hpp"

namespace cairn::runtime {

using json = nlohmann::json;

// The peer closed the channel. `truncated` is true when it closed in the
// middle of a frame.
class channel_closed : public std::runtime_error {
 public:
  channel_closed(const std::string& message, bool truncated)
      : std::runtime_error(message), truncated_(truncated) {}
  bool truncated() const { return truncated_; }

 private:
  bool truncated_;
};

class channel {
 public:
  // Takes ownership of `fd` and makes it non-blocking. `max_frame` limits
  // frames in both directions.
  explicit channel(int fd, std::size_t max_frame = protocol::default_max_frame);
  ~channel();
  channel(const channel&) = delete;
  channel& operator=(const channel&) = delete;

  // Writes one frame completely; blocks while the peer does not read.
  // Throws channel_closed if the peer is gone, protocol_error if too big.
  void send(const json& message);
  // The next message, or nullopt if none arrived within `timeout`.
  // Throws protocol::protocol_error for a malformed frame, channel_closed at EOF.
  std::optional<json> receive(std::chrono::milliseconds timeout);

  int fd() const { return fd_; }

 private:
  int fd_;
  protocol::frame_decoder decoder_;
};

}  // namespace cairn::runtime
