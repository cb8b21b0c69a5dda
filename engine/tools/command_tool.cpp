#include "engine/tools/command_tool.hpp"

#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdlib>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/readable_pipe.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/writable_pipe.hpp>
#include <boost/asio/write.hpp>
#include <boost/process/v2/environment.hpp>
#include <boost/process/v2/process.hpp>
#include <boost/process/v2/stdio.hpp>
#include <fmt/format.h>

#include "protocol/bounded_json.hpp"
#include "protocol/text.hpp"

namespace cairn::engine {
namespace {

namespace asio = boost::asio;
namespace bp = boost::process::v2;
using clock = std::chrono::steady_clock;
using boost::system::error_code;
constexpr std::size_t max_stderr_kept = 4096;

bool type_matches(const std::string& type, const json& v) {
  if (type == "any") return true;
  if (type == "string") return v.is_string();
  if (type == "number") return v.is_number();
  if (type == "integer") return v.is_number_integer();
  if (type == "boolean") return v.is_boolean();
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  return false;
}

std::string_view without_trailing_space(std::string_view s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.remove_suffix(1);
  return s;
}

// A Boost.Process v2 launcher of cairn's for user tools: posix_spawn, which
// glibc runs as clone(CLONE_VM | CLONE_VFORK) on a stack of its own, so that
// starting a tool costs the same however much memory the host holds. v2 1.81's
// default_launcher forks the host and so copies its page tables: a call of
// /bin/cat took 1.0-1.1 ms spawned whatever the host held, forked 1.2 ms with
// nothing held, 2.8-3.5 ms with 100 MiB, 66-80 ms with 2 GiB. Its
// vfork_launcher runs asio's fork hooks in a child that shares the host's
// memory, and exit() there when the exec fails.
// The tool gets the descriptors `stdio` names as 0, 1 and 2 and no other;
// exactly `env`; a process group of its own, so that a timeout or an
// oversized output kills all it started; no signal blocked (the host blocks
// SIGPIPE while it talks to it). A failed exec is reaped by posix_spawn and
// thrown as a system_error.
struct spawn_launcher {
  bp::process operator()(asio::io_context& io, const std::vector<std::string>& command, bp::process_stdio& stdio,
                         const bp::process_environment& env) const {
    for (const auto* binding_error : {&stdio.in.ec, &stdio.out.ec, &stdio.err.ec})
      if (*binding_error) throw boost::system::system_error(*binding_error, "pipe");
    std::vector<char*> argv;
    for (const auto& arg : command) argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, stdio.in.fd, 0);
    posix_spawn_file_actions_adddup2(&actions, stdio.out.fd, 1);
    posix_spawn_file_actions_adddup2(&actions, stdio.err.fd, 2);
    posix_spawn_file_actions_addclosefrom_np(&actions, 3);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setpgroup(&attr, 0);
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
    pid_t pid = -1;
    const int failed = ::posix_spawn(&pid, argv[0], &actions, &attr, argv.data(),
                                     const_cast<char* const*>(env.env.data()));
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    if (failed) throw boost::system::system_error(error_code(failed, boost::system::system_category()), "spawn");
    return bp::process(io.get_executor(), pid);
  }
};

// Blocks SIGPIPE in this thread while it lives, and discards one raised
// meanwhile: a tool that exits without reading its input must not take the
// host down when the host writes it.
class sigpipe_blocked {
 public:
  sigpipe_blocked() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    ::pthread_sigmask(SIG_BLOCK, &pipe_, &before_);
  }
  ~sigpipe_blocked() {
    timespec zero{};
    while (::sigtimedwait(&pipe_, nullptr, &zero) > 0) {
    }
    ::pthread_sigmask(SIG_SETMASK, &before_, nullptr);
  }
  sigpipe_blocked(const sigpipe_blocked&) = delete;
  sigpipe_blocked& operator=(const sigpipe_blocked&) = delete;

 private:
  sigset_t pipe_, before_;
};

// The tool's process. Destroying it kills the tool's group and reaps it,
// unless reaped before. The group is signalled before its leader is reaped,
// while the leader's id is still taken, so the signal cannot reach another
// group that reused it.
class tool_process {
 public:
  explicit tool_process(bp::process process) : process_(std::move(process)) {}
  ~tool_process() {
    if (!reaped_) reap();
  }
  tool_process(const tool_process&) = delete;
  tool_process& operator=(const tool_process&) = delete;

