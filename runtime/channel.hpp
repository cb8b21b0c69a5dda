// The host's end of an agent's channel: a connected stream socket carrying
// frames (protocol/frame.hpp). Owns the fd.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

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

  // What send() calls while the peer does not read; returns when it wants
  // to be called again (if nothing wakes it sooner).
  using waiting_fn = std::function<std::chrono::steady_clock::time_point()>;

  // Writes one frame completely within `timeout` in all: a peer that reads
  // a little at a time gets no more. While the peer does not read, calls
  // `waiting` at once, then whenever `wake_fd` (unless -1; it is not read)
  // is readable or the time it returned has come; an exception from it
  // leaves the frame half sent and the channel unusable. Throws
  // channel_closed if the peer is gone or the time is up, protocol_error if
  // the frame is too big.
  void send(const json& message, std::chrono::milliseconds timeout = send_timeout, const waiting_fn& waiting = {},
            int wake_fd = -1);
  // The next message, or nullopt if none arrived within `timeout` or
  // `wake_fd` (unless -1; it is not read) was readable first.
  // Throws protocol::protocol_error for a malformed frame, channel_closed at EOF.
  std::optional<json> receive(std::chrono::milliseconds timeout, int wake_fd = -1);

  // The same without blocking, for an event loop that waits on fd() itself.
  // The next message if one is complete in what can be read now; nullopt
  // when more bytes must come first. Throws as receive() does.
  std::optional<json> try_receive();
  // `message` as one frame (protocol_error when it is too big).
  std::string frame_of(const json& message) const;
  // Writes what the socket takes now of `frame` from `offset`; returns the
  // new offset. Throws channel_closed when the peer is gone.
  std::size_t send_some(std::string_view frame, std::size_t offset);
  // Whether the peer has shut its end (also with unread bytes before that).
  bool peer_closed() const;

  int fd() const { return fd_; }

 private:
  int fd_;
  protocol::frame_decoder decoder_;
  // How long receive() polls before it sleeps; see channel.cpp.
  std::chrono::microseconds spin_{100};
  int receives_ = 0;
};

}  // namespace cairn::runtime
