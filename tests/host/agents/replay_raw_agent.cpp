// A raw-protocol agent for attacks on the replay. input {"attack": ...}:
//   "out_of_order"  asks for history from seq 1 before seq 0
//   "past_end"      asks for history from seq history_steps
//   "twice"         asks for history from seq 0, then again from seq 0
// A first sandbox (no history) journals three steps, then exits, so that the
// next one has a history to ask for.
#include <cstdint>
#include <string>

#include "tests/host/wire.hpp"

using namespace cairn::hostile;

int main() {
  const json start = handshake();
  const std::string attack = start.at("input").value("attack", "");
  const std::uint64_t journaled = start.at("history_steps");
  if (journaled == 0) {
    for (int seq = 0; seq < 3; ++seq) {
      send({{"t", "step"}, {"seq", seq}, {"name", "s"}, {"kind", "step"}, {"status", "ok"}, {"output", seq},
            {"attempt", 1}});
      if (receive().value("t", "") != "ack") return 1;
    }
    return 7;  // a crash: the next sandbox replays
  }
  if (attack == "out_of_order") send({{"t", "history"}, {"from", 1}});
  else if (attack == "past_end") send({{"t", "history"}, {"from", journaled}});
  else if (attack == "twice") {
    send({{"t", "history"}, {"from", 0}});
    if (receive().value("t", "") != "history") return 1;
    send({{"t", "history"}, {"from", 0}});
  }
  for (;;) receive();
}
