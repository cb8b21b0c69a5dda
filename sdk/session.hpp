// The agent's side of one run: the channel on fd 3, the position in the
// history, and the chunk of it being replayed (pulled from the host as replay
// reaches its end, so memory stays bounded whatever the history's size).
// Private to the SDK.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "cairn/cairn.hpp"
#include "protocol/messages.hpp"

namespace cairn {

// The code asked for a different step than the journal holds at this position.
// Deliberately not a std::exception: a workflow's catch (std::exception&) must
// not swallow it.
struct nondeterminism {
  std::string message;
};

// The host went away or broke the protocol; the agent can only stop.
class host_gone : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class session {
 public:
  // Takes ownership of fd. Blocks for the handshake; throws host_gone if the
  // host rejects it or the channel breaks.
  explicit session(int fd);
  ~session();
  session(const session&) = delete;
  session& operator=(const session&) = delete;

  const protocol::start_msg& start() const { return start_; }

  // The journaled result at the next position, or nullopt when past the
  // history. Checks name and kind; a mismatch throws nondeterminism (and is
  // remembered, so a workflow that catches it still fails).
  std::optional<protocol::step_result> replay_next(std::string_view name, protocol::step_kind kind);
  bool replaying() const { return next_seq_ < start_.history_steps; }
  // While replaying: whether the next position holds patch marker `id`,
  // which is then consumed (PROTOCOL.md §4.1); any other record stays for
  // the next operation. nullopt when past the history.
  std::optional<bool> replay_patch(std::string_view id);

  // Live steps: the seq and first attempt number for a new step.
  std::uint64_t take_seq() { return next_seq_++; }
  int first_attempt_for(std::uint64_t seq) const {
    return seq == start_.history_steps ? start_.next_step_attempt : 1;
  }

  void send(const protocol::agent_message& m);
  // After done/fail: tells the host at once that nothing more will come,
  // instead of when the process and its sandbox have exited.
  void close_channel();
  // Sends an attempt's outcome and blocks for the host's answer: nullopt
  // when it acknowledged the step (it is then durable), else the retry the
  // host decided on.
  std::optional<protocol::retry_msg> report(const protocol::step_msg& m);
  // Sends a tool, sleep, wait, child or join request and blocks until the
  // host's journaled result for `seq`. After cancelling, the host still
  // answers a tool call but none of the others: waiting for one of those
  // throws cancelled_error when the cancel arrives.
  protocol::step_result request(const protocol::agent_message& m, std::uint64_t seq);

  // The host may send cancel at any time; every read of the channel records it.
  const std::optional<std::string>& cancel_reason() const { return cancel_reason_; }
  // Reads what has arrived, without blocking, so that a cancel sent while the
  // workflow computed is seen.
  void poll();
  // poll(), then throws cancelled_error if the host has cancelled the run.
  void throw_if_cancelled();
  // Sleeps for `d`, or until the host cancels the run.
  void pause(std::chrono::milliseconds d);

  const std::optional<std::string>& nondeterminism_error() const { return nondeterminism_; }
  bool in_step = false;

 private:
  // The next host message other than cancel. With `stop_on_cancel`, throws
  // cancelled_error instead of blocking once the host has cancelled.
  protocol::host_message receive(bool stop_on_cancel);
  // Decodes buffered frames up to the first one that is not cancel.
  std::optional<protocol::host_message> next_buffered();
  // One read into the decoder, waiting at most `wait` (nullopt: no limit).
  // False when nothing arrived. Throws host_gone when the channel is closed.
  bool read_channel(std::optional<std::chrono::milliseconds> wait);
  // Replaces chunk_ with the host's steps from next_seq_ on.
  void pull_history();
  // The history's record at next_seq_ (pulled when the chunk ends before
  // it); only while replaying.
  protocol::step_result& next_recorded();

  int fd_;
  protocol::frame_decoder decoder_;
  // How long receive() polls before it blocks, and in how many receives it
  // polls the full length again; see receive().
  std::chrono::microseconds spin_{1000};
  int probe_every_ = 64;
  int until_probe_ = 64;
  // Whether the host's last ack said it executes no other attempt: then
  // receive() polls the full length every time.
  bool host_alone_ = false;
  protocol::start_msg start_;
  protocol::history_chunk chunk_;
  std::uint64_t next_seq_ = 0;
  std::optional<std::string> nondeterminism_;
  std::optional<std::string> cancel_reason_;
};

}  // namespace cairn
