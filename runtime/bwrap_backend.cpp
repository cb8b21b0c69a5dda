// The default backend: every run attempt in its own bubblewrap sandbox.
// Per exec, bwrap reads its options from a memfd (--args, so host paths and
// env values stay off every command line) and reports the host pid of the
// sandbox's pid 1 on an info pipe (--info-fd); holding a pidfd of that pid 1
// is what lets kill() wait until the whole pid namespace is gone. Besides its
// processes a sandbox holds a cgroup and its workspace image's mount
// (sandbox_resources.hpp); bwrap itself starts inside the cgroup.
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <atomic>
#include <mutex>
#include <tuple>

#include <fmt/format.h>

#include "runtime/agent_sdks.hpp"
#include "runtime/app_folder.hpp"
#include "runtime/bwrap_support.hpp"
#include "runtime/child_process.hpp"
#include "runtime/host_paths.hpp"
#include "runtime/no_follow.hpp"
#include "runtime/sandbox_resources.hpp"
#include "runtime/seccomp_filter.hpp"
#include "runtime/warm/launch.hpp"
#include "runtime/warm/launcher_image.hpp"
#include "runtime/warm_pool.hpp"
#include "runtime/workspace_quota.hpp"
#include "runtime/workspace_template.hpp"

namespace cairn::runtime {

std::vector<doctor_check> bwrap_checks(const bwrap_options& options);  // bwrap_doctor.cpp

namespace {


namespace fs = std::filesystem;
// Whether `file` lives on the filesystem of the open folder `folder`.
bool same_filesystem(const fs::path& file, const unique_fd& folder) {
  struct stat a {}, b {};
  return ::stat(file.c_str(), &a) == 0 && ::fstat(folder.get(), &b) == 0 && a.st_dev == b.st_dev;
}

// The fds bwrap finds its inputs on, after the channel on fd 3 and
// bwrap_args_fd (4), in the order of spawn_request::extra_fds.
constexpr int info_fd = 5, seccomp_fd = 6, workspace_fd = 7, program_fd = 8;
constexpr std::chrono::seconds bwrap_start_timeout{10};

[[noreturn]] void spawn_failed(const std::string& what) {
  throw sandbox_error(sandbox_errc::spawn_failed, fmt::format("{}: {}", what, std::strerror(errno)));
}

// A new run's workspace: not made yet (a pooled folder may take its place),
// or an empty folder.
bool new_workspace(const fs::path& workspace) {
  std::error_code ec;
  return fs::is_empty(workspace, ec) || ec == std::errc::no_such_file_or_directory;
}

// A memfd holding `data`, positioned at its start.
unique_fd memfd_with(const std::string& data) {
  unique_fd fd(::memfd_create("cairn-bwrap-input", MFD_CLOEXEC));
  if (!fd) spawn_failed("memfd_create");
  for (std::size_t off = 0; off < data.size();) {
    ssize_t n = ::write(fd.get(), data.data() + off, data.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) spawn_failed("writing bwrap's input");
    off += static_cast<std::size_t>(n);
  }
  ::lseek(fd.get(), 0, SEEK_SET);
  return fd;
}

// bwrap writes a JSON object holding "child-pid" once it has cloned the
// sandbox, then closes the pipe. EOF without it: bwrap failed before that,
// and its message is in the log.
std::optional<pid_t> read_sandbox_init_pid(int fd) {
  std::string info;
  auto deadline = std::chrono::steady_clock::now() + bwrap_start_timeout;
  char buffer[1024];
  for (;;) {
    auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    int ready = ::poll(&p, 1, static_cast<int>(std::max<long long>(0, left.count())));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0)
      throw sandbox_error(sandbox_errc::spawn_failed, "bwrap did not start the sandbox within 10 s");
    ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    info.append(buffer, static_cast<std::size_t>(n));
  }
  json parsed = json::parse(info, nullptr, false);
  if (parsed.is_object() && parsed.contains("child-pid") && parsed["child-pid"].is_number_integer())
    return parsed["child-pid"].get<pid_t>();
  return std::nullopt;
}

// Sealed copies in memory of the agents pooled sandboxes run, one per
// version of each file (its inode, size and times): a normal user's
// launcher executes its agent from one (the sandbox could change the file
// itself), and copying a static agent of a few megabytes at every launch
// cost a millisecond or more. A changed file gets a new copy; the oldest
// copies go past 16 files or 256 MiB, and a file larger than that (an agent
// that rewrote its own program in its workspace, say) is copied for its
// launch alone: the host keeps nothing of unbounded size.
class agent_copies {
 public:
  // A descriptor of the copy of `agent`, open as `file` and described by `st`.
  unique_fd copy_of(const fs::path& agent, int file, const struct stat& st) {
    constexpr std::size_t max_copies = 16;
    constexpr off_t max_bytes = off_t{256} << 20;
    if (st.st_size > max_bytes) return sealed_copy(agent, file, st.st_size);
    const version v{st.st_dev, st.st_ino, st.st_size, st.st_mtim.tv_sec, st.st_mtim.tv_nsec,
                    st.st_ctim.tv_sec, st.st_ctim.tv_nsec};
    std::lock_guard lock(mutex_);
    auto it = std::find_if(copies_.begin(), copies_.end(), [&](const copy& c) { return c.agent == agent; });
    if (it == copies_.end() || it->of != v) {
      if (it != copies_.end()) copies_.erase(it);
      const auto held = [&] {
        off_t bytes = 0;
        for (const auto& c : copies_) bytes += std::get<2>(c.of);
        return bytes;
      };
      while (!copies_.empty() && (copies_.size() >= max_copies || held() + st.st_size > max_bytes))
        copies_.erase(copies_.begin());
      copies_.push_back({agent, v, sealed_copy(agent, file, st.st_size)});
      it = std::prev(copies_.end());
    }
    unique_fd duplicate(::fcntl(it->fd.get(), F_DUPFD_CLOEXEC, 0));
    if (!duplicate) spawn_failed("duplicating the copy of " + agent.string());
    return duplicate;
  }

