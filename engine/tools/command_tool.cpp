#include "engine/tools/command_tool.hpp"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "protocol/bounded_json.hpp"

namespace cairn::engine {
namespace {

using clock = std::chrono::steady_clock;
constexpr std::size_t max_stderr_kept = 4096;

struct fd_closer {
  int fd = -1;
  ~fd_closer() {
    if (fd >= 0) ::close(fd);
  }
  void reset() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

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

std::string clip(std::string s, std::size_t max) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  if (s.size() > max) s = "..." + s.substr(s.size() - max);
  return s;
}

// The process and its pipes; kills the whole group if still running when destroyed.
struct child {
  pid_t pid = -1;
  fd_closer in, out, err;
  bool reaped = false;
  int status = 0;

  ~child() {
    if (pid > 0 && !reaped) {
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
  void kill_group() {
    if (pid > 0 && !reaped) ::kill(-pid, SIGKILL);
  }
  // Waits for the program to exit (until `deadline`, then kills it), then
  // kills whatever it left running in its group. The group is signalled while
  // the exited leader is still a zombie, so its id cannot have been reused.
  void reap(clock::time_point deadline) {
    if (reaped) return;
    // A pidfd turns readable when the process exits; without one, poll.
    fd_closer pidfd{static_cast<int>(::syscall(SYS_pidfd_open, pid, 0))};
    siginfo_t info{};
    for (;;) {
      info.si_pid = 0;
      if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT | WNOHANG) == 0 && info.si_pid == pid)
        break;
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
      if (left <= 0) break;
      if (pidfd.fd >= 0) {
        pollfd exited{pidfd.fd, POLLIN, 0};
        ::poll(&exited, 1, static_cast<int>(std::min<std::int64_t>(left, 1000)));
      } else {
        ::usleep(1000);
      }
    }
    ::kill(-pid, SIGKILL);
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    reaped = true;
  }
};

class command_tool final : public tool {
 public:
  explicit command_tool(command_tool_options o) : o_(std::move(o)) {}

  const std::string& name() const override { return o_.name; }
  idempotency kind(const json&) const override { return o_.kind; }