  pid_t id() const { return process_.id(); }
  void kill_group() {
    if (!reaped_) ::kill(-process_.id(), SIGKILL);
  }
  // Kills whatever the tool left running in its group, then waits for the
  // tool itself: its wait status.
  int reap() {
    kill_group();
    error_code ignored;
    process_.wait(ignored);
    reaped_ = true;
    process_.detach();  // reaped: its id may belong to another process now
    return process_.native_exit_code();
  }

 private:
  bp::process process_;
  bool reaped_ = false;
};

// What ended a tool's exchange with the host.
enum class ending { exited, timed_out, too_large };

// One call's exchange with its tool, on a private io_context: the
// arguments go to its stdin; stdout (up to a limit) and the end of stderr
// are read until both close and the tool has exited, or the deadline passes.
class tool_exchange {
 public:
  tool_exchange(asio::io_context& io, tool_process& tool, asio::writable_pipe& in, asio::readable_pipe& out,
                asio::readable_pipe& err, std::size_t max_output)
      : io_(io), tool_(tool), in_(in), out_(out), err_(err), max_output_(max_output), deadline_(io),
        exit_poll_(io), exit_watch_(io) {}

  ending run(const std::string& input, clock::time_point deadline) {
    asio::async_write(in_, asio::buffer(input), [this](error_code, std::size_t) {
      error_code ignored;  // EPIPE: the tool did not read its input, which is its business
      in_.close(ignored);
    });
    read_stdout();
    read_stderr();
    watch_exit();
    deadline_.expires_at(deadline);
    deadline_.async_wait([this](error_code ec) {
      if (!ec) end(ending::timed_out);
    });
    io_.run();
    return ending_;
  }

  std::string& stdout_text() { return stdout_; }
  std::string& stderr_tail() { return stderr_; }

 private:
  void read_stdout() {
    out_.async_read_some(asio::buffer(out_buffer_), [this](error_code ec, std::size_t n) {
      if (ec) return closed();
      stdout_.append(out_buffer_.data(), n);
      if (stdout_.size() > max_output_) return end(ending::too_large);
      read_stdout();
    });
  }

  void read_stderr() {
    err_.async_read_some(asio::buffer(err_buffer_), [this](error_code ec, std::size_t n) {
      if (ec) return closed();
      stderr_.append(err_buffer_.data(), n);
      if (stderr_.size() > max_stderr_kept) stderr_.erase(0, stderr_.size() - max_stderr_kept);
      read_stderr();
    });
  }

  // Learns of the tool's exit without reaping it (reap() signals its group
  // first): from a pidfd, or where the kernel has none (Linux before 5.3),
  // by looking every millisecond.
  void watch_exit() {
    int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, tool_.id(), 0));
    if (pidfd >= 0) {
      exit_watch_.assign(pidfd);
      exit_watch_.async_wait(asio::posix::stream_descriptor::wait_read, [this](error_code ec) {
        if (!ec) exited();
      });
      return;
    }
    poll_exit();
  }

  void poll_exit() {
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(tool_.id()), &info, WEXITED | WNOWAIT | WNOHANG) == 0 && info.si_pid != 0)
      return exited();
    exit_poll_.expires_after(std::chrono::milliseconds(1));
    exit_poll_.async_wait([this](error_code ec) {
      if (!ec) poll_exit();
    });
  }

  void closed() {
    ++closed_;
    if (closed_ == 2 && exited_) end(ending::exited);
  }

  void exited() {
    exited_ = true;
    if (closed_ == 2) end(ending::exited);
  }

  void end(ending how) {
    ending_ = how;
    if (how != ending::exited) tool_.kill_group();
    io_.stop();
  }

  asio::io_context& io_;
  tool_process& tool_;
  asio::writable_pipe& in_;
  asio::readable_pipe& out_;
  asio::readable_pipe& err_;
  std::size_t max_output_;
  asio::steady_timer deadline_, exit_poll_;
  asio::posix::stream_descriptor exit_watch_;
  std::array<char, 65536> out_buffer_, err_buffer_;
  std::string stdout_, stderr_;
  int closed_ = 0;  // of stdout and stderr
  bool exited_ = false;
  ending ending_ = ending::exited;
};

class command_tool final : public tool {
 public:
  explicit command_tool(command_tool_options o) : o_(std::move(o)) {}

  const std::string& name() const override { return o_.name; }
  idempotency kind(const json&) const override { return o_.kind; }

