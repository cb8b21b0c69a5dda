#include "runtime/channel.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <algorithm>
#include <cerrno>
#include <string>
#include <system_error>

namespace cairn::runtime {
namespace {

constexpr std::size_t read_chunk = 64 * 1024;

// An agent's next message usually follows an ack within microseconds. Polling
// the socket that long before sleeping in poll() saves two scheduler wake-ups
// per step (measured: a NORMAL-mode step went from ~110 us to ~70 us). With
// many live runs on few cores the next message comes later and the polling
// only takes the CPU the agents need: each poll that ends empty-handed halves
// the channel's next one, down to none; every 64th receive tries the full
// length again.
constexpr auto spin_before_sleep = std::chrono::microseconds(100);

// How often send() hands control back to its caller while the peer does not read.
constexpr auto send_slice = std::chrono::milliseconds(100);

[[noreturn]] void throw_errno(const char* what) {
  throw std::system_error(errno, std::generic_category(), what);
}

// Waits for `events` on `fd`; false on timeout. A negative timeout waits forever.
bool wait_for_fd(int fd, short events, int timeout_ms) {
  pollfd p{fd, events, 0};
  int n = ::poll(&p, 1, timeout_ms);
  if (n < 0 && errno != EINTR) throw_errno("poll on the agent channel");
  return n > 0;
}

}  // namespace

channel::channel(int fd, std::size_t max_frame) : fd_(fd), decoder_(max_frame) {
  // Non-blocking so that a read after poll never stalls on a spurious wake-up.
  int flags = ::fcntl(fd_, F_GETFL);
  if (flags >= 0) ::fcntl(fd_, F_SETFL, flags | O_NONBLOCK);
}

channel::~channel() {
  if (fd_ >= 0) ::close(fd_);
}

void channel::send(const json& message, std::chrono::milliseconds timeout, const std::function<void()>& waiting) {
  // One limit for both directions: the agent enforces the same default.
  std::string frame = protocol::encode_frame(message, decoder_.max_frame());
  // One deadline for the whole frame, not renewed by progress.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto last_waiting = std::chrono::steady_clock::now();
  std::size_t sent = 0;
  while (sent < frame.size()) {
    ssize_t n = ::send(fd_, frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0)
        throw channel_closed("the agent did not read a frame of " + std::to_string(frame.size()) + " bytes within " +
                                 std::to_string(timeout.count()) + " ms",
                             false);
      wait_for_fd(fd_, POLLOUT, static_cast<int>(std::min(left, send_slice).count()));
      // Also when the peer read a little: a trickle of reads must not starve the caller.
      if (waiting && std::chrono::steady_clock::now() - last_waiting >= send_slice) {
        waiting();
        last_waiting = std::chrono::steady_clock::now();
      }
    } else if (errno == EPIPE || errno == ECONNRESET) {
      throw channel_closed("the agent closed its channel", false);
    } else {
      throw_errno("writing to the agent channel");
    }
  }
}

std::optional<json> channel::receive(std::chrono::milliseconds timeout) {
  if (auto message = decoder_.next()) return message;
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout;
  std::array<char, read_chunk> buffer;
  if (++receives_ % 64 == 0) spin_ = spin_before_sleep;
  bool slept = false;
  for (;;) {
    ssize_t n = ::recv(fd_, buffer.data(), buffer.size(), 0);  // the fd is non-blocking
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      auto now = std::chrono::steady_clock::now();
      if (!slept && now - start < spin_) continue;
      slept = true;
      auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now);
      if (left.count() <= 0) return std::nullopt;
      wait_for_fd(fd_, POLLIN, static_cast<int>(left.count()));
      continue;
    }
    if (n > 0) {
      decoder_.feed(std::string_view(buffer.data(), static_cast<std::size_t>(n)));
      if (auto message = decoder_.next()) {
        if (slept) spin_ /= 2;
        else if (spin_.count() > 0) spin_ = spin_before_sleep;
        return message;
      }
    } else if (n == 0 || errno == ECONNRESET) {
      bool truncated = decoder_.has_partial();
      throw channel_closed(truncated ? "the agent closed its channel in the middle of a frame"
                                     : "the agent closed its channel",
                           truncated);
    } else if (errno != EINTR) {
      throw_errno("reading the agent channel");
    }
  }
}

}  // namespace cairn::runtime
