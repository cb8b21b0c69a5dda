// The durability proofs' agent (tests/agents/durability_agent.cpp) puts a
// relay of its own between the host and the workflow. However late the relay
// runs, the agent must not end before its `done` reached the host: the host
// takes an agent that ended first for a crashed attempt (PROTOCOL.md 2.3),
// and three in a row failed power_loss_test's runs on a loaded machine.
//
// The test plays the host on a socketpair and holds the relay (SIGSTOP) from
// the moment the agent has its last ack until it has written `done`: the
// agent must still be alive then, and once the relay goes on, `done` must be
// with the host by the time the agent ends.
#include <catch2/catch.hpp>

#include <linux/sockios.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "protocol/frame.hpp"
#include "protocol/messages.hpp"
#include "tests/temp_dir.hpp"

using namespace cairn;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

// Polls `ready` every millisecond, for at most `cap`.
bool wait_until(const std::function<bool()>& ready, std::chrono::milliseconds cap) {
  const auto deadline = std::chrono::steady_clock::now() + cap;
  while (!ready()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

// Bytes waiting in `fd`'s receive queue (FIONREAD), or sent on it and not yet
// read by the peer (SIOCOUTQ).
int queued(int fd, unsigned long request) {
  int bytes = 0;
  ::ioctl(fd, request, &bytes);
  return bytes;
}

// The state letter in /proc/PID/stat: T when stopped.
char state_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto close = stat.rfind(')');
  return close == std::string::npos || close + 2 >= stat.size() ? '?' : stat[close + 2];
}

// The relay names its logs after its pid (observed.PID.in, in the agent's cwd).
pid_t relay_of(const fs::path& workspace) {
  for (const auto& entry : fs::directory_iterator(workspace)) {
    const auto name = entry.path().filename().string();
    if (name.starts_with("observed.") && name.ends_with(".in")) return std::stoi(name.substr(9));
  }
  return -1;
}

// The agent started as the host starts it (its channel on fd 3, its
// workspace as cwd), and the host's end of that channel, read frame by frame.
class agent_session {
 public:
  explicit agent_session(const fs::path& workspace) {
    int pair[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) == 0);
    host_ = pair[0];
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::dup2(pair[1], 3);
      if (::chdir(workspace.c_str()) != 0) ::_exit(127);
      char env[] = "CAIRN_CHANNEL_FD=3";
      char* envp[] = {env, nullptr};
      ::execle(DURABILITY_AGENT, DURABILITY_AGENT, static_cast<char*>(nullptr), envp);
      ::_exit(127);
    }
    ::close(pair[1]);
    pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
    REQUIRE(pidfd_ >= 0);
  }
  ~agent_session() {
    if (relay_ > 0) ::kill(relay_, SIGCONT);
    if (!reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    ::close(pidfd_);
    hang_up();
  }
  agent_session(const agent_session&) = delete;
  agent_session& operator=(const agent_session&) = delete;

  pid_t pid() const { return pid_; }
  int host() const { return host_; }

  void send(const protocol::host_message& m) {
    const auto frame = protocol::encode_frame(protocol::to_json(m));
    REQUIRE(::send(host_, frame.data(), frame.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(frame.size()));
  }

  protocol::agent_message receive() {
    for (;;) {
      if (auto j = decoder_.next()) return protocol::parse_agent_message(*j);
      pollfd p{host_, POLLIN, 0};
      REQUIRE(::poll(&p, 1, 30'000) == 1);
      char buf[4096];
      const ssize_t n = ::recv(host_, buf, sizeof buf, 0);
      REQUIRE(n > 0);
      decoder_.feed(std::string_view(buf, static_cast<std::size_t>(n)));
    }
  }

  // The agent's own end of the channel to its relay (fd 3 in the agent).
  int dup_agent_channel() const { return static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd_, 3, 0)); }

  bool ended_within(std::chrono::milliseconds t) const {
    pollfd p{pidfd_, POLLIN, 0};
    return ::poll(&p, 1, static_cast<int>(t.count())) == 1;
  }

  void reap() {
    ::waitpid(pid_, nullptr, 0);
    reaped_ = true;
  }

  // The relay reads the host's end to its end, then exits.
  void hang_up() {
    if (host_ >= 0) ::close(host_);
    host_ = -1;
  }

  // Stopped here; continued by the destructor at the latest.
  void hold_relay(pid_t relay) {
    relay_ = relay;
    ::kill(relay_, SIGSTOP);
  }

 private:
  int host_ = -1;
  int pidfd_ = -1;
  pid_t pid_ = -1;
  pid_t relay_ = -1;
  bool reaped_ = false;
  protocol::frame_decoder decoder_;
};

}  // namespace

TEST_CASE("the durability agent ends only after its relay passed its done on to the host") {
  testing::temp_dir workspace;
  agent_session agent(workspace.path());

  REQUIRE(std::holds_alternative<protocol::hello_msg>(agent.receive()));
  protocol::start_msg start;
  start.run_id = "observed";
  start.input = {{"steps", 0}};
  agent.send(start);
  std::uint64_t last = 0;
  for (;;) {
    auto m = agent.receive();
    auto* step = std::get_if<protocol::step_msg>(&m);
    if (!step) continue;  // a begin
    if (step->result.name == "last") {
      last = step->result.seq;
      break;
    }
    agent.send(protocol::ack_msg{step->result.seq});
  }

  // The last ack goes through the relay while the agent is stopped, so the
  // relay can be held before the agent answers it.
  REQUIRE(::kill(agent.pid(), SIGSTOP) == 0);
  int status = 0;
  REQUIRE(::waitpid(agent.pid(), &status, WUNTRACED) == agent.pid());
  const int agent_channel = agent.dup_agent_channel();
  REQUIRE(agent_channel >= 0);
  agent.send(protocol::ack_msg{last});
  const auto ack_size = static_cast<int>(protocol::encode_frame(protocol::to_json(protocol::ack_msg{last})).size());
  REQUIRE(wait_until([&] { return queued(agent_channel, FIONREAD) >= ack_size; }, 30s));
  const pid_t relay = relay_of(workspace.path());
  REQUIRE(relay > 0);
  agent.hold_relay(relay);
  REQUIRE(wait_until([&] { return state_of(relay) == 'T'; }, 30s));
  REQUIRE(::kill(agent.pid(), SIGCONT) == 0);

  // Its done written (not yet read by the held relay), or the agent gone.
  REQUIRE(wait_until([&] { return queued(agent_channel, SIOCOUTQ) > 0 || agent.ended_within(0ms); }, 30s));
  ::close(agent_channel);
  INFO("the agent ended while its relay still held its done: the host would count a crashed attempt");
  // One that does not wait ends within a millisecond of its last write; 2 s leave a loaded machine room.
  REQUIRE_FALSE(agent.ended_within(2s));

  REQUIRE(::kill(relay, SIGCONT) == 0);
  REQUIRE(agent.ended_within(60s));
  REQUIRE(queued(agent.host(), FIONREAD) > 0);
  REQUIRE(std::holds_alternative<protocol::done_msg>(agent.receive()));
  agent.reap();
  agent.hang_up();
  // The relay writes its last file into the workspace; let it finish before the folder goes.
  REQUIRE(wait_until([&] { return fs::exists(workspace / ("observed." + std::to_string(relay) + ".closed")); }, 30s));
}