  json call(const tool_call& call) override {
    check_args(call.args);
    const auto deadline = clock::now() + o_.timeout;
    sigpipe_blocked no_sigpipe;
    asio::io_context io;
    asio::writable_pipe in(io);
    asio::readable_pipe out(io), err(io);
    tool_process tool(start(io, call, in, out, err));
    tool_exchange exchange(io, tool, in, out, err, o_.max_output_bytes);
    const ending how = exchange.run(call.args.dump(), deadline);
    if (how == ending::timed_out)
      throw tool_error("timeout", fmt::format("tool {} did not finish within {} ms and was killed (raise "
                                              "tools.{}.timeout_ms in the policy if it needs longer)",
                                              o_.name, o_.timeout.count(), o_.name));
    if (how == ending::too_large)
      throw tool_error("too_large", fmt::format("tool {} printed more than {} bytes and was killed (raise "
                                                "tools.{}.max_output_bytes in the policy if that is expected)",
                                                o_.name, o_.max_output_bytes, o_.name));
    const int status = tool.reap();
    const auto err_tail = without_trailing_space(exchange.stderr_tail());
    const std::string stderr_said = err_tail.empty() ? "" : ": " + protocol::clip_tail(err_tail, 400);
    if (WIFSIGNALED(status))
      throw tool_error("failed", fmt::format("tool {} was killed by signal {}{}", o_.name, WTERMSIG(status),
                                             stderr_said));
    if (WEXITSTATUS(status) != 0)
      throw tool_error("failed", fmt::format("tool {} exited with code {}{}", o_.name, WEXITSTATUS(status),
                                             stderr_said));
    const auto& out_text = exchange.stdout_text();
    try {
      return protocol::parse_bounded(out_text, "its stdout", {max_result_depth, o_.max_output_bytes});
    } catch (const protocol::json_error& e) {
      throw tool_error("bad_output", fmt::format("tool {} printed something unusable on stdout ({} bytes, starting "
                                                 "'{}'): {}; a user tool prints exactly one JSON value",
                                                 o_.name, out_text.size(),
                                                 protocol::clip(without_trailing_space(out_text), 60), e.what()));
    }
  }

 private:
  void check_args(const json& args) const {
    if (!args.is_object())
      throw tool_error("refused", fmt::format("tool {} takes a JSON object of arguments", o_.name));
    for (const auto& [key, value] : args.items()) {
      auto it = o_.input.find(key);
      if (it == o_.input.end()) it = o_.input.find(key + "?");
      if (it == o_.input.end())
        throw tool_error("refused", fmt::format("tool {} does not take argument '{}'{}", o_.name, key, declared()));
      if (!type_matches(it->second, value))
        throw tool_error("refused", fmt::format("tool {}: argument '{}' must be {} {}", o_.name, key,
                                                it->second == "integer" || it->second == "array" ? "an" : "a",
                                                it->second));
    }
    for (const auto& [key, type] : o_.input)
      if (key.back() != '?' && !args.contains(key))
        throw tool_error("refused", fmt::format("tool {} needs argument '{}' ({})", o_.name, key, type));
  }

  std::string declared() const {
    if (o_.input.empty()) return " (it declares no arguments)";
    std::string list;
    for (const auto& [key, type] : o_.input) list += (list.empty() ? "" : ", ") + key + ": " + type;
    return " (it declares " + list + ")";
  }

  bp::process start(asio::io_context& io, const tool_call& call, asio::writable_pipe& in, asio::readable_pipe& out,
                    asio::readable_pipe& err) const {
    const std::vector<std::string> env = environment(call);
    try {
      bp::process_stdio stdio{in, out, err};
      return spawn_launcher{}(io, o_.command, stdio, bp::process_environment(env));
    } catch (const boost::system::system_error& e) {
      throw tool_error("failed",
                       fmt::format("tool {}: cannot start {}: {}", o_.name, o_.command[0], e.code().message()));
    }
  }

  // The tool's whole environment (command_tool.hpp): never the host's as a
  // whole. A variable the grant names (PATH too) takes the host's value.
  std::vector<std::string> environment(const tool_call& call) const {
    std::map<std::string, std::string> vars = {{"PATH", "/usr/local/bin:/usr/bin:/bin"}, {"LANG", "C.UTF-8"}};
    std::vector<std::string> names = o_.env;
    names.insert(names.begin(), "HOME");
    for (const auto& name : names)
      if (const char* value = std::getenv(name.c_str())) vars[name] = value;
    vars["CAIRN_RUN_ID"] = call.run_id;
    vars["CAIRN_TOOL_SEQ"] = std::to_string(call.seq);
    vars["CAIRN_IDEMPOTENCY_KEY"] = call.idempotency_key;
    std::vector<std::string> env;
    for (const auto& [name, value] : vars) env.push_back(name + "=" + value);
    return env;
  }

  command_tool_options o_;
};

}  // namespace

std::unique_ptr<tool> make_command_tool(command_tool_options options) {
  return std::make_unique<command_tool>(std::move(options));
}

}  // namespace cairn::engine
