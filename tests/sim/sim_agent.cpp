#include "tests/sim/sim_agent.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <csignal>
#include <cstring>

#include <filesystem>

#include <fmt/format.h>

#include "runtime/channel.hpp"

namespace cairn::sim {

std::string signal_name(std::uint64_t seq) { return fmt::format("s{}", seq); }

std::string child_id(const std::string& parent, std::uint64_t seq) { return fmt::format("{}.{}", parent, seq); }

std::string child_agent() { return std::filesystem::read_symlink("/proc/self/exe").filename().string(); }

std::string step_name(const op& o, std::uint64_t seq, const std::string& run) {
  switch (o.kind) {
    case op::step: return "step";
    case op::at_most_once: return "charge";
    case op::idempotent: return "fetch";
    case op::sleep: return "sleep";
    case op::signal: return signal_name(seq);
    case op::child: return child_agent();
    case op::join: return child_id(run, o.of);
  }
  return "";
}

json step_output(const std::string& run, std::uint64_t seq) { return json{{"run", run}, {"seq", seq}}; }

namespace {

protocol::step_kind kind_of(const op& o) {
  switch (o.kind) {
    case op::step: return protocol::step_kind::step;
    case op::at_most_once:
    case op::idempotent: return protocol::step_kind::tool;
    case op::sleep: return protocol::step_kind::sleep;
    case op::signal: return protocol::step_kind::signal;
    case op::child: return protocol::step_kind::child;
    case op::join: return protocol::step_kind::join;
  }
  return protocol::step_kind::step;
}

}  // namespace

sim_agent::sim_agent(std::string run, std::string worker, const std::vector<op>& script, int fd,
                     agent_watcher& watcher)
    : run_(std::move(run)), worker_(std::move(worker)), script_(script), fd_(fd), watcher_(watcher) {}

sim_agent::~sim_agent() {
  if (fd_ >= 0) ::close(fd_);
}

void sim_agent::exit(runtime::exit_status s) {
  if (status_) return;
  status_ = s;
  phase_ = phase::ended;
  // A process that ends closes its end: the host reads what was sent, then EOF.
  ::close(std::exchange(fd_, -1));
}

void sim_agent::kill() { exit(runtime::exit_status{false, 0, SIGKILL}); }

void sim_agent::send(const protocol::agent_message& m) {
  const auto frame = protocol::encode_frame(protocol::to_json(m));
  // Frames here are small; a socketpair's buffer holds many. A host that
  // closed its end makes the agent exit, as the SDK's host_gone does.
  const auto n = ::send(fd_, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n == static_cast<ssize_t>(frame.size())) return;
  if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) return exit(runtime::exit_status{true, 1, 0});
  throw agent_error(fmt::format("agent of {} could not send a frame of {} bytes: {}", run_, frame.size(),
                                n < 0 ? std::strerror(errno) : "short write"));
}

std::optional<protocol::host_message> sim_agent::receive() {
  if (auto j = decoder_.next()) return protocol::parse_host_message(*j);
  char buf[65536];
  const auto n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return std::nullopt;
  if (n <= 0) {
    exit(runtime::exit_status{true, 1, 0});  // the host is gone
    return std::nullopt;
  }
  decoder_.feed(std::string_view(buf, static_cast<std::size_t>(n)));
  if (auto j = decoder_.next()) return protocol::parse_host_message(*j);
  return std::nullopt;
}

bool sim_agent::act() {
  if (status_) return false;
  switch (phase_) {
    case phase::hello:
      send(protocol::hello_msg{protocol::version, "cairn-sim"});
      phase_ = phase::start;
      return true;
    case phase::ready:
      return next();
    case phase::begun: {
      protocol::step_msg m;
      m.result.seq = seq_;
      m.result.name = "step";
      m.result.kind = protocol::step_kind::step;
      m.result.output = step_output(run_, seq_);
      send(m);
      phase_ = phase::answer;
      return true;
    }
    default:
      break;
  }
  auto m = receive();
  if (!m) return status_.has_value();
  handle(*m);
  return true;
}

// The next request of the script, or done.
bool sim_agent::next() {
  if (seq_ == script_.size()) {
    send(protocol::done_msg{json{{"steps", seq_}}});
    if (status_) return true;
    // As the SDK ends: it closes its channel and the process exits.
    ::shutdown(fd_, SHUT_WR);
    exit(runtime::exit_status{true, 0, 0});
    return true;
  }
  const op& o = script_[seq_];
  watcher_.executes(run_, worker_, seq_);
  switch (o.kind) {
    case op::step:
      send(protocol::begin_msg{seq_, "step", protocol::step_kind::step, 1, 0, {}});
      phase_ = phase::begun;
      return true;
    case op::at_most_once:
    case op::idempotent:
      send(protocol::tool_msg{seq_, step_name(o, seq_, run_), json{{"seq", seq_}}});
      break;
    case op::sleep:
      send(protocol::sleep_msg{seq_, o.ms, std::nullopt});
      break;
    case op::signal:
      send(protocol::wait_msg{seq_, signal_name(seq_), std::nullopt});
      break;
    case op::child:
      send(protocol::child_msg{seq_, child_agent(), json{{"parent", run_}}});
      break;
    case op::join:
      send(protocol::join_msg{seq_, child_id(run_, o.of)});
      break;
  }
  phase_ = phase::answer;
  return true;
}

