// Runs the `cairn` binary as a user would, for tests and benchmarks: one
// place that forks, sets the environment and collects exit code and output.
#pragma once

#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace cairn::testing {

struct cli_result {
  int code = -1;  // exit code, or 128 + signal
  std::string out, err;
};

struct cli_options {
  std::filesystem::path cwd;                      // empty: the caller's
  std::map<std::string, std::string> env;         // set (or replaced) in the child
  std::vector<std::string> unset;                 // removed from the child's environment
  std::optional<std::pair<uid_t, gid_t>> as_user; // drop to this uid/gid before exec
};

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Starts `binary args...` and returns its pid without waiting: stdout and
// stderr go to the files `out` and `err` (may be the same; created or
// truncated). The child gets SIGKILL when the thread that started it ends
// (PR_SET_PDEATHSIG), so a test that dies leaves no process behind: start
// long-lived children from a thread that outlives them.
inline pid_t spawn_program(const std::filesystem::path& binary, std::vector<std::string> args,
                           const std::filesystem::path& out_path, const std::filesystem::path& err_path,
                           const cli_options& o = {}) {
  args.insert(args.begin(), binary.string());
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid == 0) {
    if (!o.cwd.empty() && ::chdir(o.cwd.c_str()) != 0) ::_exit(126);
    for (const auto& name : o.unset) ::unsetenv(name.c_str());
    for (const auto& [name, value] : o.env) ::setenv(name.c_str(), value.c_str(), 1);
    int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0666);
    int err = err_path == out_path ? out : ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0666);
    int null = ::open("/dev/null", O_RDONLY);
    if (out < 0 || err < 0 || null < 0) ::_exit(126);
    ::dup2(null, 0);
    ::dup2(out, 1);
    ::dup2(err, 2);
    if (o.as_user && (::setgroups(0, nullptr) != 0 || ::setresgid(o.as_user->second, o.as_user->second,
                                                                   o.as_user->second) != 0 ||
                      ::setresuid(o.as_user->first, o.as_user->first, o.as_user->first) != 0))
      ::_exit(125);
    // After the uid change, which clears it; the parent may have gone before.
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != parent) ::_exit(125);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

// Runs `binary args...` and waits for it; stdout and stderr go through files
// in `scratch` (which must exist and be writable by the user it runs as).
inline cli_result run_program(const std::filesystem::path& binary, std::vector<std::string> args,
                              const std::filesystem::path& scratch, const cli_options& o = {}) {
  static std::atomic<int> counter = 0;
  const auto tag = std::to_string(::getpid()) + "-" + std::to_string(counter++);
  const auto out_path = scratch / ("cli-" + tag + ".out"), err_path = scratch / ("cli-" + tag + ".err");
  const pid_t pid = spawn_program(binary, std::move(args), out_path, err_path, o);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  cli_result r{WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), slurp(out_path), slurp(err_path)};
  std::error_code ec;
  std::filesystem::remove(out_path, ec);
  std::filesystem::remove(err_path, ec);
  return r;
}

}  // namespace cairn::testing