 private:
  using version = std::tuple<dev_t, ino_t, off_t, time_t, long, time_t, long>;
  struct copy {
    fs::path agent;
    version of;
    unique_fd fd;
  };

  static unique_fd sealed_copy(const fs::path& agent, int file, off_t size) {
    unique_fd copy(::memfd_create("cairn-agent", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!copy) spawn_failed("memfd_create");
    for (off_t offset = 0; offset < size;) {
      ssize_t n = ::sendfile(copy.get(), file, &offset, static_cast<std::size_t>(size - offset));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) spawn_failed("copying " + agent.string());
    }
    if (::fchmod(copy.get(), 0555) < 0 ||
        ::fcntl(copy.get(), F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) < 0)
      spawn_failed("sealing the copy of " + agent.string());
    return copy;
  }

  std::mutex mutex_;
  std::vector<copy> copies_;
};

// What every bwrap start of one backend shares.
struct bwrap_context {
  fs::path bwrap;
  bwrap_features features;
  std::optional<sandbox_user> user;
  quota_support quota;
  agent_sdks sdks;  // where the sandbox uid may read them
  std::shared_ptr<agent_copies> copies = std::make_shared<agent_copies>();
};

// What starting sandboxes with `bwrap` needs: its features, and the SDKs
// where the sandbox uid may read them.
bwrap_context context_for(const fs::path& bwrap, const std::optional<sandbox_user>& user, quota_support quota) {
  return {bwrap, detect_bwrap_features(bwrap), user, std::move(quota),
          user ? readable_agent_sdks(find_agent_sdks(), user->uid, user->gid) : find_agent_sdks()};
}

// The isolation flags, `env`, the workspace at /workspace (also the working
// folder) and the SDKs: what every sandbox of a run gets before its program.
// `by_descriptor`: the workspace is bound from the descriptor bwrap gets as
// workspace_fd (the folder as cairn opened it, without following a link),
// never by bwrap resolving its path again.
std::vector<std::string> run_mounts(const bwrap_context& c, const resource_limits& limits,
                                    const std::map<std::string, std::string>& env, const fs::path& workspace,
                                    bool by_descriptor = true) {
  std::vector<std::string> options = bwrap_isolation_args(c.features, limits.max_tmp_bytes);
  for (const auto& [name, value] : env) options.insert(options.end(), {"--setenv", name, value});
  if (by_descriptor) options.insert(options.end(), {"--bind-fd", std::to_string(workspace_fd), "/workspace"});
  else options.insert(options.end(), {"--bind", workspace.string(), "/workspace"});
  options.insert(options.end(), {"--chdir", "/workspace"});
  if (!c.sdks.python.empty()) options.insert(options.end(), {"--ro-bind", c.sdks.python.string(), sandbox_python_sdk});
  if (!c.sdks.js.empty()) options.insert(options.end(), {"--ro-bind", c.sdks.js.string(), sandbox_js_sdk});
  return options;
}

// bwrap, started with the isolation flags, `env` and `workspace` bound at
// /workspace, running `agent` (a checked host path, bound or copied in) or,
// when null, the pool's launcher. Returns once the sandbox's pid 1 is known.
struct started_bwrap {
  std::shared_ptr<child_handle> handle;
  unique_fd channel;
};
started_bwrap start_bwrap(const bwrap_context& c, const resource_limits& limits,
                          const std::map<std::string, std::string>& env, const fs::path& workspace,
                          const fs::path* agent, const fs::path& app_folder,
                          const std::vector<fs::path>& private_paths, const std::vector<std::string>& args,
                          int log_writer, const std::shared_ptr<sandbox_cgroup>& cgroup) {
  std::vector<std::string> options = run_mounts(c, limits, env, workspace);

  std::string program = sandbox_agent_path;
  unique_fd program_copy;
  if (agent && !app_folder.empty()) {
    // A script, run by the interpreter its first line names (from /usr),
    // from its folder as app_folder.hpp shows it.
    const app_view view = view_of_app_folder(app_folder, private_paths);
    options.insert(options.end(), {"--ro-bind", app_folder.string(), sandbox_app_folder});
    for (auto& option : app_view_options(view, sandbox_app_folder)) options.push_back(std::move(option));
    program = (fs::path(sandbox_app_folder) / agent->lexically_relative(app_folder)).string();
  } else if (!agent) {
    program_copy = memfd_with(std::string(reinterpret_cast<const char*>(warm::launcher_image),
                                          warm::launcher_image_size));
  } else if (c.user && (first_unsearchable_dir(*agent, c.user->uid, c.user->gid) ||
                        !may_read_and_execute(*agent, c.user->uid, c.user->gid))) {
    // The sandbox uid cannot reach the program: bwrap copies it in from an
    // fd that the host opened.
    program_copy.reset(::open(agent->c_str(), O_RDONLY | O_CLOEXEC));
    if (!program_copy) spawn_failed("opening " + agent->string());
  }
  if (program_copy)
    options.insert(options.end(),
                   {"--perms", "0555", "--ro-bind-data", std::to_string(program_fd), sandbox_agent_path});
  else if (app_folder.empty())
    options.insert(options.end(), {"--ro-bind", agent->string(), sandbox_agent_path});
  // Last among the mounts: everything but /workspace, /tmp, /dev/shm and /proc turns read-only.
  options.insert(options.end(), {"--remount-ro", "/", "--info-fd", std::to_string(info_fd), "--seccomp",
                                 std::to_string(seccomp_fd)});

  std::string nul_separated;
  for (const auto& option : options) nul_separated.append(option).push_back('\0');
  unique_fd args_memfd = memfd_with(nul_separated);
  unique_fd seccomp_memfd = memfd_with(seccomp_program());
  int info_pipe[2];
  if (::pipe2(info_pipe, O_CLOEXEC) < 0) spawn_failed("pipe");
  unique_fd info_read(info_pipe[0]), info_write(info_pipe[1]);

  spawn_request request;
  request.argv = {c.bwrap.string(), "--args", std::to_string(bwrap_args_fd), "--", program};
  request.argv.insert(request.argv.end(), args.begin(), args.end());
  auto record = std::make_unique<own_record>(sandbox_record_kind, host_identity());
  request.env = {"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8",
                 std::string(sandbox_record_env) + "=" + record->token()};
  request.cwd = "/";
  request.log_fd = log_writer;
  // Opened now, once its image is mounted there, walking from "/" without links.
  unique_fd workspace_folder = open_folder_no_follow(workspace);
  request.extra_fds = {args_memfd.get(), info_write.get(), seccomp_memfd.get(), workspace_folder.get()};
  if (program_copy) request.extra_fds.push_back(program_copy.get());
  request.limits = limits;
  if (c.user) request.run_as = spawn_identity{c.user->uid, c.user->gid};
  std::vector<unique_fd> join = cgroup ? cgroup->join_fds() : std::vector<unique_fd>{};
  for (const auto& fd : join) request.join_cgroups.push_back(fd.get());

  started_bwrap started;
  started.handle = std::make_shared<child_handle>();
  spawned_child child = spawn_child(request);
  started.handle->pid = child.pid;
  started.handle->pidfd = std::move(child.pidfd);
  started.handle->exit_codes_carry_signals = true;
  started.handle->record = std::move(record);
  started.channel = std::move(child.channel);

  info_write.reset();
  if (auto init = read_sandbox_init_pid(info_read.get())) {
    std::lock_guard lock(started.handle->mutex);
    started.handle->sandbox_init_pidfd = open_pidfd(*init);
  }
  return started;
}

// The agent's environment inside the sandbox: the run's over a minimal base.
// Without a cgroup, RLIMIT_AS bounds each process (spawn.cpp).
std::map<std::string, std::string> sandbox_environment(const sandbox_spec& spec, bool cgroup) {
  std::map<std::string, std::string> base = {{"PATH", "/usr/local/bin:/usr/bin:/bin"},
                                             {"HOME", "/workspace"},
                                             {"TMPDIR", "/tmp"},
                                             {"LANG", "C.UTF-8"},
                                             {"PYTHONPATH", sandbox_python_sdk}};
  if (!cgroup) add_address_space_environment(base);
  return agent_environment(spec, std::move(base));
}

// Whether a sandbox made with `pooled` enforces what `wanted` asks; the
// workspace's and the log's sizes are the run's own either way.
bool same_sandbox_limits(const resource_limits& pooled, const resource_limits& wanted) {
  auto key = [](const resource_limits& l) {
    return std::tie(l.max_processes, l.max_memory_bytes, l.max_file_bytes, l.max_open_files, l.max_cpu_seconds,
                    l.max_tmp_bytes);
  };
  return key(pooled) == key(wanted);
}

// Waits for the launcher's ready byte: bwrap has built the whole sandbox.
void wait_launcher_ready(warm_sandbox& w) {
  pollfd p{w.channel.get(), POLLIN, 0};
  int ready;
  while ((ready = ::poll(&p, 1, static_cast<int>(std::chrono::milliseconds(bwrap_start_timeout).count()))) < 0 &&
         errno == EINTR) {
  }
  char byte = 0;
  if (ready == 1 && ::read(w.channel.get(), &byte, 1) == 1 && byte == warm::launcher_ready) return;
  std::string output(4096, '\0');
  ssize_t n = ::read(w.own_output.get(), output.data(), output.size());
  output.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
  auto why = diagnose_bwrap_failure(output);
  throw sandbox_error(sandbox_errc::spawn_failed,
                      fmt::format("a pooled sandbox did not start: {}",
                                  why ? *why : output.empty() ? std::string("bwrap said nothing") : output));
}

// The sandbox reads a script through its folder's bind: the sandbox uid
// must be able to, as no copy is made.
void check_script_reachable(const bwrap_context& c, const fs::path& app_folder, const fs::path& agent) {
  if (agent.parent_path() != app_folder)
    throw sandbox_error(sandbox_errc::bad_spec,
                        fmt::format("script agent {} is not in its folder {}", agent.string(), app_folder.string()));
  const auto& user = c.user;
  if (!user) return;
  auto blocked = first_unsearchable_dir(agent, user->uid, user->gid);
  if (blocked || !may_read_and_execute(agent, user->uid, user->gid))
    throw sandbox_error(
        sandbox_errc::bad_spec,
        fmt::format("script agent {} is out of reach of the sandbox uid {}, which runs it from its folder: {}",
                    agent.string(), user->uid,
                    blocked ? fmt::format("it may not enter {} (chmod o+x {})", blocked->string(), blocked->string())
                            : fmt::format("it may not read it (chmod o+rx {})", agent.string())));
}

// Which file `path` is and when it last changed, as stat tells it.
std::string stamp_of(const fs::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) < 0) return {};
  return fmt::format("{}:{}:{}:{}.{}:{}.{}", st.st_dev, st.st_ino, st.st_size, st.st_mtim.tv_sec, st.st_mtim.tv_nsec,
                     st.st_ctim.tv_sec, st.st_ctim.tv_nsec);
}

