// A raw-protocol agent that lies to the host about attempts and sends
// durations that overflow. input {"attack": ...}:
//   "timeout_loop"  begin seq 0 as attempt 1 of 1,000,000 with a 50 ms timeout, then hang
//   "retry_loop"    begin asking for a million attempts and fail, claiming attempt 1, as long as
//                   the host answers retry; done with "acked" once it acknowledges the failure
//   "sleep_max"     sleep 2^63-1 ms;  "sleep_until_far" sleep until 2^62 ms since the epoch
//   "wait_max"      wait for a signal with a 9.2e18 ms timeout
//   "begin_1e13"    begin a step with a 1e13 ms timeout
// A sandbox that finds a journaled step 0 sends done.
#include <unistd.h>

#include <cstdint>
#include <limits>

#include "tests/host/wire.hpp"

using namespace cairn::hostile;

int main() {
  // hello by hand: the protocol field is "v"
  send({{"t", "hello"}, {"v", 2}, {"sdk", "attempts-liar"}});
  json start = receive();
  if (start.at("history_steps") != 0) {
    send({{"t", "done"}, {"output", "replayed"}});
    return 0;
  }
  const std::string attack = start.at("input").value("attack", "");
  const json begin = {{"t", "begin"}, {"seq", 0}, {"name", "s"}, {"kind", "step"}, {"attempt", 1}};
  if (attack == "timeout_loop") {
    json b = begin;
    b["timeout_ms"] = 50;
    b["max_attempts"] = 1'000'000;
    send(b);
  } else if (attack == "retry_loop") {
    for (;;) {
      json b = begin;
      b["max_attempts"] = 1'000'000;
      b["initial_delay_ms"] = 0;
      send(b);
      send({{"t", "step"}, {"seq", 0}, {"name", "s"}, {"kind", "step"}, {"status", "error"}, {"attempt", 1},
            {"error", {{"message", "again"}, {"type", "error"}}}});
      const auto answer = receive().value("t", "");
      if (answer == "ack") break;
      if (answer != "retry") return 1;
    }
    send({{"t", "done"}, {"output", "acked"}});
    return 0;
  } else if (attack == "sleep_max") {
    send({{"t", "sleep"}, {"seq", 0}, {"duration_ms", std::numeric_limits<std::int64_t>::max()}});
  } else if (attack == "sleep_until_far") {
    send({{"t", "sleep"}, {"seq", 0}, {"until_ms", std::int64_t{1} << 62}});
  } else if (attack == "wait_max") {
    send({{"t", "wait"}, {"seq", 0}, {"signal", "go"}, {"timeout_ms", 9'200'000'000'000'000'000ll}});
  } else if (attack == "begin_1e13") {
    json b = begin;
    b["timeout_ms"] = 10'000'000'000'000ll;
    send(b);
  }
  for (;;) receive();
}
