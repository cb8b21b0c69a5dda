// The warm pool behind bwrap_options::warm (sandbox.hpp): sandboxes made in
// the background until `size` are ready, each handed out once. Internal to
// runtime/.
//
// A pooled sandbox's /workspace is a folder of its own under the pool's
// folder. As root that folder is a shared mount of itself, so a workspace
// the host later mounts onto it appears inside the sandbox (which holds it
// as a slave: nothing propagates back); otherwise it is a plain folder that
// a new run's empty workspace is replaced by (a rename keeps the sandbox's
// bind). Each folder is written down (own_records.hpp) before it is made,
// so a later host sweeps what a killed one left: its mounts, the folder.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/cgroup.hpp"
#include "runtime/child_process.hpp"
#include "runtime/loop_mount.hpp"
#include "runtime/own_records.hpp"
#include "runtime/sandbox.hpp"
#include "runtime/unique_fd.hpp"

namespace cairn::runtime {

// The folder a pooled sandbox binds at /workspace, made on construction and
// unmounted and removed on destruction (unless given away).
class warm_folder {
 public:
  // `shared_mount`: as root, the folder becomes a shared mount of its own.
  // Throws sandbox_error(spawn_failed).
  warm_folder(std::filesystem::path path, bool shared_mount);
  ~warm_folder();
  warm_folder(const warm_folder&) = delete;
  warm_folder& operator=(const warm_folder&) = delete;

  const std::filesystem::path& path() const { return path_; }
  bool shared_mount() const { return shared_mount_; }
  // Mounts `workspace` (a canonical folder, or the mount of its image) onto
  // the folder: the sandbox's /workspace shows it. Throws sandbox_error(spawn_failed).
  void show(const std::filesystem::path& workspace);
  // Puts the (plain) folder in the place of `workspace`, which is not there
  // yet or is an empty folder (that one takes the folder's place until this
  // object goes): the sandbox's /workspace is now the run's. False when that
  // is refused (another filesystem, the workspace not empty or not a
  // folder); nothing changed. Throws sandbox_error(spawn_failed) if it
  // cannot be undone.
  bool become(const std::filesystem::path& workspace);
  // The run's log at `log_file`, when it has none yet: the empty log made
  // with the folder (FOLDER.log), moved there and open for appending, as
  // open_log opens one. Else (a log from an earlier attempt, another
  // filesystem) an empty descriptor, and the caller opens the run's own.
  unique_fd give_log(const std::filesystem::path& log_file);

 private:
  std::filesystem::path path_;
  std::filesystem::path log_path_;  // empty once given
  unique_fd log_;
  bool shared_mount_;
  bool kept_ = false;  // holds what a workspace held, which could not be put back
  std::unique_ptr<own_record> record_;
};

// An agent a pooled sandbox runs already, as a run must ask for it to take
// that sandbox: the program, when and how it was last changed (`stamp`:
// a program rebuilt since is not this one), and its whole environment.
struct warm_agent {
  std::filesystem::path program;  // canonical
  std::vector<std::string> args;
  std::filesystem::path app_folder;  // a script's; empty for a binary
  std::vector<std::filesystem::path> private_paths;  // sandbox_spec::private_paths
  std::string stamp;
  std::map<std::string, std::string> env;
  bool operator==(const warm_agent&) const = default;
};

// One sandbox of the pool: bwrap has built it and its launcher waits on the
// channel, or (`agent`) that agent is running and has spoken on it.
// Destroying it unused kills and reaps it, then its folder goes.
struct warm_sandbox {
  std::shared_ptr<const warm_agent> agent;  // null: a launcher waits for one
  std::shared_ptr<child_handle> handle;
  unique_fd channel;  // the host's end
  std::shared_ptr<sandbox_cgroup> cgroup;
  // The read end of bwrap's and the launcher's own stdout and stderr (their
  // errors, before the launch gives the agent the run's log); with `agent`,
  // the agent's own, which the run's log takes.
  unique_fd own_output;
  std::unique_ptr<warm_folder> folder;
  // As root with a quota: an image made ahead (FOLDER.img), mounted at the
  // folder; a run that has no image yet takes it as its own (give_away).
  std::optional<loop_mount> image;
  std::filesystem::path image_path;  // empty once a run took it
  // The pool's, for a sandbox whose agent waits: when it was ready, and
  // the CPU time its processes had used by then.
  std::chrono::steady_clock::time_point ready_at{};
  std::chrono::nanoseconds cpu_at_ready{0};

