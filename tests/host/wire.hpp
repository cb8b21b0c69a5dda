// The raw protocol for hostile agents: frames on fd 3 (PROTOCOL.md §1),
// nothing of the SDK's checks, so an agent can send what the SDK never would.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "protocol/frame.hpp"

namespace cairn::hostile {

using json = nlohmann::json;

inline int channel_fd() {
  const char* fd = std::getenv("CAIRN_CHANNEL_FD");
  return fd ? std::atoi(fd) : 3;
}

inline void send_bytes(const std::string& bytes) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(channel_fd(), bytes.data() + done, bytes.size() - done);
    if (n <= 0) std::_Exit(90);
    done += static_cast<std::size_t>(n);
  }
}

inline void send(const json& message) { send_bytes(protocol::encode_frame(message)); }

// The next frame from the host; exits 91 when the channel closes.
inline json receive() {
  static protocol::frame_decoder decoder(64u << 20);
  for (;;) {
    if (auto message = decoder.next()) return *message;
    char buf[65536];
    ssize_t n = ::read(channel_fd(), buf, sizeof buf);
    if (n <= 0) std::_Exit(91);
    decoder.feed(std::string_view(buf, static_cast<std::size_t>(n)));
  }
}

// hello, then the start message (whose "input" chooses the attack).
inline json handshake(int version = 2) {
  send({{"t", "hello"}, {"v", version}, {"sdk", "hostile"}});
  return receive();
}

}  // namespace cairn::hostile
