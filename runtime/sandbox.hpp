// The seam in front of every sandbox provider. The lifecycle every provider
// shares: create (prepare an isolated place for one run attempt), exec (start
// the agent program in it, with the channel as fd 3), destroy (kill and reap
// every process in it). runtime reports what happened (exit status, frames);
// it never decides about retries and never touches the journal.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/channel.hpp"

namespace cairn::runtime {

enum class sandbox_errc {
  bwrap_missing,    // bubblewrap is not installed
  userns_denied,    // the kernel refuses unprivileged user namespaces
  spawn_failed,     // fork/exec or the sandbox set-up failed
  bad_spec,         // the program or workspace cannot be used
  workspace_failed, // the workspace's quota image could not be made, mounted, filled or released
  workspace_busy,   // another live process has the workspace's image mounted: try again once it let go
};

class sandbox_error : public std::runtime_error {
 public:
  sandbox_error(sandbox_errc code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  sandbox_errc code() const { return code_; }

 private:
  sandbox_errc code_;
};

// What one sandbox may use in total. Totals are enforced with a cgroup per
// sandbox when the machine allows it (cgroup v2, or v1 memory/pids/cpuacct),
// else only per process with rlimits; see sandbox_backend::check().
struct resource_limits {
  std::uint64_t max_processes = 256;             // cgroup pids.max (threads count); RLIMIT_NPROC as a fallback
  std::uint64_t max_memory_bytes = 2ull << 30;   // cgroup memory limit, tmpfs included; RLIMIT_AS without a cgroup
  std::uint64_t max_file_bytes = 1ull << 30;     // RLIMIT_FSIZE
  std::uint64_t max_open_files = 256;            // RLIMIT_NOFILE
  // Total CPU time of the sandbox (cgroup), seen by check_limits(); RLIMIT_CPU
  // of one second more per process as a backstop. 0: unlimited.
  std::uint64_t max_cpu_seconds = 0;
  // Size of /workspace: an ext4 image when cairn runs as root (its size is
  // fixed when the run's first sandbox makes it); else files are bounded one
  // by one (RLIMIT_FSIZE) only. No image when the spec names none (the
  // engine names none for a policy's workspace_mb 0).
  std::uint64_t max_workspace_bytes = 1ull << 30;
  std::uint64_t max_tmp_bytes = 64ull << 20;     // size of /tmp and /dev/shm (tmpfs) each
  // What the run's log keeps of the agent's output, over all its attempts:
  // the newest part (see sandbox_spec::log_file).
  std::uint64_t max_log_bytes = 16ull << 20;
};

// A limit the sandbox ran into; the sandbox has been killed.
struct limit_breach {
  std::string limit;    // "memory", "processes", "cpu", "workspace", "file_size"
  // Names the limit and the policy key that raises it: "memory limit
  // exceeded: the sandbox reached its 256 MiB limit and the kernel killed a
  // process; raise limits.memory_mb"
  std::string message;
};

struct sandbox_spec {
  std::string run_id;
  std::filesystem::path workspace;  // host folder mounted at /workspace (created if missing)
  // Where the workspace's quota image lives (bwrap under root): a path no
  // workspace contains, e.g. CAIRN_HOME/images/RUN_ID.img.
  std::filesystem::path workspace_image;
  resource_limits limits;
  std::map<std::string, std::string> env;  // added to the minimal environment
  // A script agent's folder (see script_folder()): the sandbox sees it
  // read-only and runs the agent from it, so the script imports its own
  // modules. Empty for a compiled agent, which is given alone.
  std::filesystem::path app_folder;
  // Host paths the agent must never see through app_folder (CAIRN_HOME, the
  // journal): covered wherever they lie in it, or the folder is refused
  // (app_folder.hpp).
  std::vector<std::filesystem::path> private_paths;
  // The agent's stdout and stderr (and the sandbox tool's own errors) are
  // appended here, on the host, through a pipe the host reads (the agent
  // never holds this file); see output_log.hpp. Required.
  std::filesystem::path log_file;
  // The program and arguments the caller will exec() first, when known: a
  // warm pool that starts agents (warm_pool_options::start_agents) hands
  // over a sandbox whose agent is this one, started already.
  std::filesystem::path agent;
  std::vector<std::string> agent_args;
};

// The folder of a script agent (a program that starts with "#!"), for
// sandbox_spec::app_folder; empty for any other program. Throws
// sandbox_error(bad_spec) when the program is missing or not executable.
std::filesystem::path script_folder(const std::filesystem::path& program);

// Of the agent's process. Under bwrap the host only sees bwrap, which passes
// on an agent killed by signal N as exit code 128+N; such codes are reported
// as the signal, so an agent's own exit(134) reads as SIGABRT there.
struct exit_status {
  bool exited = false;  // true: exited with `code`; false: killed by `signal`
  int code = 0;
  int signal = 0;
  std::string describe() const;  // "exited with code 3", "killed by signal 6 (SIGABRT)"
  bool operator==(const exit_status&) const = default;
};

// One running agent program. Destroying the handle kills and reaps every
// process of the sandbox.
class agent_process {
 public:
  virtual ~agent_process() = default;
  virtual channel& io() = 0;
  virtual pid_t pid() const = 0;
  // Non-blocking: the exit status once the agent's process has ended. Then
  // whatever it left running in its process group is killed too.
  virtual std::optional<exit_status> poll_exit() = 0;
  // Kills every process in the sandbox (SIGKILL), reaps, returns the status.
  // Returns once none of them runs any more (it waits at most about 5 s for
  // one stuck in the kernel). Idempotent: later calls return the same status.
  virtual exit_status kill() = 0;
  // Waits up to `timeout` for a voluntary exit; nullopt if still running.
  virtual std::optional<exit_status> wait_for(std::chrono::milliseconds timeout) = 0;
  // The last `max_bytes` of this process's log output, for error messages.
  virtual std::string log_tail(std::size_t max_bytes = 2048) const = 0;
  // Whether the sandbox has run into one of its limits. Cheap enough to call
  // every few hundred milliseconds; on a breach the sandbox is killed first
  // (a CPU limit is only seen by asking). Also meaningful after it exited:
  // then it says why (e.g. killed by the OOM killer). Once found, the same
  // breach is returned on every later call. Seen: with a cgroup, the OOM
  // killer ("memory"), a fork refused at pids.max ("processes"), the CPU
  // total ("cpu"); with a quota image, a full workspace ("workspace"); and
  // the agent killed by SIGXFSZ ("file_size") or SIGXCPU ("cpu").
  virtual std::optional<limit_breach> check_limits() = 0;
};

class sandbox {
 public:
  virtual ~sandbox() = default;
  // Starts `program` (a host path, mounted read-only) with `args`. The agent
  // sees its channel as fd 3 and CAIRN_CHANNEL_FD=3 in its environment.
  // Throws sandbox_error: bad_spec (program missing or not executable, an
  // unusable env entry or log file), spawn_failed (fork/exec/set-up failed;
  // the message names the step and the errno). A bwrap that cannot build the
  // sandbox (user namespaces denied, ...) is not an exec error: the process
  // exits 1 soon and diagnose_bwrap_failure(log_tail()) explains why.
  // The agent is SIGKILLed when the thread that called exec exits
  // (PR_SET_PDEATHSIG follows the thread): call it from a thread that
  // outlives the run. The host must not set SIGCHLD to SIG_IGN.
  virtual std::unique_ptr<agent_process> exec(const std::filesystem::path& program,
                                              const std::vector<std::string>& args) = 0;
  // Kills whatever still runs in it, then gives back what it held: its
  // cgroup is removed and its workspace image unmounted; the plain
  // workspace folder is closed to other users (no_follow.hpp's
  // close_to_others). Idempotent; also done
  // by the destructor. A later exec() takes them again.
  virtual void destroy() = 0;
  // destroy(), by the attempt that ends its run: its workspace is also
  // released, as sandbox_backend::release_workspace does (which then has
  // nothing left to do), from the image this sandbox has mounted rather
  // than from one mounted again after destroy(). Throws sandbox_error as
  // release_workspace does; destroyed in any case.
  virtual void destroy_ending_run() { destroy(); }
  // What this sandbox cannot enforce on this machine, one sentence each with
  // the fix, for the run's log: "resource totals are per process only: ...",
  // "workspace ... has no size quota: ...", a kept image of another size.
  // Known from create() on; empty when every limit holds as asked.
  virtual std::vector<std::string> warnings() const = 0;
  // Whether it came ready from the warm pool (bwrap_options::warm), and
  // with its agent started already (warm_pool_options::start_agents).
  virtual bool pooled() const { return false; }
  virtual bool agent_started() const { return false; }
};

// What keeping a workspace's files between attempts has cost the host in
// this process so far: mounting and unmounting its quota image (all zero
// without one). Suspending a run costs one unmount and, at its resumption,
// one mount; no file is copied.
struct workspace_upkeep {
  std::uint64_t mounts = 0;
  std::uint64_t bytes_written = 0;  // through the loop device: at mount, and the flush before unmount
  std::chrono::nanoseconds cpu{0};  // of the host threads that mounted and unmounted
  std::chrono::nanoseconds wall{0};
};

// Can this machine run the backend? Each problem comes with its fix.
struct doctor_check {
  std::string name;
  bool ok = false;
  std::string detail;  // what was found
  std::string fix;     // how to fix it, when !ok
};

class sandbox_backend {
 public:
  virtual ~sandbox_backend() = default;
  virtual std::string name() const = 0;
  // Creates the workspace if missing (under root, hands it to the sandbox
  // uid). bwrap under root: the files live in the image spec.workspace_image,
  // mounted at the folder while a sandbox lives (files already in
  // the folder move into it), until release_workspace(). Throws
  // sandbox_error: bwrap_missing, bad_spec (no log file; the workspace
  // cannot be created or reached by the sandbox uid, another process uses
  // it, its files do not fit the quota), workspace_failed (its image exists
  // but cannot be mounted).
  virtual std::unique_ptr<sandbox> create(const sandbox_spec& spec) = 0;
  virtual std::vector<doctor_check> check() const = 0;
  // The run is over: leave its workspace as a plain host folder with the
  // files the run left (when a quota image held them, they are copied out,
  // links and holes kept, never more than the image held, and the image
  // removed), closed to other users as close_to_others() closes a folder
  // (no_follow.hpp). `image` is the spec's
  // workspace_image. Only once a run ends: a suspended run keeps its image.
  // Idempotent; safe after a crash at any point of it.
  virtual void release_workspace(const std::filesystem::path& workspace, const std::filesystem::path& image) = 0;
  // Cumulative; subtract two readings for the cost of what ran between them.
  virtual workspace_upkeep upkeep(const std::filesystem::path& workspace) const = 0;
  // The warm pool (bwrap_options::warm): waits up to `timeout` until
  // `count` sandboxes are ready; true if they are. False without a pool.
  virtual bool wait_warm(std::size_t /*count*/, std::chrono::milliseconds /*timeout*/) { return false; }
  // Why the pool could not make its last sandbox, if it could not.
  virtual std::optional<std::string> warm_error() const { return std::nullopt; }
};

// Sandboxes made ahead of the runs that will use them: namespaces, seccomp,
// cgroup and mounts ready, a launcher (the sandbox's first program) waiting
// for the agent. A run takes one at create(), its workspace joins it (as
// root, mounted over the sandbox's /workspace; otherwise only for a new
// run's empty workspace, whose folder the pooled one becomes) and the
// launcher becomes the agent; the pool makes a replacement in the
// background. A pooled sandbox serves one attempt and is destroyed with it:
// nothing of one run is ever seen by another. A run whose limits differ
// from the pool's, or whose workspace cannot join, starts cold.
struct warm_pool_options {
  std::size_t size = 0;  // sandboxes kept ready; 0: no pool
  // Holds the pooled sandboxes' /workspace folders (one each, removed with
  // it); must be enterable by the sandbox uid, like workspaces. Required
  // when size > 0.
  std::filesystem::path folder;
  resource_limits limits;  // every pooled sandbox is made with these
  // Each pooled sandbox also starts the agent of the last run that could
  // take one (sandbox_spec::agent; a new run, whose workspace is new and
  // empty and, with a quota, has no image yet), and that agent's next runs
  // take a sandbox whose agent is running: they skip its start (exec,
  // loading, imports). Such an agent is started before its run exists: its
  // run id reaches it in `start` only, not in CAIRN_RUN_ID. Runs of another
  // agent take a sandbox without one, or start cold; a program changed on
  // disk since is not served from the pool.
  bool start_agents = false;
  // An agent that would not start ahead (it ended, or said nothing for
  // 30 s, in its pooled sandbox: broken, or a machine under load) is asked
  // for again after this pause, and after twice as long each time it is
  // refused again in a row, up to an hour; meanwhile its runs take a
  // launcher or start cold. A changed program is tried at once.
  std::chrono::milliseconds refused_agent_pause{std::chrono::minutes(1)};
};

struct bwrap_options {
  std::filesystem::path bwrap = "bwrap";  // looked up on PATH when relative
  // When cairn runs as root, the sandbox runs under this unprivileged uid/gid.
  uid_t sandbox_uid = 0;  // 0: take it from the environment/default, see bwrap_backend.cpp
  std::size_t max_frame = 0;  // 0: protocol default
  warm_pool_options warm;
};

// Namespaces + read-only system + private /workspace and /tmp + no network.
std::unique_ptr<sandbox_backend> make_bwrap_backend(bwrap_options options = {});

// The unprivileged identity bwrap sandboxes run under when cairn runs as root.
// Never kernel root: measured, a sandbox that root starts with every
// namespace and no capabilities can still write host sysctls in /proc/sys.
struct sandbox_user {
  uid_t uid = 0;
  gid_t gid = 0;
  // Where it came from: "bwrap_options", "CAIRN_SANDBOX_UID",
  // "user cairn-sandbox" or "default".
  std::string source;
};
// In order: options.sandbox_uid if nonzero, the env var CAIRN_SANDBOX_UID,
// the user "cairn-sandbox", else 61000; the gid equals the uid except for
// "cairn-sandbox", whose primary group is used. nullopt when cairn does not
// run as root: the sandbox then runs as the calling user. Throws
// sandbox_error(bad_spec) when CAIRN_SANDBOX_UID is not a nonzero uid.
std::optional<sandbox_user> resolve_sandbox_user(const bwrap_options& options = {});

// The bwrap command line of a run's sandbox with `limits`, but running
// `program` (bound where the agent is): the same namespaces and mounts, the
// workspace `workspace`, none of the run's environment, seccomp filter,
// cgroup or channel. As root the caller drops to resolve_sandbox_user()
// before it runs it. For benchmarks that time a raw bwrap beside cairn's
// sandboxes. Throws sandbox_error(bwrap_missing).
std::vector<std::string> bwrap_command(const std::filesystem::path& workspace, const std::filesystem::path& program,
                                       const resource_limits& limits, const bwrap_options& options = {});

// Kills cairn sandboxes whose bwrap died before it let them start. Right
// after clone, bwrap's child waits for its parent before it arms
// --die-with-parent; if the host is killed in that window, the child waits
// forever as pid 1 of an empty namespace. Returns how many were killed, once
// they are gone. Every bwrap backend calls it on its first create().
std::size_t kill_orphaned_sandboxes();

// Turns bwrap's own error messages, found in an agent's log (see
// agent_process::log_tail) after it exited early, into the cause and its fix,
// e.g. "user namespaces are denied by the kernel: run `sysctl -w ...`".
// nullopt when the log holds nothing bwrap-specific.
std::optional<std::string> diagnose_bwrap_failure(const std::string& log_tail);
// A plain child process: no isolation. Only when the user asks for it.
std::unique_ptr<sandbox_backend> make_process_backend(std::size_t max_frame = 0);

}  // namespace cairn::runtime
