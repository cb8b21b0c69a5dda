#include "runtime/spawn.hpp"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace cairn::runtime {
namespace {

// What the child was doing when it failed; index into step_names.
enum child_step : int { step_cgroup, step_setsid, step_fds, step_chdir, step_rlimit, step_drop_ids, step_exec };
constexpr const char* step_names[] = {"joining the sandbox cgroup", "setsid", "setting up file descriptors",
                                      "chdir", "setrlimit", "dropping to the sandbox uid", "exec"};

struct child_failure {
  int step;
  int error;
};

constexpr int channel_target = 3;
constexpr int first_extra_target = 4;
constexpr std::size_t max_extra_fds = 8;
// Every fd the child dup2s from is moved at least this high first, so no
// dup2 onto 0..(first_extra_target + extras) can clobber a source.
constexpr int source_fd_floor = 32;

unique_fd dup_high(int fd) {
  int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, source_fd_floor);
  if (copy < 0)
    throw sandbox_error(sandbox_errc::spawn_failed,
                        fmt::format("duplicating fd {}: {}", fd, std::strerror(errno)));
  return unique_fd(copy);
}

struct rlimit_setting {
  int resource;
  rlim_t soft, hard;
};

// Everything the child reads, prepared before the clone: the child shares
// the host's memory until its exec, so it may only make system calls. The C
// library's set*id wrappers are replaced by the raw calls: in a process
// with threads they take the library's locks and walk its thread list to
// change every thread's ids, and a lock another thread of the host held at
// the clone would never be released in the child.
struct child_plan {
  std::vector<char*> argv;
  std::vector<char*> envp;
  const char* cwd = nullptr;
  int devnull = -1, log = -1, channel = -1, error_pipe = -1;
  std::vector<int> extras;
  std::vector<int> cgroups;
  std::vector<rlimit_setting> limits;
  std::optional<spawn_identity> run_as;
  pid_t parent = 0;
};

// The child runs on a stack the sanitizers do not know, in memory it shares
// with the host: their instrumentation (which poisons stack, calls into their
// runtime before a noreturn call, maps memory under the child's rlimits)
// stays out of it (make test-sanitize).
#define CAIRN_CHILD_CODE __attribute__((no_sanitize("address", "undefined", "thread")))

// ThreadSanitizer takes every clone for a fork and resets its own state in
// the child, which breaks the host's when the child shares its memory: under
// it (only) the child gets a copy of the host's memory instead.
#if defined(__SANITIZE_THREAD__)
constexpr int shared_memory = 0;
#elif defined(__has_feature)
constexpr int shared_memory = __has_feature(thread_sanitizer) ? 0 : CLONE_VM | CLONE_VFORK;
#else
constexpr int shared_memory = CLONE_VM | CLONE_VFORK;
#endif

[[noreturn]] CAIRN_CHILD_CODE void fail_child(int error_pipe, int step) {
  child_failure failure{step, errno};
  [[maybe_unused]] ssize_t n = ::write(error_pipe, &failure, sizeof failure);
  ::_exit(127);
}

CAIRN_CHILD_CODE int run_child(void* argument) {
  const child_plan& plan = *static_cast<const child_plan*>(argument);
  int err = plan.error_pipe;
  // "0" moves the writer itself, in v1 and v2 alike.
  for (int fd : plan.cgroups)
    if (::write(fd, "0", 1) != 1) fail_child(err, step_cgroup);
  if (::setsid() < 0) fail_child(err, step_setsid);

  int last = first_extra_target + static_cast<int>(plan.extras.size());
  if (::dup2(plan.devnull, 0) < 0 || ::dup2(plan.log, 1) < 0 || ::dup2(plan.log, 2) < 0 ||
      ::dup2(plan.channel, channel_target) < 0)
    fail_child(err, step_fds);
  for (std::size_t i = 0; i < plan.extras.size(); ++i)
    if (::dup2(plan.extras[i], first_extra_target + static_cast<int>(i)) < 0) fail_child(err, step_fds);
  // The error pipe itself stays close-on-exec: a successful exec closes it.
  if (::dup3(err, last, O_CLOEXEC) < 0) fail_child(err, step_fds);
  err = last;
  if (::close_range(last + 1, ~0U, 0) < 0) {
    struct rlimit nofile {};
    ::getrlimit(RLIMIT_NOFILE, &nofile);
    for (rlim_t fd = last + 1; fd < nofile.rlim_cur && fd < (1u << 20); ++fd) ::close(static_cast<int>(fd));
  }

  if (plan.cwd && ::chdir(plan.cwd) < 0) fail_child(err, step_chdir);
  for (const auto& limit : plan.limits) {
    struct rlimit value {
      limit.soft, limit.hard
    };
    if (::setrlimit(limit.resource, &value) < 0) fail_child(err, step_rlimit);
  }
  if (plan.run_as) {
    if (::syscall(SYS_setgroups, 0, nullptr) < 0 ||
        ::syscall(SYS_setresgid, plan.run_as->gid, plan.run_as->gid, plan.run_as->gid) < 0 ||
        ::syscall(SYS_setresuid, plan.run_as->uid, plan.run_as->uid, plan.run_as->uid) < 0)
      fail_child(err, step_drop_ids);
  }
  // After the uid change, which clears it. The parent may have died before
  // the prctl: then nobody else would kill us.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != plan.parent) ::_exit(127);

  // Ignored signals survive exec; the agent starts from the defaults.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) ::sigaction(sig, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);

  ::execve(plan.argv[0], plan.argv.data(), plan.envp.data());
  fail_child(err, step_exec);
}

