// Test agent that breaks the protocol on purpose. The mode is the part of
// CAIRN_RUN_ID before the first '.', e.g. run id "dup_seq.1" -> mode dup_seq.
// foreign_join joins the run named by its input's "join".
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <thread>

#include "protocol/messages.hpp"

using namespace cairn::protocol;

namespace {

constexpr int fd = 3;

void put(const std::string& bytes) {
  std::size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + off, bytes.size() - off);
    if (n <= 0) std::_Exit(9);
    off += static_cast<std::size_t>(n);
  }
}
void send(const json& j) { put(encode_frame(j)); }

json receive() {
  frame_decoder decoder;
  char buf[4096];
  for (;;) {
    if (auto j = decoder.next()) return *j;
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) std::_Exit(8);
    decoder.feed(std::string_view(buf, static_cast<std::size_t>(n)));
  }
}

json step(std::uint64_t seq) {
  step_result r;
  r.seq = seq;
  r.name = "step " + std::to_string(seq);
  r.output = {{"seq", seq}};
  return to_json(agent_message{step_msg{r}});
}

// A begin of operation 0 of `kind`.
json begin(const char* name, step_kind kind) {
  begin_msg b;
  b.name = name;
  b.kind = kind;
  return to_json(agent_message{b});
}

json hello() { return {{"t", "hello"}, {"v", version}, {"sdk", "hostile"}}; }

// Returns the host's start message.
json handshake() {
  send(hello());
  return receive();
}

// A value `depth` arrays deep.
json nested(int depth) {
  json value = 0;
  for (int i = 0; i < depth; ++i) value = json::array({value});
  return value;
}

}  // namespace

int main() {
  const char* id = std::getenv("CAIRN_RUN_ID");
  std::string mode = id ? id : "";
  mode = mode.substr(0, mode.find('.'));

  if (mode == "garbage") put("\x01\x02garbage that is not a frame at all, with a bogus length");
  else if (mode == "huge_length") put(std::string("\x80\x00\x00\x00", 4) + "{}");
  else if (mode == "no_hello") send(step(0));
  else if (mode == "bad_version") { send({{"t", "hello"}, {"v", 99}, {"sdk", "future"}}); receive(); }
  else if (mode == "silent") std::this_thread::sleep_for(std::chrono::seconds(60));
  else {
    const json start = handshake();
    const std::uint64_t journaled = start["history_steps"];
    if (mode == "invalid_json") put(std::string("\x00\x00\x00\x09{not json", 13));
    else if (mode == "wrong_type") send({{"t", "step"}, {"seq", "zero"}, {"name", "x"}, {"kind", "step"},
                                         {"status", "ok"}, {"output", 1}, {"attempt", 1}});
    else if (mode == "unknown_type") send({{"t", "teleport"}});
    else if (mode == "dup_seq") { send(step(0)); receive(); send(step(0)); }
    else if (mode == "skip_seq") { send(step(0)); receive(); send(step(5)); }
    else if (mode == "after_done") { send(step(0)); receive(); send({{"t", "done"}, {"output", 1}}); send(step(1)); }
    else if (mode == "truncated") { put(std::string("\x00\x00\x01\x00{\"t\":", 9)); return 0; }
    else if (mode == "exit_midway") { send(step(journaled)); receive(); return 7; }
    else if (mode == "false_patch") {
      json marker = step(0);
      marker["kind"] = "patch";
      marker["output"] = false;  // a marker is true or absent
      send(marker);
    } else if (mode == "patch_begin") send(begin("fix", step_kind::patch));
    else if (mode == "forged_tool_step") {
      json forged = step(0);
      forged["kind"] = "tool";  // as if the host had brokered a tool call
      send(forged);
    } else if (mode == "forged_signal_begin") send(begin("deploy", step_kind::signal));
    else if (mode == "second_hello") send(hello());
    else if (mode == "deep_nesting") {
      json deep = step(0);
      deep["output"] = nested(129);
      send(deep);
    } else if (mode == "deep_output") {
      json deep = step(0);
      deep["output"] = nested(126);  // fits a frame, but not a replay's start frame
      send(deep);
    } else if (mode == "deep_done") {
      send(step(0));
      receive();
      send({{"t", "done"}, {"output", nested(126)}});
    } else if (mode == "foreign_join") {
      join_msg join;
      join.run_id = start["input"]["join"];
      send(to_json(agent_message{join}));
    }
  }
  // Hold the channel open until the host ends this sandbox.
  std::this_thread::sleep_for(std::chrono::seconds(60));
  return 0;
}
