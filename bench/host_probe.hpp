// What the daemon benchmarks (concurrency, suspended, throughput, live_runs) need from the host: start
// and stop `cairn` processes, read a process tree's memory and CPU from /proc,
// measure disk use, and time the raw operation a run is built on: a bwrap
// sandbox running /usr/bin/true, with the same flags as bench/sandbox_start.
#pragma once

#include <fcntl.h>
#include <grp.h>
#include <linux/perf_event.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine/liveness.hpp"
#include "engine/engine.hpp"
#include "runtime/sandbox.hpp"
#include "storage/journal.hpp"

namespace bench {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

inline double ms_since(clock_type::time_point t0) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

// The `cairn serve` a benchmark runs now (0: none), stopped by die().
inline pid_t running_daemon = 0;

[[noreturn]] inline void die(const std::string& message) {
  std::fprintf(stderr, "bench: %s\n", message.c_str());
  if (running_daemon > 0 && kill(running_daemon, SIGTERM) == 0) waitpid(running_daemon, nullptr, 0);
  std::exit(1);
}

// CPU time of a process tree by the kernel's task clock: the task it is
// opened on and every thread and process started from it afterwards, however
// deep and whoever reaps them. getrusage(RUSAGE_CHILDREN) and /proc's cutime
// count only the children a process reaped, and bwrap exits with the status
// its sandbox's pid 1 reports without waiting for that pid 1: the pid 1 and
// the program it ran are reaped by init, and their CPU (about half of a raw
// `bwrap true` here) was never counted.
class tree_cpu {
 public:
  // Counts `pid` (0: the calling thread) from now on; nullopt when the kernel
  // refuses (kernel.perf_event_paranoid above 1 for a user without CAP_PERFMON).
  static std::optional<tree_cpu> open(pid_t pid = 0) {
    perf_event_attr attr{};
    attr.size = sizeof attr;
    attr.type = PERF_TYPE_SOFTWARE;
    attr.config = PERF_COUNT_SW_TASK_CLOCK;
    attr.inherit = 1;
    const long fd = ::syscall(SYS_perf_event_open, &attr, pid, -1, -1, PERF_FLAG_FD_CLOEXEC);
    if (fd < 0) return std::nullopt;
    return tree_cpu(static_cast<int>(fd));
  }
  tree_cpu(tree_cpu&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  tree_cpu(const tree_cpu&) = delete;
  tree_cpu& operator=(const tree_cpu&) = delete;
  ~tree_cpu() {
    if (fd_ >= 0) ::close(fd_);
  }
  double seconds() const {
    std::uint64_t ns = 0;
    if (::read(fd_, &ns, sizeof ns) != static_cast<ssize_t>(sizeof ns)) die("cannot read a task-clock counter");
    return static_cast<double>(ns) / 1e9;
  }

 private:
  explicit tree_cpu(int fd) : fd_(fd) {}
  int fd_ = -1;
};

// What a benchmark prints when it has to count CPU without tree_cpu.
inline constexpr const char* rusage_caveat =
    "CPU counted from getrusage (perf_event_open refused: run as root, or set kernel.perf_event_paranoid=1): "
    "each sandbox's pid 1 and its program are not counted";

struct started_process {
  pid_t pid = 0;
  std::optional<tree_cpu> cpu;  // the process and all it starts; nullopt: see rusage_caveat
  double cpu_seconds() const;
};

// Starts `argv` with CAIRN_HOME=home, stdout and stderr appended to `log`;
// it gets SIGTERM if the benchmark dies first. Its CPU is counted (with
// everything it starts) from before its exec.
inline started_process start_counted_process(const std::vector<std::string>& argv, const fs::path& home,
                                             const fs::path& log, bool counted = true) {
  int gate[2];
  if (::pipe2(gate, O_CLOEXEC) != 0) die("pipe failed");
  pid_t pid = fork();
  if (pid < 0) die("fork failed");
  if (pid == 0) {
    char go = 0;
    while (::read(gate[0], &go, 1) < 0 && errno == EINTR) {
    }
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0) _exit(126);
    setenv("CAIRN_HOME", home.c_str(), 1);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  ::close(gate[0]);
  started_process started{pid, counted ? tree_cpu::open(pid) : std::nullopt};
  if (::write(gate[1], "g", 1) != 1) die("cannot start " + argv[0]);
  ::close(gate[1]);
  return started;
}

inline pid_t start_process(const std::vector<std::string>& argv, const fs::path& home, const fs::path& log) {
  return start_counted_process(argv, home, log, false).pid;
}

// Waits for `pid`; its exit code, or 128 + the signal that killed it.
inline int wait_exit(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Sends `pid` SIGTERM and waits for it; after `grace` SIGKILL. Its exit
// code, or 128 + the signal that ended it.
inline int stop_process(pid_t pid, std::chrono::seconds grace) {
  kill(pid, SIGTERM);
  const auto t0 = clock_type::now();
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (clock_type::now() - t0 > grace) {
      kill(pid, SIGKILL);
      return wait_exit(pid);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

inline int run_process(const std::vector<std::string>& argv, const fs::path& home, const fs::path& log) {
  return wait_exit(start_process(argv, home, log));
}

// The whole of a file; "" when it cannot be read (e.g. the process of a /proc file is gone).
// Plain read(2): an ifstream throws when a process exits while it reads.
inline std::string read_whole_file(const std::string& path) {
  std::string text;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return text;
  char buf[8192];
  for (;;) {
    ssize_t got = ::read(fd, buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    text.append(buf, static_cast<std::size_t>(got));
  }
  ::close(fd);
  return text;
}

// Waits until the `cairn serve` at `daemon` has created the journal `db` and
// holds a lease in it, then a little longer for it to start its threads (so that its
// RSS reads as idle). Dies if it exits or takes over 20 s.
inline void wait_for_daemon(pid_t daemon, const fs::path& db, const fs::path& log) {
  auto t0 = clock_type::now();
  const auto serving = [&] {
    if (!fs::exists(db)) return false;
    try {
      auto journal = cairn::storage::open_journal(db, {.read_only = true});
      return cairn::engine::worker_leases(*journal).any_alive();
    } catch (const cairn::storage::storage_error&) {
      return false;  // not migrated yet
    }
  };
  while (!serving()) {
    int status = 0;
    if (waitpid(daemon, &status, WNOHANG) == daemon) die("cairn serve exited; see " + log.string());
    if (ms_since(t0) > 20'000) die("cairn serve did not start within 20 s; see " + log.string());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
}

// The number after `prefix` on the first line of the /proc file `path` that
// starts with it ("VmRSS:" in /proc/PID/status, "Max open files" in
// /proc/PID/limits); -1 when the file (or its process) is gone.
inline long proc_file_field(const std::string& path, const std::string& prefix) {
  std::istringstream in(read_whole_file(path));
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(prefix, 0) == 0) return std::atol(line.c_str() + prefix.size());
  return -1;
}

// A field of /proc/PID/status in kB ("VmRSS", "VmHWM"), or the count for
// "Threads"; -1 when the process is gone.
inline long status_field(pid_t pid, const std::string& name) {
  return proc_file_field("/proc/" + std::to_string(pid) + "/status", name + ":");
}

// Proportional set size in kB (shared pages split among their users); -1 if unknown.
inline long pss_kb(pid_t pid) { return proc_file_field("/proc/" + std::to_string(pid) + "/smaps_rollup", "Pss:"); }

struct proc_stat {
  pid_t ppid = 0;
  std::string comm;
  long long cpu_ticks = 0;        // utime + stime
  long long child_cpu_ticks = 0;  // cutime + cstime: its reaped children's
};

inline std::optional<proc_stat> read_stat(pid_t pid) {
  const std::string text = read_whole_file("/proc/" + std::to_string(pid) + "/stat");
  auto open = text.find('('), close = text.rfind(')');
  if (open == std::string::npos || close == std::string::npos) return std::nullopt;
  proc_stat s;
  s.comm = text.substr(open + 1, close - open - 1);
  std::istringstream rest(text.substr(close + 2));
  std::string state;
  long long field = 0;
  rest >> state >> s.ppid;
  // Fields 5..13 (pgrp .. majflt, cmajflt), then 14 utime and 15 stime.
  for (int i = 5; i <= 13; ++i) rest >> field;
  long long utime = 0, stime = 0, cutime = 0, cstime = 0;
  rest >> utime >> stime >> cutime >> cstime;
  s.cpu_ticks = utime + stime;
  s.child_cpu_ticks = cutime + cstime;
  return s;
}

inline double ticks_to_seconds(long long ticks) {
  return static_cast<double>(ticks) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// CPU time of the process itself, or with its reaped children.
inline double cpu_seconds(pid_t pid, bool with_children = false) {
  auto s = read_stat(pid);
  if (!s) return 0;
  return ticks_to_seconds(s->cpu_ticks + (with_children ? s->child_cpu_ticks : 0));
}

inline double started_process::cpu_seconds() const { return cpu ? cpu->seconds() : bench::cpu_seconds(pid, true); }

// CPU time of this process's reaped children.
inline double own_children_seconds() {
  struct rusage ru {};
  getrusage(RUSAGE_CHILDREN, &ru);
  auto secs = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6; };
  return secs(ru.ru_utime) + secs(ru.ru_stime);
}

// Every process on the host, pid -> its stat.
inline std::map<pid_t, proc_stat> all_processes() {
  std::map<pid_t, proc_stat> procs;
  std::error_code ec;
  for (auto it = fs::directory_iterator("/proc", ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    pid_t pid = std::atoi(name.c_str());
    if (auto s = read_stat(pid)) procs[pid] = *s;
  }
  return procs;
}

// CPU time of the kernel's threads (children of kthreadd: kworkers, loop
// devices, RCU, softirq): work a sandbox causes outside any process. Unlike
// the host's total busy time, it leaves out unrelated processes.
inline double kernel_threads_seconds() {
  long long ticks = 0;
  for (const auto& [pid, s] : all_processes())
    if (pid == 2 || s.ppid == 2) ticks += s.cpu_ticks;
  return ticks_to_seconds(ticks);
}

// Children of `parent` whose command is `comm` ("bwrap": one per live sandbox of a daemon).
inline int children_named(pid_t parent, const std::string& comm) {
  int n = 0;
  for (const auto& [pid, s] : all_processes()) n += s.ppid == parent && s.comm == comm;
  return n;
}

// Descriptors `pid` has open; -1 when the process is gone.
inline long open_fds(pid_t pid) {
  std::error_code ec;
  long n = 0;
  for (auto it = fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
       !ec && it != fs::directory_iterator(); it.increment(ec))
    ++n;
  return ec ? -1 : n;
}

// The process tree under `root` (children, their children, ...), root excluded.
struct process_tree {
  std::vector<pid_t> descendants;
  int sandboxes = 0;  // children named bwrap: one per live sandbox
  long rss_kb = 0, pss_kb = 0;
};

inline process_tree tree_of(pid_t root) {
  auto procs = all_processes();
  process_tree tree;
  std::vector<pid_t> frontier{root};
  while (!frontier.empty()) {
    pid_t parent = frontier.back();
    frontier.pop_back();
    for (const auto& [pid, s] : procs) {
      if (s.ppid != parent) continue;
      if (parent == root && s.comm == "bwrap") ++tree.sandboxes;
      tree.descendants.push_back(pid);
      frontier.push_back(pid);
    }
  }
  for (pid_t pid : tree.descendants) {
    tree.rss_kb += std::max(0L, status_field(pid, "VmRSS"));
    tree.pss_kb += std::max(0L, pss_kb(pid));
  }
  return tree;
}

struct disk_use {
  std::uintmax_t allocated = 0, apparent = 0, files = 0, folders = 0;
};

// Allocated blocks and apparent size of the files and folders under `dir`
// (sparse files count what they hold).
inline disk_use disk_use_of(const fs::path& dir) {
  disk_use use;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    struct stat st {};
    if (::lstat(it->path().c_str(), &st) != 0 || !(S_ISREG(st.st_mode) || S_ISDIR(st.st_mode))) continue;
    use.allocated += static_cast<std::uintmax_t>(st.st_blocks) * 512;
    use.apparent += static_cast<std::uintmax_t>(st.st_size);
    ++(S_ISDIR(st.st_mode) ? use.folders : use.files);
  }
  return use;
}

// Mounts (the workspaces' loop-mounted images) under `dir`.
inline int mounts_under(const fs::path& dir) {
  std::istringstream in(read_whole_file("/proc/self/mounts"));
  std::string device, point, rest;
  int n = 0;
  while (in >> device >> point && std::getline(in, rest))
    if (point.rfind(dir.string(), 0) == 0) ++n;
  return n;
}

// Lines of a `cairn serve` log that report a warning or an execution error.
inline std::vector<std::string> serve_warnings(const fs::path& log) {
  std::istringstream in(read_whole_file(log.string()));
  std::vector<std::string> found;
  std::string line;
  while (std::getline(in, line))
    if (line.find("warning:") != std::string::npos || line.find("not executed:") != std::string::npos)
      found.push_back(line);
  return found;
}

inline double mib(double kb) { return kb / 1024.0; }

// The machine a figure was measured on: "2 cores (MODEL), 23.5 GiB RAM, Linux 6.1.0".
inline std::string machine() {
  std::istringstream cpuinfo(read_whole_file("/proc/cpuinfo"));
  std::string line, model = "unknown CPU";
  while (std::getline(cpuinfo, line))
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  struct utsname u {};
  ::uname(&u);
  char text[512];
  std::snprintf(text, sizeof text, "%ld cores (%s), %.1f GiB RAM, Linux %s", sysconf(_SC_NPROCESSORS_ONLN),
                model.c_str(),
                static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1 << 30),
                u.release);
  return text;
}

// Submits `count` runs of `agent` with `input` into the journal of
// CAIRN_HOME `home` in-process (engine::submit, what `cairn submit` does);
// returns their ids, PREFIX-0, PREFIX-1, ...
inline std::vector<std::string> submit_runs(const fs::path& home, const std::string& prefix, int count,
                                            const fs::path& agent, const nlohmann::json& input) {
  auto journal = cairn::storage::open_journal(home / "cairn.db");
  cairn::engine::engine_options options;
  options.home = home;
  cairn::engine::engine eng(*journal, options);
  std::vector<std::string> ids;
  for (int i = 0; i < count; ++i) {
    cairn::engine::run_request request;
    request.id = prefix + "-" + std::to_string(i);
    request.agent = agent;
    request.input = input;
    eng.submit(request);
    ids.push_back(request.id);
  }
  return ids;
}

// How the runs of a journal ended, once none is pending, running or waiting
// (or the wait's limit passed).
struct runs_ended {
  double ms = 0;  // from the caller's t0 until the last one ended (or the limit passed)
  int completed = 0, other = 0;  // other: failed, cancelled or in doubt
  bool timed_out = false;
};

// Polls the journal `db` (every 10 ms) until `count` runs have ended, or,
// with `stop_at_first_failure`, until one ends otherwise than completed, or
// until `limit_ms` has passed; says how many have ended every 30 s. Dies
// when `daemon` exits first.
inline runs_ended wait_runs_ended(const fs::path& db, int count, pid_t daemon, clock_type::time_point t0,
                                  double limit_ms, const fs::path& log, bool stop_at_first_failure) {
  using cairn::storage::run_status;
  auto journal = cairn::storage::open_journal(db, {.read_only = true});
  double reported_ms = 0;
  for (;;) {
    auto counts = journal->count_by_status();
    runs_ended r{ms_since(t0), counts[run_status::completed],
                 counts[run_status::failed] + counts[run_status::cancelled] + counts[run_status::in_doubt]};
    if (r.completed + r.other == count || (stop_at_first_failure && r.other > 0)) return r;
    r.timed_out = r.ms > limit_ms;
    if (r.timed_out) return r;
    int status = 0;
    if (waitpid(daemon, &status, WNOHANG) == daemon) {
      running_daemon = 0;
      die("cairn serve exited before the runs ended; see " + log.string());
    }
    if (r.ms - reported_ms > 30'000) {
      reported_ms = r.ms;
      std::fprintf(stderr, "  %.0f s: %d of %d runs completed, %d ended otherwise\n", r.ms / 1000, r.completed,
                   count, r.other);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// Waits (from `t0`, at most `limit`) until the `n` runs of the journal `db`
// have completed; dies, naming the daemon's `log`, when one failed, was
// cancelled or is in doubt.
inline void wait_all_completed(const fs::path& db, int n, clock_type::time_point t0, std::chrono::seconds limit,
                               const fs::path& log) {
  auto journal = cairn::storage::open_journal(db, {.read_only = true});
  for (;;) {
    auto counts = journal->count_by_status();
    if (counts[cairn::storage::run_status::completed] == n) return;
    if (counts[cairn::storage::run_status::failed] + counts[cairn::storage::run_status::cancelled] +
            counts[cairn::storage::run_status::in_doubt] >
        0)
      die("a run did not complete; see " + log.string() + " and `cairn ls` with CAIRN_HOME=" +
          db.parent_path().string());
    if (ms_since(t0) > 1000.0 * static_cast<double>(limit.count()))
      die("runs not completed after " + std::to_string(limit.count()) + " s; see " + log.string());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// A raw operation: a program spawned and reaped as the sandbox uid, `count`
// times with up to `concurrency` at once; each start's latency in ms and, in
// `wall_ms`, the whole batch's. It reaps any child: call it while the caller
// has no other child process.
struct raw_starts {
  std::vector<double> ms;
  double wall_ms = 0;
  double cpu_ms = 0;  // per start: CPU of the starts (see tree_cpu) and of kernel threads over the batch
  double per_second() const { return wall_ms > 0 ? 1000.0 * static_cast<double>(ms.size()) / wall_ms : 0; }
};

inline raw_starts raw_spawns(std::vector<std::string> args, int count, int concurrency) {
  auto user = cairn::runtime::resolve_sandbox_user();
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  raw_starts out;
  std::map<pid_t, clock_type::time_point> live;
  auto reap_one = [&] {
    int status = 0;
    pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) die("waitpid failed");
    auto it = live.find(pid);
    if (it == live.end()) return;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) die(args[0] + " failed, status " + std::to_string(status));
    out.ms.push_back(ms_since(it->second));
    live.erase(it);
  };
  auto t0 = clock_type::now();
  // This thread (its forks and waits) and the starts it forks; without the
  // counter, the starts' reaped processes only.
  const auto tree = tree_cpu::open();
  const auto cpu_now = [&] { return (tree ? tree->seconds() : own_children_seconds()) + kernel_threads_seconds(); };
  const double cpu0 = cpu_now();
  for (int i = 0; i < count; ++i) {
    while (static_cast<int>(live.size()) >= concurrency) reap_one();
    auto start = clock_type::now();
    pid_t pid = fork();
    if (pid == 0) {
      if (user && (setgroups(0, nullptr) != 0 || setresgid(user->gid, user->gid, user->gid) != 0 ||
                   setresuid(user->uid, user->uid, user->uid) != 0))
        _exit(126);
      execv(argv[0], argv.data());
      _exit(127);
    }
    live[pid] = start;
  }
  while (!live.empty()) reap_one();
  out.wall_ms = ms_since(t0);
  out.cpu_ms = 1000.0 * (cpu_now() - cpu0) / count;
  return out;
}

// The raw sandbox: `bwrap <a run's isolation flags and mounts> /usr/bin/true`,
// the workspace `ws`.
inline raw_starts raw_bwrap(const fs::path& ws, int count, int concurrency) {
  fs::create_directories(ws);
  if (cairn::runtime::resolve_sandbox_user()) fs::permissions(ws, fs::perms::all);
  return raw_spawns(cairn::runtime::bwrap_command(ws, "/usr/bin/true", cairn::engine::default_policy().limits), count,
                    concurrency);
}

// The machine's floor under any sandbox: one fork and exec of /usr/bin/true,
// no namespace, no mount. A raw sandbox is three processes: bwrap, its pid 1
// and the program.
inline raw_starts raw_exec(int count, int concurrency) { return raw_spawns({"/usr/bin/true"}, count, concurrency); }

}  // namespace bench
