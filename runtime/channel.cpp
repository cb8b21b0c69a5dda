#include "runtime/channel.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <algorithm>
#include <cerrno>
#include <limits>
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

[[noreturn]] void throw_errno(const char* what) {
  throw std::system_error(errno, std::generic_category(), what);
}

// Waits for `events` on `fd` or for `wake_fd` (unless -1) to be readable;
// whether the wake fd was and `fd` was not. The channel comes first: an agent
// that wrote its last frame and exited wakes both at once. A negative
// timeout waits forever.
bool wait_for_fd(int fd, short events, int timeout_ms, int wake_fd) {
  std::array<pollfd, 2> p{pollfd{fd, events, 0}, pollfd{wake_fd, POLLIN, 0}};
  int n = ::poll(p.data(), wake_fd >= 0 ? 2 : 1, timeout_ms);
  if (n < 0 && errno != EINTR) throw_errno("poll on the agent channel");
  return n > 0 && wake_fd >= 0 && p[1].revents != 0 && p[0].revents == 0;
}

int ms_until(std::chrono::steady_clock::time_point t) {
  auto left = std::chrono::ceil<std::chrono::milliseconds>(t - std::chrono::steady_clock::now());
  return static_cast<int>(std::clamp<std::int64_t>(left.count(), 0, std::numeric_limits<int>::max()));
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

void channel::send(const json& message, std::chrono::milliseconds timeout, const waiting_fn& waiting, int wake_fd) {
  // One limit for both directions: the agent enforces the same default.
  const std::string frame = frame_of(message);
  // One deadline for the whole frame, not renewed by progress.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  // When `waiting` wants to be called next; now: as soon as the peer stops reading.
  auto call_waiting = std::chrono::steady_clock::now();
  for (std::size_t sent = send_some(frame, 0); sent < frame.size(); sent = send_some(frame, sent)) {
    if (waiting && std::chrono::steady_clock::now() >= call_waiting) call_waiting = waiting();
    if (std::chrono::steady_clock::now() >= deadline)
      throw channel_closed("the agent did not read a frame of " + std::to_string(frame.size()) + " bytes within " +
                               std::to_string(timeout.count()) + " ms",
                           false);
    const auto until = waiting ? std::min(deadline, call_waiting) : deadline;
    // A wake-up is the caller's to look at, also when the peer read a little meanwhile.
    if (wait_for_fd(fd_, POLLOUT, ms_until(until), waiting ? wake_fd : -1)) call_waiting = {};
  }
}

std::optional<json> channel::receive(std::chrono::milliseconds timeout, int wake_fd) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout;
  if (++receives_ % 64 == 0) spin_ = spin_before_sleep;
  bool slept = false;
  for (;;) {
    if (auto message = try_receive()) {
      if (slept) spin_ /= 2;
      else if (spin_.count() > 0) spin_ = spin_before_sleep;
      return message;
    }
    auto now = std::chrono::steady_clock::now();
    if (!slept && now - start < spin_) continue;
    slept = true;
    auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now);
    if (left.count() <= 0) return std::nullopt;
    if (wait_for_fd(fd_, POLLIN, static_cast<int>(left.count()), wake_fd)) return std::nullopt;
  }
}

std::optional<json> channel::try_receive() {
  if (auto message = decoder_.next()) return message;
  std::array<char, read_chunk> buffer;
  for (;;) {
    ssize_t n = ::recv(fd_, buffer.data(), buffer.size(), 0);
    if (n > 0) {
      decoder_.feed(std::string_view(buffer.data(), static_cast<std::size_t>(n)));
      if (auto message = decoder_.next()) return message;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return std::nullopt;
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

bool channel::peer_closed() const {
  pollfd p{fd_, POLLRDHUP, 0};
  if (::poll(&p, 1, 0) < 0 && errno != EINTR) throw_errno("poll on the agent channel");
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

std::string channel::frame_of(const json& message) const {
  return protocol::encode_frame(message, decoder_.max_frame());
}

std::size_t channel::send_some(std::string_view frame, std::size_t offset) {
  while (offset < frame.size()) {
    ssize_t n = ::send(fd_, frame.data() + offset, frame.size() - offset, MSG_NOSIGNAL);
    if (n > 0) offset += static_cast<std::size_t>(n);
    else if (errno == EINTR) continue;
    else if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    else if (errno == EPIPE || errno == ECONNRESET) throw channel_closed("the agent closed its channel", false);
    else throw_errno("writing to the agent channel");
  }
  return offset;
}

}  // namespace cairn::runtime
