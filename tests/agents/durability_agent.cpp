// Test agent for the durability proofs (tests/engine/power_loss_test.cpp,
// ack_order_test.cpp): a workflow of every journaled kind, behind an observer
// that records everything the host wrote to the agent.
//
// The observer. Before the workflow starts, the agent forks a relay that
// keeps the host's end of the channel and hands the agent a fresh socketpair
// in its place. The relay copies bytes both ways and first appends them to
// observed.PID.in (host -> agent) and observed.PID.out (agent -> host) in the
// cwd (the run's workspace, outside the journal's reach). The host spawns
// agents with PR_SET_PDEATHSIG, so its death kills the agent; but a fork
// clears that setting, and the relay leaves the agent's process group, so it
// survives the host: the socket keeps what the host wrote before it died, the
// relay reads it to the end (EOF when the host's end is closed), logs it, and
// writes observed.PID.closed. Once that file exists, the .in log holds every
// acknowledgement and result the host ever sent to this agent.
//
// The agent exits only after the relay has passed on everything the agent
// wrote: the host takes an agent that ended before its `done` arrived for a
// crash (PROTOCOL.md 2.3), and a relay that runs late (a loaded machine)
// would otherwise deliver `done` after the agent's exit.
//
// input: {"steps": N, "tool": bool, "sleep_ms": T, "signal": NAME, "child": bool}
// output: {"outputs": [every step's output, in order]}
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <string>

#include <cairn/cairn.hpp>

using cairn::json;

namespace {

bool append(int log, const char* data, ssize_t n) {
  for (ssize_t off = 0; off < n;) {
    ssize_t w = ::write(log, data + off, static_cast<std::size_t>(n - off));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return false;
    off += w;
  }
  return true;
}

// Copies `from` to `to` (best effort: the peer may be gone) after logging it.
// False at EOF or error on `from`.
bool pump(int from, int to, int log) {
  char buf[65536];
  ssize_t n = ::read(from, buf, sizeof buf);
  if (n < 0 && errno == EINTR) return true;
  if (n <= 0) return false;
  if (!append(log, buf, n)) std::_Exit(4);
  for (ssize_t off = 0; off < n;) {
    ssize_t w = ::send(to, buf + off, static_cast<std::size_t>(n - off), MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) break;
    off += w;
  }
  return true;
}

// `forwarded` is closed once the agent's side has ended and all it wrote is
// with the host.
[[noreturn]] void relay(int host, int agent, int forwarded) {
  ::setpgid(0, 0);
  const std::string base = "observed." + std::to_string(::getpid());
  std::ofstream(base + ".in");  // exists from the start: the test waits for its .closed
  int in = ::open((base + ".in").c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  int out = ::open((base + ".out").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (in < 0 || out < 0) std::_Exit(4);
  bool agent_open = true;
  for (;;) {
    pollfd fds[2] = {{host, POLLIN, 0}, {agent, static_cast<short>(agent_open ? POLLIN : 0), 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      std::_Exit(4);
    }
    if (fds[0].revents && !pump(host, agent, in)) break;
    if (agent_open && fds[1].revents && !pump(agent, host, out)) {
      agent_open = false;
      ::shutdown(host, SHUT_WR);  // the host sees the agent close its channel
      ::close(forwarded);
    }
  }
  ::close(in);
  ::close(out);
  std::ofstream(base + ".closed");
  std::_Exit(0);
}

// Returns the read end of the relay's `forwarded` pipe: EOF there means the
// relay has passed on all the agent wrote.
int start_observer() {
  const char* env = std::getenv("CAIRN_CHANNEL_FD");
  const int channel = env ? std::atoi(env) : 3;
  int pair[2], forwarded[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, pair) < 0 || ::pipe2(forwarded, O_CLOEXEC) < 0) std::_Exit(4);
  pid_t pid = ::fork();
  if (pid < 0) std::_Exit(4);
  if (pid == 0) {
    ::close(pair[0]);
    ::close(forwarded[0]);
    relay(channel, pair[1], forwarded[1]);
  }
  ::close(pair[1]);
  ::close(forwarded[1]);
  ::dup2(pair[0], channel);
  ::close(pair[0]);
  return forwarded[0];
}

// The SDK has closed the channel by now; the relay then sees its end.
void wait_until_forwarded(int forwarded) {
  char byte;
  while (::read(forwarded, &byte, 1) < 0 && errno == EINTR) {
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int forwarded = start_observer();
  const int code = cairn::main(argc, argv, [](cairn::context& ctx, const json& input) -> json {
    std::random_device rd;
    json outputs = json::array();
    auto step = [&](const std::string& name) {
      outputs.push_back(ctx.step(name, [&] { return json{{"name", name}, {"nonce", std::to_string(rd())}}; }));
    };
    const int steps = input.value("steps", 3);
    for (int i = 0; i < steps; ++i) step("step " + std::to_string(i));
    outputs.push_back(std::chrono::duration_cast<std::chrono::milliseconds>(ctx.now().time_since_epoch()).count());
    if (input.value("tool", false)) outputs.push_back(ctx.tool("mailer", {{"to", ctx.run_id()}}));
    if (int ms = input.value("sleep_ms", 0); ms > 0) ctx.sleep(std::chrono::milliseconds(ms));
    if (input.contains("signal")) outputs.push_back(*ctx.wait_signal(input["signal"].get<std::string>()));
    if (input.value("child", false)) outputs.push_back(ctx.join(ctx.start_child("durability_agent", {{"steps", 2}})));
    step("last");
    return json{{"outputs", outputs}};
  });
  wait_until_forwarded(forwarded);
  return code;
}
