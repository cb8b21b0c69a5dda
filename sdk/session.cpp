#include "session.hpp"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <unistd.h>
#include <sys/socket.h>

namespace cairn {
namespace {

constexpr std::string_view sdk_name = "cairn-cpp/0.1";

void write_all(int fd, const std::string& bytes) {
  std::size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = ::send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == ENOTSOCK) n = ::write(fd, bytes.data() + off, bytes.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw host_gone(std::string("lost the channel to the host: ") + std::strerror(errno));
    }
    off += static_cast<std::size_t>(n);
  }
}

}  // namespace

session::session(int fd) : fd_(fd) {
  send(protocol::hello_msg{protocol::version, std::string(sdk_name)});
  auto reply = receive();
  if (auto* r = std::get_if<protocol::reject_msg>(&reply)) throw host_gone("the host rejected this agent: " + r->error);
  auto* s = std::get_if<protocol::start_msg>(&reply);
  if (!s) throw host_gone("the host did not answer hello with start");
  start_ = std::move(*s);
}

session::~session() { ::close(fd_); }

void session::close_channel() { ::shutdown(fd_, SHUT_WR); }

void session::send(const protocol::agent_message& m) {
  write_all(fd_, protocol::encode_frame(protocol::to_json(m), decoder_.max_frame()));
}

protocol::host_message session::receive() {
  // The host's ack follows its commit, typically 20 us (synchronous=NORMAL)
  // to 1 ms (FULL) later. Polling that long before blocking avoids a
  // scheduler wake-up, which on a VM with idle cores costs hundreds of us.
  constexpr auto spin = std::chrono::milliseconds(1);
  char buf[65536];
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    if (auto j = decoder_.next()) return protocol::parse_host_message(*j);
    ssize_t n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (std::chrono::steady_clock::now() - start < spin) continue;
      n = ::read(fd_, buf, sizeof buf);
    } else if (n < 0 && errno == ENOTSOCK) {
      n = ::read(fd_, buf, sizeof buf);
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw host_gone(std::string("lost the channel to the host: ") + std::strerror(errno));
    if (n == 0) throw host_gone("the host closed the channel");
    decoder_.feed(std::string_view(buf, static_cast<std::size_t>(n)));
  }
}

void session::send_and_wait_ack(const protocol::agent_message& m, std::uint64_t seq) {
  send(m);
  auto reply = receive();
  auto* ack = std::get_if<protocol::ack_msg>(&reply);
  if (!ack || ack->seq != seq)
    throw host_gone("expected the host's ack for step " + std::to_string(seq));
}

protocol::step_result session::call_tool(const protocol::tool_msg& m) {
  send(m);
  auto reply = receive();
  auto* result = std::get_if<protocol::result_msg>(&reply);
  if (!result || result->result.seq != m.seq)
    throw host_gone("expected the host's result for tool call " + std::to_string(m.seq));
  return std::move(result->result);
}

std::optional<protocol::step_result> session::replay_next(std::string_view name,
                                                         protocol::step_kind kind) {
  if (nondeterminism_) throw nondeterminism{*nondeterminism_};
  if (next_seq_ >= start_.history.size()) return std::nullopt;
  const auto& r = start_.history[next_seq_];
  if (r.name != name || r.kind != kind) {
    nondeterminism_ = "non-determinism at step " + std::to_string(next_seq_) + ": the journal has " +
                      std::string(protocol::to_string(r.kind)) + " '" + r.name + "' but the code now asks for " +
                      std::string(protocol::to_string(kind)) + " '" + std::string(name) +
                      "'; the agent's code changed or branches on something not journaled";
    throw nondeterminism{*nondeterminism_};
  }
  ++next_seq_;
  return r;
}

}  // namespace cairn