// The child's own stack while it shares the host's memory; the calling
// thread sleeps until the child's exec or exit (CLONE_VFORK), so one stack a
// spawn is enough. Unlike fork, nothing of the host's address space is
// copied: a fork of the host cost more CPU than the bwrap it started.
class child_stack {
 public:
  child_stack() {
    memory_ = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (memory_ == MAP_FAILED)
      throw sandbox_error(sandbox_errc::spawn_failed, fmt::format("child stack: {}", std::strerror(errno)));
  }
  ~child_stack() { ::munmap(memory_, size); }
  child_stack(const child_stack&) = delete;
  child_stack& operator=(const child_stack&) = delete;
  void* top() const { return static_cast<char*>(memory_) + size; }

 private:
  static constexpr std::size_t size = 256 * 1024;
  void* memory_;
};

// Per process: RLIMIT_FSIZE, RLIMIT_NOFILE; without a cgroup RLIMIT_AS and
// RLIMIT_NPROC stand in for its totals (a cgroup bounds the memory really
// used, where RLIMIT_AS would also count what a runtime only reserves: V8
// reserves more than 512 MiB of address space to start); and with a CPU
// limit RLIMIT_CPU as a backstop to the cgroup's total: SIGXCPU one second
// after it, SIGKILL one more second later.
std::vector<rlimit_setting> rlimits_for(const spawn_request& request) {
  const resource_limits& l = request.limits;
  std::vector<rlimit_setting> limits = {{RLIMIT_FSIZE, l.max_file_bytes, l.max_file_bytes},
                                        {RLIMIT_NOFILE, l.max_open_files, l.max_open_files},
                                        {RLIMIT_CORE, 0, 0}};
  if (request.join_cgroups.empty()) {
    limits.push_back({RLIMIT_AS, l.max_memory_bytes, l.max_memory_bytes});
    limits.push_back({RLIMIT_NPROC, l.max_processes, l.max_processes});
  }
  if (l.max_cpu_seconds > 0) limits.push_back({RLIMIT_CPU, l.max_cpu_seconds + 1, l.max_cpu_seconds + 2});
  return limits;
}

std::vector<char*> c_strings(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (const auto& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

}  // namespace

unique_fd open_pidfd(pid_t pid) { return unique_fd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0))); }

bool wait_pidfd(int pidfd, std::chrono::milliseconds timeout) {
  if (pidfd < 0) return true;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{pidfd, POLLIN, 0};
    int n = ::poll(&p, 1, static_cast<int>(std::max<long long>(0, left.count())));
    if (n > 0) return true;
    if (n == 0) return false;
    if (errno != EINTR) return true;
  }
}

spawned_child spawn_child(const spawn_request& request) {
  if (request.argv.empty() || request.log_fd < 0 || request.extra_fds.size() > max_extra_fds ||
      request.join_cgroups.size() > max_extra_fds)
    throw sandbox_error(sandbox_errc::spawn_failed, "spawn_child: invalid request");

  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) < 0)
    throw sandbox_error(sandbox_errc::spawn_failed, fmt::format("socketpair: {}", std::strerror(errno)));
  unique_fd parent_end(pair[0]), child_end(pair[1]);
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) < 0)
    throw sandbox_error(sandbox_errc::spawn_failed, fmt::format("pipe: {}", std::strerror(errno)));
  unique_fd error_read(pipe_fds[0]), error_write(pipe_fds[1]);
  unique_fd devnull(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!devnull)
    throw sandbox_error(sandbox_errc::spawn_failed, fmt::format("/dev/null: {}", std::strerror(errno)));

  std::vector<unique_fd> sources;
  auto high = [&](int fd) { return sources.emplace_back(dup_high(fd)).get(); };
  child_plan plan;
  plan.argv = c_strings(request.argv);
  plan.envp = c_strings(request.env);
  plan.cwd = request.cwd.empty() ? nullptr : request.cwd.c_str();
  plan.devnull = high(devnull.get());
  plan.log = high(request.log_fd);
  plan.channel = high(child_end.get());
  plan.error_pipe = high(error_write.get());
  for (int fd : request.extra_fds) plan.extras.push_back(high(fd));
  for (int fd : request.join_cgroups) plan.cgroups.push_back(high(fd));
  plan.limits = rlimits_for(request);
  plan.run_as = request.run_as;
  plan.parent = ::getpid();

  // No handler of the host may run in the child between clone and exec.
  child_stack stack;
  sigset_t all, previous;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &previous);
  pid_t pid = ::clone(run_child, stack.top(), shared_memory | SIGCHLD, &plan);
  int clone_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  if (pid < 0)
    throw sandbox_error(sandbox_errc::spawn_failed, fmt::format("clone: {}", std::strerror(clone_errno)));

  sources.clear();
  child_end.reset();
  error_write.reset();
  child_failure failure{};
  ssize_t n;
  do {
    n = ::read(error_read.get(), &failure, sizeof failure);
  } while (n < 0 && errno == EINTR);
  if (n > 0) {
    int status;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    const char* step = failure.step >= 0 && failure.step <= step_exec ? step_names[failure.step] : "set-up";
    std::string what = failure.step == step_exec ? fmt::format("exec {}", request.argv[0]) : step;
    throw sandbox_error(sandbox_errc::spawn_failed,
                        fmt::format("{}: {}", what, std::strerror(failure.error)));
  }

  spawned_child child;
  child.pid = pid;
  child.channel = std::move(parent_end);
  child.pidfd = open_pidfd(pid);
  return child;
}

}  // namespace cairn::runtime
