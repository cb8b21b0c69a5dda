// The host's end of an agent's channel: a connected stream socket carrying
// frames (protocol/frame.hpp). Owns the fd.
#pragma once

#include <chrono>
#include <functional>
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

  // How long a frame may take to go out in all, by default.
  static constexpr std::chrono::milliseconds send_timeout{30'000};

  // Writes one frame completely within `timeout` in all: a peer that reads
  // a little at a time gets no more. While the peer does not read, calls
  // `waiting` about every 100 ms; an exception from it leaves the frame half
  // sent and the channel unusable. Throws channel_closed if the peer is gone
  // or the time is up, protocol_error if the frame is too big.
  void send(const json& message, std::chrono::milliseconds timeout = send_timeout,
            const std::function<void()>& waiting = {});
  // The next message, or nullopt if none arrived within `timeout`.
  // Throws protocol::protocol_error for a malformed frame, channel_closed at EOF.
  std::optional<json> receive(std::chrono::milliseconds timeout);

  int fd() const { return fd_; }

 private:
  int fd_;
  protocol::frame_decoder decoder_;
  // How long receive() polls before it sleeps; see channel.cpp.
  std::chrono::microseconds spin_{100};
  int receives_ = 0;
};

}  // namespace cairn::runtime
