#include "session.hpp"

#include "protocol/version.hpp"

#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

namespace cairn {
namespace {

// "cairn-cpp/VERSION": the SDK is built with the host, as one version.
std::string sdk_name() { return "cairn-cpp/" + std::string(protocol::cairn_version()); }

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
  send(protocol::hello_msg{protocol::version, sdk_name()});
  auto reply = receive(false);
  if (auto* r = std::get_if<protocol::reject_msg>(&reply)) throw host_gone("the host rejected this agent: " + r->error);
  auto* s = std::get_if<protocol::start_msg>(&reply);
  if (!s) throw host_gone("the host did not answer hello with start");
  if (s->version != protocol::version)
    throw host_gone("the host speaks protocol v" + std::to_string(s->version) + "; this agent speaks v" +
                    std::to_string(protocol::version));
  start_ = std::move(*s);
}

session::~session() { ::close(fd_); }

void session::close_channel() { ::shutdown(fd_, SHUT_WR); }

void session::send(const protocol::agent_message& m) {
  write_all(fd_, protocol::encode_frame(protocol::to_json(m), decoder_.max_frame()));
}

protocol::host_message session::receive(bool stop_on_cancel) {
  // The host's ack follows its commit, typically 20 us (synchronous=NORMAL)
  // to 1 ms (FULL) later. Polling that long before blocking avoids a
  // scheduler wake-up, which on a VM with idle cores costs hundreds of us.
  // But where many agents share the cores, answers come later than that and
  // the polling only takes the CPU the host and the others need: each poll
  // that ends empty-handed halves the next one, down to none. Now and then
  // a receive tries the full length again, in case the machine got quiet:
  // after 64 receives, and after twice as many each time that try fails
  // (up to 4,096: 64 agents stepping on 2 busy cores spent a tenth of their
  // CPU in failed tries when they came every 64 receives). A host whose last
  // ack said it executes no other attempt (ack.alone) has no other run's
  // agent to take the CPU from: then every receive polls the full length.
  // Halving there, a PostgreSQL journal's commits (0.2-0.5 ms, now and then
  // over 1 ms) soon brought the polling down to none, and every ack to a
  // wake-up.
  constexpr std::chrono::microseconds full_spin{1000};
  constexpr int first_probe = 64, last_probe = 4096;
  // On one CPU polling only delays the answer it waits for.
  static const bool may_poll = [] {
    cpu_set_t cpus;
    return ::sched_getaffinity(0, sizeof cpus, &cpus) != 0 || CPU_COUNT(&cpus) > 1;
  }();
  const bool probing = !host_alone_ && --until_probe_ <= 0;
  if (probing) until_probe_ = probe_every_;
  if (probing || host_alone_) spin_ = full_spin;
  if (!may_poll) spin_ = std::chrono::microseconds(0);
  const auto start = std::chrono::steady_clock::now();
  bool waited = false;
  for (;;) {
    if (auto m = next_buffered()) {
      if (waited) {
        spin_ /= 2;
        if (probing) until_probe_ = probe_every_ = std::min(probe_every_ * 2, last_probe);
      } else if (spin_ > std::chrono::microseconds(0)) {
        spin_ = full_spin;
        probe_every_ = first_probe;
      }
      return std::move(*m);
    }
    if (stop_on_cancel && cancel_reason_) throw cancelled_error(*cancel_reason_);
    const bool spinning = !waited && std::chrono::steady_clock::now() - start < spin_;
    waited = !spinning;
    // Polling past 100 us, it gives way to whatever else waits for its core:
    // the host and the journal's server may. Polling on the host's core
    // without giving way, a step took the whole 1 ms and more (one
    // invocation of `scale_out` in 12, and always with the host and the
    // agent on one core); giving way from the start took most of what the
    // polling gains (each sched_yield a system call).
    if (spinning && !read_channel(std::chrono::milliseconds(0)) &&
        std::chrono::steady_clock::now() - start > std::chrono::microseconds(100))
      ::sched_yield();
    else if (!spinning)
      read_channel(std::nullopt);
  }
}

std::optional<protocol::host_message> session::next_buffered() {
  while (auto j = decoder_.next()) {
    auto m = protocol::parse_host_message(*j);
    auto* cancel = std::get_if<protocol::cancel_msg>(&m);
    if (!cancel) return m;
    if (!cancel_reason_) cancel_reason_ = std::move(cancel->reason);
  }
  return std::nullopt;
}

bool session::read_channel(std::optional<std::chrono::milliseconds> wait) {
  char buf[65536];
  ssize_t n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
  // Not a socket (a test's pipe): poll(2) stands in for MSG_DONTWAIT.
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOTSOCK)) {
    if (wait) {
      if (*wait <= std::chrono::milliseconds(0) && errno != ENOTSOCK) return false;
      pollfd p{fd_, POLLIN, 0};
      auto ms = static_cast<int>(std::clamp<std::int64_t>(wait->count(), 0, INT_MAX));
      if (::poll(&p, 1, ms) <= 0) return false;  // timed out, or EINTR: the caller decides
    }
    n = ::read(fd_, buf, sizeof buf);
  }
  if (n < 0 && errno == EINTR) return false;
  if (n < 0) throw host_gone(std::string("lost the channel to the host: ") + std::strerror(errno));
  if (n == 0) throw host_gone("the host closed the channel");
  decoder_.feed(std::string_view(buf, static_cast<std::size_t>(n)));
  return true;
}