  ~warm_sandbox();
  // Hands the launcher the agent: `program` (open for reading and
  // executable by the sandbox uid), `log_writer` as its stdout and stderr,
  // its argv and environment ("NAME=value"). Then the agent owns the channel.
  // Throws sandbox_error(spawn_failed) when the launcher cannot be told.
  void launch(int program, int log_writer, const std::vector<std::string>& argv,
              const std::vector<std::string>& env);
};

class warm_pool {
 public:
  // Makes a sandbox running `agent`, or (null) one whose launcher waits.
  using maker = std::function<std::unique_ptr<warm_sandbox>(std::shared_ptr<const warm_agent> agent)>;
  // Starts filling at once, on threads of its own (the pooled sandboxes
  // die with the thread that made them: see sandbox::exec). With
  // `start_agents`, the sandboxes it makes run the agent last asked for;
  // one whose making failed is asked for again after `refused_pause`
  // (warm_pool_options::refused_agent_pause).
  warm_pool(std::size_t size, maker make, bool start_agents = false,
            std::chrono::milliseconds refused_pause = std::chrono::minutes(1));
  // Stops filling; the sandboxes still pooled are destroyed.
  ~warm_pool();
  warm_pool(const warm_pool&) = delete;
  warm_pool& operator=(const warm_pool&) = delete;

  // A ready sandbox running `agent` or, when `launcher_will_do`, else one
  // whose launcher waits; null when none is. A replacement is made (while
  // others are still ready, from refill_delay on: making one would compete
  // for the CPU with the start of the run that took this one). With
  // start_agents, `agent` is what the pool starts from now on: the
  // sandboxes running another are destroyed and replaced, and so are those
  // whose launcher waits, but for a quarter of the pool (size / 4), kept
  // for the runs that cannot take a started agent.
  std::unique_ptr<warm_sandbox> take(const std::shared_ptr<const warm_agent>& agent, bool launcher_will_do);
  static constexpr std::chrono::milliseconds refill_delay{20};
  // Waits until `count` are ready (of what the pool makes now) or
  // `timeout` passes; true if they are.
  bool wait_ready(std::size_t count, std::chrono::milliseconds timeout);
  // Why the last attempt to make one failed (pooling pauses, then tries
  // again), or why the agent last refused is not started ahead, if so.
  std::optional<std::string> last_error() const;

  // An agent started ahead runs before its run exists, with nobody to
  // charge: once it has said hello it waits for its start and uses no CPU.
  // Its sandbox's processes (its cgroup's total, else what /proc shows
  // under its bwrap) may use idle_cpu_allowance and idle_cpu_percent of one
  // CPU while it waits; one that uses more (a busy loop it forked, say) is
  // ended within about idle_check_interval, and its agent refused as one
  // that did not start is (refused_pause, longer each time in a row).
  static constexpr std::chrono::milliseconds idle_cpu_allowance{200};
  static constexpr int idle_cpu_percent = 5;
  static constexpr std::chrono::seconds idle_check_interval{1};

 private:
  void fill();
  // Under mutex_, which `lock` holds (and releases while the sandboxes
  // ended go): ends the waiting agents that used more CPU than they may.
  void end_busy_agents(std::unique_lock<std::mutex>& lock);
  // Under mutex_: `agent` is not started ahead again until its pause is
  // over; returns that pause.
  std::chrono::milliseconds refuse_locked(const std::shared_ptr<const warm_agent>& agent);
  // Under mutex_: how many sandboxes whose launcher waits the pool keeps
  // (all, until an agent is asked for); the first ready one the pool
  // destroys rather than keeps, or end().
  std::size_t launchers_kept() const;
  std::deque<std::unique_ptr<warm_sandbox>>::iterator stale();

  std::size_t size_;
  maker make_;
  bool start_agents_;
  std::shared_ptr<const warm_agent> wanted_;   // what the sandboxes made next run
  // An agent that did not start: not asked for again until refused_until_.
  std::shared_ptr<const warm_agent> refused_;
  std::chrono::steady_clock::time_point refused_until_{};
  int refusals_ = 0;  // of refused_, in a row
  std::chrono::milliseconds refused_pause_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::unique_ptr<warm_sandbox>> ready_;
  std::size_t making_ = 0;
  std::size_t making_launchers_ = 0;  // of making_
  std::chrono::steady_clock::time_point last_take_{};
  bool stopping_ = false;
  std::optional<std::string> last_error_;
  // When the waiting agents' CPU is looked at next; max() while none waits.
  std::chrono::steady_clock::time_point next_idle_check_ = std::chrono::steady_clock::time_point::max();
  std::vector<std::thread> threads_;
};

// Unmounts and removes the pooled folders that dead hosts left; returns how many.
std::size_t sweep_orphaned_warm_folders();

}  // namespace cairn::runtime
