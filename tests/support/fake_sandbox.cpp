#include "tests/support/fake_sandbox.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <climits>
#include <csignal>
#include <fstream>
#include <thread>

#include "runtime/channel.hpp"

namespace cairn::testing {

namespace fs = std::filesystem;

// What the agent's thread and the host's handle share.
struct fake_agent_env::shared {
  std::mutex mutex;
  std::condition_variable changed;
  bool killed = false;
  std::optional<runtime::exit_status> status;
  int agent_end = -1;  // the agent's end of the socketpair (not the SDK's duplicate)
};

bool fake_agent_env::sleep(std::chrono::milliseconds ms) const {
  std::unique_lock lock(state_->mutex);
  return state_->changed.wait_for(lock, ms, [&] { return state_->killed; });
}

bool fake_agent_env::killed() const {
  std::lock_guard lock(state_->mutex);
  return state_->killed;
}

void fake_agent_env::crash(int signal) const {
  {
    std::lock_guard lock(state_->mutex);
    if (!state_->status) state_->status = runtime::exit_status{false, 0, signal};
    state_->changed.notify_all();
  }
  ::shutdown(state_->agent_end, SHUT_RDWR);
  // Unwinds the workflow; what the SDK then tries to send goes nowhere.
  throw std::runtime_error("the fake agent crashed");
}

void fake_agent_env::append(const std::string& name, const std::string& line) const {
  std::ofstream(workspace_ / name, std::ios::app) << line << "\n";
}

class fake_process final : public runtime::agent_process {
 public:
  fake_process(fake_agent agent, const fs::path& workspace, std::size_t max_frame, fake_backend& backend)
      : backend_(backend) {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0)
      throw runtime::sandbox_error(runtime::sandbox_errc::spawn_failed, "socketpair failed");
    host_ = std::make_unique<runtime::channel>(fds[0], max_frame);
    agent_end_ = fds[1];
    env_.workspace_ = workspace;
    env_.state_ = std::make_shared<fake_agent_env::shared>();
    env_.state_->agent_end = agent_end_;
    // The SDK owns (and closes) a duplicate; shutting agent_end_ down ends
    // the socket under it whatever the thread does, as a kill ends a process.
    const int sdk_fd = ::dup(agent_end_);
    thread_ = std::thread([this, sdk_fd, agent = std::move(agent)] {
      const int code = cairn::run(sdk_fd, [&](context& ctx, const json& input) { return agent(ctx, input, env_); });
      std::lock_guard lock(env_.state_->mutex);
      if (!env_.state_->status) env_.state_->status = runtime::exit_status{true, code, 0};
      env_.state_->changed.notify_all();
    });
  }

  ~fake_process() override {
    kill();
    thread_.join();
    ::close(agent_end_);
  }

  runtime::channel& io() override { return *host_; }
  // No process: a pid no process has (pidfd_open fails; the host watches the channel).
  pid_t pid() const override { return INT_MAX; }

  std::optional<runtime::exit_status> poll_exit() override {
    std::lock_guard lock(env_.state_->mutex);
    return env_.state_->status;
  }

  runtime::exit_status kill() override {
    // An agent that has closed its channel (after done or fail) is ending by
    // itself, as a process would exit within moments: waited for, not killed.
    if (host_->peer_closed()) {
      std::unique_lock lock(env_.state_->mutex);
      if (env_.state_->changed.wait_for(lock, std::chrono::minutes(1), [&] { return env_.state_->status.has_value(); }))
        return *env_.state_->status;
    }
    {
      std::lock_guard lock(env_.state_->mutex);
      if (env_.state_->status) return *env_.state_->status;
      env_.state_->killed = true;
      env_.state_->status = runtime::exit_status{false, 0, SIGKILL};
      env_.state_->changed.notify_all();
    }
    ++backend_.kills;
    ::shutdown(agent_end_, SHUT_RDWR);
    return runtime::exit_status{false, 0, SIGKILL};
  }

  std::optional<runtime::exit_status> wait_for(std::chrono::milliseconds timeout) override {
    std::unique_lock lock(env_.state_->mutex);
    env_.state_->changed.wait_for(lock, timeout, [&] { return env_.state_->status.has_value(); });
    return env_.state_->status;
  }

  std::string log_tail(std::size_t) const override { return {}; }
  std::optional<runtime::limit_breach> check_limits() override { return std::nullopt; }

 private:
  fake_backend& backend_;
  std::unique_ptr<runtime::channel> host_;
  int agent_end_ = -1;
  fake_agent_env env_;
  std::thread thread_;
};

// How a fake agent's file begins: then the path it was registered as.
constexpr std::string_view fake_agent_mark = "a fake agent, run by tests/support/fake_sandbox.cpp in the test's process: ";

class fake_sandbox final : public runtime::sandbox {
 public:
  fake_sandbox(fake_backend& backend, fs::path workspace) : backend_(backend), workspace_(std::move(workspace)) {}

  std::unique_ptr<runtime::agent_process> exec(const fs::path& program, const std::vector<std::string>&) override {
    fake_agent agent;
    {
      std::lock_guard lock(backend_.mutex_);
      auto it = backend_.agents_.find(program.string());
      std::string line;
      if (it == backend_.agents_.end() && std::getline(std::ifstream(program), line) &&
          line.starts_with(fake_agent_mark))
        it = backend_.agents_.find(line.substr(fake_agent_mark.size()));
      if (it == backend_.agents_.end())
        throw runtime::sandbox_error(runtime::sandbox_errc::bad_spec,
                                     "no fake agent is registered as " + program.string());
      agent = it->second;
    }
    ++backend_.agents;
    return std::make_unique<fake_process>(std::move(agent), workspace_, protocol::default_max_frame, backend_);
  }

  void destroy() override {}
  std::vector<std::string> warnings() const override { return {}; }

 private:
  fake_backend& backend_;
  fs::path workspace_;
};

fs::path fake_backend::add_agent(const fs::path& folder, const std::string& name, fake_agent agent) {
  fs::create_directories(folder);
  const auto program = folder / name;
  // Its content names it: a copy kept by the engine (engine/agent_versions.hpp) runs the same agent.
  std::ofstream(program) << fake_agent_mark << program.string() << "\n";
  fs::permissions(program, fs::perms::owner_all | fs::perms::group_read | fs::perms::others_read);
  std::lock_guard lock(mutex_);
  agents_[program.string()] = std::move(agent);
  return program;
}

std::unique_ptr<runtime::sandbox> fake_backend::create(const runtime::sandbox_spec& spec) {
  fs::create_directories(spec.workspace);
  ++sandboxes;
  return std::make_unique<fake_sandbox>(*this, spec.workspace);
}

}  // namespace cairn::testing