void session::poll() {
  read_channel(std::chrono::milliseconds(0));
  // Frames that came with an earlier answer are examined here too.
  if (next_buffered()) throw host_gone("the host sent a message the agent did not ask for");
}

void session::throw_if_cancelled() {
  poll();
  if (cancel_reason_) throw cancelled_error(*cancel_reason_);
}

void session::pause(std::chrono::milliseconds d) {
  const auto deadline = std::chrono::steady_clock::now() + d;
  for (;;) {
    if (next_buffered()) throw host_gone("the host sent a message the agent did not ask for");
    auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (cancel_reason_ || left <= std::chrono::milliseconds(0)) return;
    read_channel(left);
  }
}

std::optional<protocol::retry_msg> session::report(const protocol::step_msg& m) {
  const auto seq = m.result.seq;
  send(m);
  auto reply = receive(false);
  if (auto* ack = std::get_if<protocol::ack_msg>(&reply); ack && ack->seq == seq) {
    host_alone_ = ack->alone;
    return std::nullopt;
  }
  if (auto* retry = std::get_if<protocol::retry_msg>(&reply); retry && retry->seq == seq && !m.result.ok)
    return *retry;
  throw host_gone("expected the host's ack or retry for step " + std::to_string(seq));
}

void session::pull_history() {
  send(protocol::history_msg{next_seq_});
  auto reply = receive(false);
  auto* chunk = std::get_if<protocol::history_chunk>(&reply);
  if (!chunk || chunk->from != next_seq_ || chunk->steps.size() > start_.history_steps - next_seq_)
    throw host_gone("expected the host's history from step " + std::to_string(next_seq_));
  chunk_ = std::move(*chunk);
}

protocol::step_result session::request(const protocol::agent_message& m, std::uint64_t seq) {
  send(m);
  auto reply = receive(!std::holds_alternative<protocol::tool_msg>(m));
  auto* result = std::get_if<protocol::result_msg>(&reply);
  if (!result || result->result.seq != seq)
    throw host_gone("expected the host's result for " + std::string(protocol::type_name(m)) + " " +
                    std::to_string(seq));
  return std::move(result->result);
}

protocol::step_result& session::next_recorded() {
  if (next_seq_ - chunk_.from >= chunk_.steps.size()) pull_history();
  return chunk_.steps[next_seq_ - chunk_.from];
}

std::optional<bool> session::replay_patch(std::string_view id) {
  if (nondeterminism_) throw nondeterminism{*nondeterminism_};
  if (!replaying()) return std::nullopt;
  const auto& r = next_recorded();
  if (r.kind != protocol::step_kind::patch || r.name != id) return false;
  ++next_seq_;
  if (!replaying()) chunk_ = {};
  return true;
}

std::optional<protocol::step_result> session::replay_next(std::string_view name,
                                                         protocol::step_kind kind) {
  if (nondeterminism_) throw nondeterminism{*nondeterminism_};
  if (next_seq_ >= start_.history_steps) return std::nullopt;
  auto& r = next_recorded();
  if (r.name != name || r.kind != kind) {
    nondeterminism_ = "non-determinism at step " + std::to_string(next_seq_) + ": the journal has " +
                      std::string(protocol::to_string(r.kind)) + " '" + r.name + "' but the code now asks for " +
                      std::string(protocol::to_string(kind)) + " '" + std::string(name) +
                      "'; the agent's code changed or branches on something not journaled";
    throw nondeterminism{*nondeterminism_};
  }
  auto replayed = std::move(r);
  ++next_seq_;
  if (!replaying()) chunk_ = {};  // replay is over: hold no history while the run goes on
  return replayed;
}

}  // namespace cairn