// An agent started in a pooled sandbox has its imports behind it once it
// speaks (an SDK's hello, left on the channel for the run to read).
constexpr std::chrono::seconds agent_start_timeout{30};
void wait_agent_spoke(warm_sandbox& w) {
  pollfd p{w.channel.get(), POLLIN, 0};
  const auto deadline = std::chrono::steady_clock::now() + agent_start_timeout;
  int ready;
  do {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    ready = ::poll(&p, 1, static_cast<int>(std::max<long long>(0, left.count())));
  } while (ready < 0 && errno == EINTR);
  char byte = 0;
  if (ready == 1 && ::recv(w.channel.get(), &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 1) return;
  std::string output(4096, '\0');
  ssize_t n = ::read(w.own_output.get(), output.data(), output.size());
  output.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
  auto why = diagnose_bwrap_failure(output);
  throw sandbox_error(sandbox_errc::spawn_failed,
                      fmt::format("agent {} started in a pooled sandbox {}: {}", w.agent->program.string(),
                                  ready == 1 ? "ended before it said anything" : "said nothing within 30 s",
                                  why ? *why : output.empty() ? std::string("no output") : output));
}

class bwrap_sandbox final : public sandbox {
 public:
  bwrap_sandbox(bwrap_context context, sandbox_spec spec, fs::path workspace,
                std::unique_ptr<sandbox_resources> resources, std::size_t max_frame,
                std::unique_ptr<warm_sandbox> warm)
      : context_(std::move(context)),
        spec_(std::move(spec)),
        workspace_(std::move(workspace)),
        resources_(std::move(resources)),
        max_frame_(max_frame),
        warm_(std::move(warm)),
        pooled_(warm_ != nullptr),
        agent_started_(warm_ && warm_->agent) {}

  ~bwrap_sandbox() override {
    try {
      destroy();
    } catch (...) {
      // Destructors never throw.
    }
  }

  std::unique_ptr<agent_process> exec(const fs::path& program,
                                      const std::vector<std::string>& args) override {
    fs::path agent = check_program(program);
    check_agent_args(args);
    if (!spec_.app_folder.empty()) check_script_reachable(context_, spec_.app_folder, agent);
    const bool started = warm_ && warm_->agent && warm_->channel;
    if (started && (agent != warm_->agent->program || args != warm_->agent->args))
      throw sandbox_error(sandbox_errc::bad_spec,
                          fmt::format("this sandbox runs {} already, started for its first exec: it cannot start {}",
                                      warm_->agent->program.string(), agent.string()));
    unique_fd log_file = warm_ ? warm_->folder->give_log(spec_.log_file) : unique_fd{};
    if (!log_file) log_file = open_log(spec_.log_file);
    auto log = started ? std::make_unique<output_log>(std::move(log_file), spec_.log_file, spec_.limits.max_log_bytes,
                                                      std::move(warm_->own_output))
                       : std::make_unique<output_log>(std::move(log_file), spec_.log_file, spec_.limits.max_log_bytes);
    resources_->acquire();  // again, after a destroy()
    auto cgroup = resources_->cgroup();
    // Before the start: counters count from what the cgroup held until now.
    auto watch = std::make_unique<limit_watch>(spec_.limits, cgroup, resources_->workspace());
    const auto env = sandbox_environment(spec_, cgroup != nullptr);

    std::shared_ptr<child_handle> handle;
    unique_fd channel;
    if (started) {
      handle = warm_->handle;
      channel = std::move(warm_->channel);
    } else if (warm_ && warm_->channel) {
      unique_fd image = program_for_launcher(agent);
      std::vector<std::string> argv = {sandbox_agent_path};
      argv.insert(argv.end(), args.begin(), args.end());
      std::vector<std::string> environ = {"PWD=/workspace"};  // as bwrap's --chdir sets it
      for (const auto& [name, value] : env) environ.push_back(name + "=" + value);
      warm_->launch(image.get(), log->writer(), argv, environ);
      handle = warm_->handle;
      channel = std::move(warm_->channel);
    } else {
      auto started =
          start_bwrap(context_, spec_.limits, env, workspace_, &agent, spec_.app_folder, spec_.private_paths, args,
                      log->writer(), cgroup);
      handle = std::move(started.handle);
      channel = std::move(started.channel);
    }
    log->close_writer();
    tracker_.track(handle);
    return std::make_unique<child_process>(handle, std::move(channel), max_frame_, std::move(log),
                                           std::move(watch));
  }

  void destroy() override { end(false); }
  void destroy_ending_run() override { end(true); }

  std::vector<std::string> warnings() const override {
    auto warnings = resources_->warnings();
    if (!context_.features.tmpfs_size)
      warnings.push_back(
          "/tmp and /dev/shm have no size of their own (bubblewrap is older than 0.7.0, or setuid): only "
          "the memory limit bounds them; install bubblewrap 0.7.0 or newer, not setuid");
    return warnings;
  }

  bool pooled() const override { return pooled_; }
  bool agent_started() const override { return agent_started_; }

 private:
  void end(bool releasing_workspace) {
    tracker_.kill_all();
    warm_.reset();  // its folder's mounts before the workspace's own
    std::exception_ptr not_released;  // told after the rest is done
    if (releasing_workspace) try {
        resources_->release_ending_run();
      } catch (const sandbox_error&) {
        not_released = std::current_exception();
      }
    resources_->release();
    close_to_others(workspace_);
    open_log(spec_.log_file);  // sets its mode back to 0600: the agent may have fchmod'ed its stdout
    if (not_released) std::rethrow_exception(not_released);
  }

  // The agent as the launcher executes it: from the host's descriptor when
  // the sandbox uid may read and execute the file but not change it (its
  // /proc/self/exe is that file, on a writable host mount: its owner could
  // chmod it), else from a sealed copy in memory (agent_copies).
  unique_fd program_for_launcher(const fs::path& agent) const {
    unique_fd file(::open(agent.c_str(), O_RDONLY | O_CLOEXEC));
    if (!file) spawn_failed("opening " + agent.string());
    struct stat st {};
    if (::fstat(file.get(), &st) < 0) spawn_failed("reading " + agent.string());
    const auto& user = context_.user;
    if (user && st.st_uid != user->uid && may_read_and_execute(agent, user->uid, user->gid)) return file;
    return context_.copies->copy_of(agent, file.get(), st);
  }

  bwrap_context context_;
  sandbox_spec spec_;
  fs::path workspace_;
  std::unique_ptr<sandbox_resources> resources_;
  std::size_t max_frame_;
  std::unique_ptr<warm_sandbox> warm_;  // until its one attempt ends
  bool pooled_;
  bool agent_started_;
  child_tracker tracker_;
};

class bwrap_backend final : public sandbox_backend {
 public:
  explicit bwrap_backend(bwrap_options options) : options_(std::move(options)) {
    if (options_.warm.size > 0) {
      if (options_.warm.folder.empty())
        throw sandbox_error(sandbox_errc::bad_spec, "a warm pool needs a folder for its sandboxes' workspaces");
      open_folder_no_follow(options_.warm.folder, 0711);
      pool_ = std::make_unique<warm_pool>(
          options_.warm.size, [this](std::shared_ptr<const warm_agent> agent) { return make_warm(std::move(agent)); },
          options_.warm.start_agents, options_.warm.refused_agent_pause);
    }
  }

  std::string name() const override { return "bwrap"; }

  std::unique_ptr<sandbox> create(const sandbox_spec& spec) override {
    bwrap_context context = context_of();
    if (spec.log_file.empty())
      throw sandbox_error(sandbox_errc::bad_spec, "the sandbox spec has no log file");
    // Made after the take: a new run's pooled folder takes its place, made ahead.
    fs::path workspace = prepare_workspace_parent(spec.workspace);
    if (context.user) {
      if (auto blocked = first_unsearchable_dir(workspace, context.user->uid, context.user->gid))
        throw sandbox_error(
            sandbox_errc::bad_spec,
            fmt::format("workspace {} is out of reach of the sandbox uid {}: it may not enter {}; keep "
                        "workspaces under folders that others may enter (chmod o+x {})",
                        workspace.string(), context.user->uid, blocked->string(), blocked->string()));
    }
    auto resources = std::make_unique<sandbox_resources>(spec, workspace, context.user, context.quota);
    auto warm = take_warm(context, spec, workspace);
    open_folder_no_follow(workspace, 0700);  // made unless a pooled folder became it; never through a link
    fs::path premounted;
    if (warm && warm->image && !spec.workspace_image.empty() && !fs::exists(spec.workspace_image) &&
        spec.limits.max_workspace_bytes == options_.warm.limits.max_workspace_bytes &&
        same_filesystem(warm->image_path, open_folder_no_follow(spec.workspace_image.parent_path(), 0700))) {
      // A run without an image yet takes the pooled one, mounted already
      // (renamed: an image kept on another filesystem, a shared root's, is made there).
      warm->image->give_away(spec.workspace_image);
      warm->image_path.clear();
      premounted = warm->folder->path();
    }
    if (warm) resources->adopt(std::move(warm->cgroup), premounted);
    resources->acquire();
    // The workspace as it is now, its image mounted: the sandbox sees it from here on.
    if (warm && warm->folder->shared_mount() && premounted.empty()) warm->folder->show(workspace);
    std::size_t max_frame = options_.max_frame ? options_.max_frame : protocol::default_max_frame;
    return std::make_unique<bwrap_sandbox>(std::move(context), spec, workspace, std::move(resources), max_frame,
                                           std::move(warm));
  }

  std::vector<doctor_check> check() const override { return bwrap_checks(options_); }

  void release_workspace(const fs::path& workspace, const fs::path& image) override {
    if (!image.empty()) release_workspace_image(workspace, image);
    close_to_others(workspace);
  }
  workspace_upkeep upkeep(const fs::path& workspace) const override { return workspace_upkeep_of(workspace); }

  bool wait_warm(std::size_t count, std::chrono::milliseconds timeout) override {
    return pool_ && pool_->wait_ready(count, timeout);
  }
  std::optional<std::string> warm_error() const override { return pool_ ? pool_->last_error() : std::nullopt; }

 private:
  // Once per backend, when bwrap is found: `bwrap --version` costs a
  // process, the sweeps a scan of /proc, of the cgroup folders and of the
  // mounts, the sandbox user a look into the user database.
  bwrap_context context_of() {
    std::lock_guard lock(mutex_);
    if (context_) return *context_;
    auto bwrap = find_bwrap(options_.bwrap);
    if (!bwrap) throw sandbox_error(sandbox_errc::bwrap_missing, bwrap_missing_message);
    // First the sweeps: of what dead hosts left.
    kill_orphaned_sandboxes();
    sweep_orphaned_cgroups(detect_cgroups());
    sweep_orphaned_warm_folders();
    sweep_orphaned_workspace_mounts();
    auto user = resolve_sandbox_user(options_);
    context_ = context_for(*bwrap, user, detect_workspace_quota());
    return *context_;
  }

  // Whether the pooled sandboxes come with a quota image (root's, mounted
  // before the sandbox is made).
  bool pool_has_images(const bwrap_context& c) const {
    return c.user && c.quota.available && options_.warm.limits.max_workspace_bytes > 0;
  }

  // The agent this run's sandbox may come with, started already: for a new
  // run, whose workspace is new and empty and which, when the pool's
  // sandboxes have images, has none yet (it takes the pooled one), so that
  // the agent's working folder is the run's /workspace. Null otherwise.
  std::shared_ptr<const warm_agent> agent_for(const bwrap_context& c, const sandbox_spec& spec,
                                              const fs::path& workspace) const {
    if (!options_.warm.start_agents || spec.agent.empty()) return nullptr;
    if (!new_workspace(workspace)) return nullptr;
    std::error_code ec;
    const bool image = c.quota.available && !spec.workspace_image.empty() && spec.limits.max_workspace_bytes > 0;
    if (image != pool_has_images(c)) return nullptr;
    if (image && (fs::exists(spec.workspace_image, ec) ||
                  spec.limits.max_workspace_bytes != options_.warm.limits.max_workspace_bytes))
      return nullptr;
    try {
      auto agent = std::make_shared<warm_agent>();
      agent->program = check_program(spec.agent);
      check_agent_args(spec.agent_args);
      agent->args = spec.agent_args;
      agent->app_folder = spec.app_folder;
      agent->private_paths = spec.private_paths;
      if (!spec.app_folder.empty()) view_of_app_folder(spec.app_folder, spec.private_paths);  // refused: its exec says why
      if (!spec.app_folder.empty()) check_script_reachable(c, spec.app_folder, agent->program);
      agent->stamp = stamp_of(agent->program) + (spec.app_folder.empty() ? "" : "|" + stamp_of(spec.app_folder));
      agent->env = sandbox_environment(spec, detect_cgroups().mode != cgroup_mode::none);
      agent->env.erase("CAIRN_RUN_ID");
      return agent;
    } catch (const sandbox_error&) {
      return nullptr;  // its exec says why
    }
  }

  // A pooled sandbox for this run, or null: none ready, other limits, or
  // (without root) a workspace that is not a new, empty folder.
  std::unique_ptr<warm_sandbox> take_warm(const bwrap_context& context, const sandbox_spec& spec,
                                          const fs::path& workspace) {
    if (!pool_ || !same_sandbox_limits(options_.warm.limits, spec.limits)) return nullptr;
    if (!context.user && !new_workspace(workspace)) return nullptr;  // no root: only a new, empty one
    // No root: its image is mounted through FUSE after the take, where a
    // sandbox made before cannot see it (it would write past the quota).
    if (!context.user && context.quota.fuse && !spec.workspace_image.empty() && spec.limits.max_workspace_bytes > 0)
      return nullptr;
    // A script agent's folder is bound when its sandbox is made: only one
    // made running it will do.
    auto warm = pool_->take(agent_for(context, spec, workspace), spec.app_folder.empty());
    if (!warm || warm->folder->shared_mount() || warm->folder->become(workspace)) return warm;
    return nullptr;
  }

  // Runs on the pool's threads.
  std::unique_ptr<warm_sandbox> make_warm(std::shared_ptr<const warm_agent> agent) {
    bwrap_context context = context_of();
    const auto& limits = options_.warm.limits;
    auto warm = std::make_unique<warm_sandbox>();
    warm->agent = std::move(agent);
    const bool root = context.user.has_value();  // as resolve_sandbox_user says
    // A started agent's working folder stays its run's /workspace: the
    // pooled image, which its run takes, or a plain folder, which becomes
    // the run's (a workspace mounted over the folder would hide it).
    warm->folder = std::make_unique<warm_folder>(
        options_.warm.folder / fmt::format("{}-{}", ::getpid(), made_.fetch_add(1)),
        root && (!warm->agent || pool_has_images(context)));
    if (root && !warm->folder->shared_mount() && ::chown(warm->folder->path().c_str(), context.user->uid,
                                                         context.user->gid) < 0)
      spawn_failed("giving " + warm->folder->path().string() + " to the sandbox uid");
    if (pool_has_images(context)) {
      warm->image_path = fs::path(warm->folder->path()) += ".img";
      make_workspace_image(context.quota.tools, warm->image_path, workspace_image_size(limits.max_workspace_bytes),
                           context.user->uid, context.user->gid);
      warm->image.emplace(warm->image_path, warm->folder->path());
      ready_image_mount(warm->folder->path());  // before bwrap copies the mount
    }
    const auto& cgroups = detect_cgroups();
    if (cgroups.mode != cgroup_mode::none)
      warm->cgroup = std::make_shared<sandbox_cgroup>(cgroups, "warm", limits.max_memory_bytes,
                                                      limits.max_processes + bwrap_own_processes);
    int output[2];
    if (::pipe2(output, O_CLOEXEC) < 0) spawn_failed("pipe");
    warm->own_output.reset(output[0]);
    unique_fd writer(output[1]);
    ::fcntl(warm->own_output.get(), F_SETFL, O_NONBLOCK);
    const auto& a = warm->agent;
    auto started = a ? start_bwrap(context, limits, a->env, warm->folder->path(), &a->program, a->app_folder,
                                   a->private_paths, a->args, writer.get(), warm->cgroup)
                     : start_bwrap(context, limits, {}, warm->folder->path(), nullptr, {}, {}, {}, writer.get(),
                                   warm->cgroup);
    warm->handle = std::move(started.handle);
    warm->channel = std::move(started.channel);
    writer.reset();
    if (a)
      wait_agent_spoke(*warm);
    else
      wait_launcher_ready(*warm);
    return warm;
  }

  bwrap_options options_;
  std::mutex mutex_;
  std::optional<bwrap_context> context_;
  std::atomic<std::uint64_t> made_{0};
  std::unique_ptr<warm_pool> pool_;  // last: its threads use the members above
};

}  // namespace

std::vector<std::string> bwrap_command(const fs::path& workspace, const fs::path& program,
                                       const resource_limits& limits, const bwrap_options& options) {
  auto bwrap = find_bwrap(options.bwrap);
  if (!bwrap) throw sandbox_error(sandbox_errc::bwrap_missing, bwrap_missing_message);
  const bwrap_context c = context_for(*bwrap, resolve_sandbox_user(options), {});
  std::vector<std::string> argv = {bwrap->string()};
  for (auto& option : run_mounts(c, limits, {}, workspace, /*by_descriptor=*/false)) argv.push_back(std::move(option));
  argv.insert(argv.end(), {"--ro-bind", program.string(), sandbox_agent_path, "--remount-ro", "/", sandbox_agent_path});
  return argv;
}

std::unique_ptr<sandbox_backend> make_bwrap_backend(bwrap_options options) {
  return std::make_unique<bwrap_backend>(std::move(options));
}

}  // namespace cairn::runtime