  json call(const tool_call& call) override {
    check_args(call.args);
    const auto deadline = clock::now() + o_.timeout;
    child c = start(call);
    std::string out, err;
    exchange(c, call.args.dump(), deadline, out, err);
    c.reap(deadline);
    if (WIFSIGNALED(c.status) && WTERMSIG(c.status) == SIGKILL && clock::now() >= deadline)
      throw timed_out();
    if (WIFSIGNALED(c.status))
      throw tool_error("failed", fmt::format("tool {} was killed by signal {}{}", o_.name, WTERMSIG(c.status),
                                             err.empty() ? "" : ": " + clip(err, 400)));
    if (WEXITSTATUS(c.status) != 0)
      throw tool_error("failed", fmt::format("tool {} exited with code {}{}", o_.name, WEXITSTATUS(c.status),
                                             err.empty() ? "" : ": " + clip(err, 400)));
    try {
      return protocol::parse_bounded(out, "its stdout", {max_result_depth, o_.max_output_bytes});
    } catch (const protocol::json_error& e) {
      throw tool_error("bad_output", fmt::format("tool {} printed something unusable on stdout ({} bytes, starting "
                                                 "'{}'): {}; a user tool prints exactly one JSON value",
                                                 o_.name, out.size(), clip(out.substr(0, 60), 60), e.what()));
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

  child start(const tool_call& call) const {
    int in[2], out[2], err[2];
    if (::pipe2(in, O_CLOEXEC) < 0) throw io_error("pipe");
    child c;
    c.in.fd = in[1];
    fd_closer in_read{in[0]};
    if (::pipe2(out, O_CLOEXEC) < 0) throw io_error("pipe");
    c.out.fd = out[0];
    fd_closer out_write{out[1]};
    if (::pipe2(err, O_CLOEXEC) < 0) throw io_error("pipe");
    c.err.fd = err[0];
    fd_closer err_write{err[1]};

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in[0], 0);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_adddup2(&actions, err[1], 2);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setpgroup(&attr, 0);  // its own group, so a timeout kills all it started
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);

    auto env_strings = environment(call);
    std::vector<char*> envp, argv;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> args = o_.command;
    for (auto& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);

    int rc = posix_spawn(&c.pid, args[0].c_str(), &actions, &attr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    if (rc != 0) {
      c.pid = -1;
      throw tool_error("failed", fmt::format("tool {}: cannot start {}: {}", o_.name, args[0], std::strerror(rc)));
    }
    return c;
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

  // Writes `input` to stdin and reads stdout and stderr until both close,
  // within the timeout and the output limit.
  void exchange(child& c, const std::string& input, clock::time_point deadline, std::string& out,
                std::string& err) const {
    std::size_t written = 0;
    for (int fd : {c.in.fd, c.out.fd, c.err.fd}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    if (input.empty()) c.in.reset();
    char buf[65536];
    while (c.out.fd >= 0 || c.err.fd >= 0) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
      if (left <= 0) {
        c.kill_group();
        throw timed_out();
      }
      pollfd fds[3] = {{c.in.fd, POLLOUT, 0}, {c.out.fd, POLLIN, 0}, {c.err.fd, POLLIN, 0}};
      int n = ::poll(fds, 3, static_cast<int>(std::min<std::int64_t>(left, 1000)));
      if (n < 0 && errno != EINTR) throw io_error("poll");
      if (n <= 0) continue;
      if (c.in.fd >= 0 && fds[0].revents) {
        ssize_t w = write_no_sigpipe(c.in.fd, input.data() + written, input.size() - written);
        if (w > 0) written += static_cast<std::size_t>(w);
        if ((w < 0 && errno != EAGAIN && errno != EINTR) || written == input.size()) c.in.reset();
      }
      drain(c.out, fds[1].revents, buf, sizeof buf, out, o_.max_output_bytes, c);
      drain(c.err, fds[2].revents, buf, sizeof buf, err, SIZE_MAX, c);
      if (err.size() > max_stderr_kept) err.erase(0, err.size() - max_stderr_kept);
    }
  }

  void drain(fd_closer& fd, short revents, char* buf, std::size_t size, std::string& into, std::size_t limit,
             child& c) const {
    if (fd.fd < 0 || !revents) return;
    ssize_t r = ::read(fd.fd, buf, size);
    if (r > 0) {
      into.append(buf, static_cast<std::size_t>(r));
      if (into.size() > limit) {
        c.kill_group();
        throw tool_error("too_large", fmt::format("tool {} printed more than {} bytes and was killed (raise "
                                                  "tools.{}.max_output_bytes in the policy if that is expected)",
                                                  o_.name, limit, o_.name));
      }
    } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
      fd.reset();
    }
  }

  // A tool that exits without reading its input must not take the host down
  // with SIGPIPE: block it for this write and discard it if raised.
  static ssize_t write_no_sigpipe(int fd, const char* data, std::size_t size) {
    sigset_t pipe_signal, old;
    sigemptyset(&pipe_signal);
    sigaddset(&pipe_signal, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_signal, &old);
    ssize_t w = ::write(fd, data, size);
    int saved = errno;
    if (w < 0 && errno == EPIPE) {
      timespec zero{};
      sigtimedwait(&pipe_signal, nullptr, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    errno = saved;
    return w;
  }

  tool_error timed_out() const {
    return tool_error("timeout", fmt::format("tool {} did not finish within {} ms and was killed (raise "
                                             "tools.{}.timeout_ms in the policy if it needs longer)",
                                             o_.name, o_.timeout.count(), o_.name));
  }

  tool_error io_error(const char* what) const {
    return tool_error("failed", fmt::format("tool {}: {}: {}", o_.name, what, std::strerror(errno)));
  }

  command_tool_options o_;
};

}  // namespace

std::unique_ptr<tool> make_command_tool(command_tool_options options) {
  return std::make_unique<command_tool>(std::move(options));
}

}  // namespace cairn::engine