// The history is all here: each journaled step must be the script's.
void sim_agent::replayed() {
  for (const auto& r : history_) {
    if (r.seq >= script_.size() || r.name != step_name(script_[r.seq], r.seq, run_) || r.kind != kind_of(script_[r.seq]))
      throw agent_error(fmt::format("{}'s history has {} '{}' at step {}, which its script does not make", run_,
                                    protocol::to_string(r.kind), r.name, r.seq));
    if (!r.ok) throw agent_error(fmt::format("{}'s history has step {} failed: {}", run_, r.seq, r.error.message));
  }
  seq_ = history_steps_;
  history_.clear();
  phase_ = phase::ready;
}

void sim_agent::handle(const protocol::host_message& m) {
  auto unexpected = [&] {
    return agent_error(fmt::format("the host sent '{}' to the agent of {} ({}) at step {}",
                                   protocol::to_json(m).value("t", "?"), run_, worker_, seq_));
  };
  switch (phase_) {
    case phase::start: {
      const auto* s = std::get_if<protocol::start_msg>(&m);
      if (!s) throw unexpected();
      history_steps_ = s->history_steps;
      if (history_steps_ == 0) {
        phase_ = phase::ready;
        return;
      }
      send(protocol::history_msg{0});
      phase_ = phase::history;
      return;
    }
    case phase::history: {
      const auto* chunk = std::get_if<protocol::history_chunk>(&m);
      if (!chunk || chunk->from != history_.size() || chunk->steps.empty() ||
          chunk->steps.size() > history_steps_ - history_.size())
        throw unexpected();
      history_.insert(history_.end(), chunk->steps.begin(), chunk->steps.end());
      if (history_.size() < history_steps_) return send(protocol::history_msg{history_.size()});
      return replayed();
    }
    case phase::answer: {
      const op& o = script_[seq_];
      json output;
      if (o.kind == op::step) {
        const auto* ack = std::get_if<protocol::ack_msg>(&m);
        if (!ack || ack->seq != seq_) throw unexpected();
        output = step_output(run_, seq_);
      } else {
        const auto* result = std::get_if<protocol::result_msg>(&m);
        if (!result || result->result.seq != seq_) throw unexpected();
        if (!result->result.ok)
          throw agent_error(fmt::format("the host answered step {} of {} with a failure: {} ({})", seq_, run_,
                                        result->result.error.message, result->result.error.type));
        output = result->result.output;
      }
      watcher_.answered(run_, worker_, seq_, output);
      ++seq_;
      phase_ = phase::ready;
      return;
    }
    default:
      throw unexpected();
  }
}

namespace {

class sim_process final : public runtime::agent_process {
 public:
  sim_process(std::shared_ptr<sim_agent> agent, int host_fd) : agent_(std::move(agent)), host_(host_fd) {}
  ~sim_process() override { agent_->kill(); }

  runtime::channel& io() override { return host_; }
  // No process: a pid no process has.
  pid_t pid() const override { return INT_MAX; }
  std::optional<runtime::exit_status> poll_exit() override { return agent_->status(); }
  runtime::exit_status kill() override {
    agent_->kill();
    return *agent_->status();
  }
  // Nothing in the simulation happens while the host waits: the agent has ended, or has not.
  std::optional<runtime::exit_status> wait_for(std::chrono::milliseconds) override { return agent_->status(); }
  std::string log_tail(std::size_t) const override { return {}; }
  std::optional<runtime::limit_breach> check_limits() override { return std::nullopt; }

 private:
  std::shared_ptr<sim_agent> agent_;
  runtime::channel host_;
};

}  // namespace

class sim_sandbox final : public runtime::sandbox {
 public:
  sim_sandbox(sim_backend& backend, std::string run) : backend_(backend), run_(std::move(run)) {}

  std::unique_ptr<runtime::agent_process> exec(const std::filesystem::path&, const std::vector<std::string>&) override {
    auto script = backend_.scripts_.find(run_);
    if (script == backend_.scripts_.end())
      throw runtime::sandbox_error(runtime::sandbox_errc::bad_spec, "no script for run " + run_);
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0)
      throw runtime::sandbox_error(runtime::sandbox_errc::spawn_failed, "socketpair failed");
    auto agent = std::make_shared<sim_agent>(run_, backend_.worker_, script->second, fds[1], backend_.watcher_);
    backend_.started_.push_back(agent);
    backend_.watcher_.trace(fmt::format("{} starts an agent for {}", backend_.worker_, run_));
    return std::make_unique<sim_process>(std::move(agent), fds[0]);
  }
  void destroy() override {}
  std::vector<std::string> warnings() const override { return {}; }

 private:
  sim_backend& backend_;
  std::string run_;
};

sim_backend::sim_backend(std::string worker, const std::map<std::string, std::vector<op>>& scripts,
                         agent_watcher& watcher)
    : worker_(std::move(worker)), scripts_(scripts), watcher_(watcher) {}

std::unique_ptr<runtime::sandbox> sim_backend::create(const runtime::sandbox_spec& spec) {
  return std::make_unique<sim_sandbox>(*this, spec.run_id);
}

std::vector<std::shared_ptr<sim_agent>> sim_backend::agents() {
  std::vector<std::shared_ptr<sim_agent>> live;
  std::vector<std::weak_ptr<sim_agent>> kept;
  for (auto& weak : started_)
    if (auto agent = weak.lock(); agent && !agent->status()) {
      live.push_back(agent);
      kept.push_back(weak);
    }
  started_ = std::move(kept);
  return live;
}

}  // namespace cairn::sim
