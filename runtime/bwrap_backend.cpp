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
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>

#include <fmt/format.h>

#include "runtime/bwrap_support.hpp"
#include "runtime/child_process.hpp"
#include "runtime/host_paths.hpp"
#include "runtime/no_follow.hpp"
#include "runtime/sandbox_resources.hpp"
#include "runtime/seccomp_filter.hpp"

namespace cairn::runtime {

std::vector<doctor_check> bwrap_checks(const bwrap_options& options);  // bwrap_doctor.cpp

namespace {

namespace fs = std::filesystem;

// The fds bwrap finds its inputs on, after the channel on fd 3 and
// bwrap_args_fd (4), in the order of spawn_request::extra_fds.
constexpr int info_fd = 5, seccomp_fd = 6, program_fd = 7;
constexpr std::chrono::seconds bwrap_start_timeout{10};

[[noreturn]] void spawn_failed(const std::string& what) {
  throw sandbox_error(sandbox_errc::spawn_failed, fmt::format("{}: {}", what, std::strerror(errno)));
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

class bwrap_sandbox final : public sandbox {
 public:
  bwrap_sandbox(fs::path bwrap, bwrap_features features, sandbox_spec spec, fs::path workspace,
                std::optional<sandbox_user> user, std::unique_ptr<sandbox_resources> resources,
                std::size_t max_frame)
      : bwrap_(std::move(bwrap)),
        features_(features),
        spec_(std::move(spec)),
        workspace_(std::move(workspace)),
        user_(std::move(user)),
        resources_(std::move(resources)),
        max_frame_(max_frame) {}

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
    auto log = std::make_unique<output_log>(open_log(spec_.log_file), spec_.log_file, spec_.limits.max_log_bytes);
    resources_->acquire();  // again, after a destroy()

    std::vector<std::string> options = bwrap_isolation_args(features_, spec_.limits.max_tmp_bytes);
    auto env = agent_environment(spec_, {{"PATH", "/usr/local/bin:/usr/bin:/bin"},
                                         {"HOME", "/workspace"},
                                         {"TMPDIR", "/tmp"},
                                         {"LANG", "C.UTF-8"}});
    for (const auto& [name, value] : env) options.insert(options.end(), {"--setenv", name, value});
    options.insert(options.end(), {"--bind", workspace_.string(), "/workspace", "--chdir", "/workspace"});

    unique_fd program_copy;
    if (!user_ || (!first_unsearchable_dir(agent, user_->uid, user_->gid) &&
                   may_read_and_execute(agent, user_->uid, user_->gid))) {
      options.insert(options.end(), {"--ro-bind", agent.string(), sandbox_agent_path});
    } else {
      // The sandbox uid cannot reach the program: bwrap copies it in from an
      // fd that the host opened.
      program_copy.reset(::open(agent.c_str(), O_RDONLY | O_CLOEXEC));
      if (!program_copy) spawn_failed("opening " + agent.string());
      options.insert(options.end(),
                     {"--perms", "0555", "--ro-bind-data", std::to_string(program_fd), sandbox_agent_path});
    }
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
    request.argv = {bwrap_.string(), "--args", std::to_string(bwrap_args_fd), "--", sandbox_agent_path};
    request.argv.insert(request.argv.end(), args.begin(), args.end());
    auto record = std::make_unique<own_record>(sandbox_record_kind, host_identity());
    request.env = {"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8",
                   std::string(sandbox_record_env) + "=" + record->token()};
    request.cwd = "/";
    request.log_fd = log->writer();
    request.extra_fds = {args_memfd.get(), info_write.get(), seccomp_memfd.get()};
    if (program_copy) request.extra_fds.push_back(program_copy.get());
    request.limits = spec_.limits;
    if (user_) request.run_as = spawn_identity{user_->uid, user_->gid};
    auto cgroup = resources_->cgroup();
    std::vector<unique_fd> join = cgroup ? cgroup->join_fds() : std::vector<unique_fd>{};
    for (const auto& fd : join) request.join_cgroups.push_back(fd.get());
    // Before the spawn: counters start from what the cgroup held until now.
    auto watch = std::make_unique<limit_watch>(spec_.limits, cgroup, resources_->workspace());

    auto handle = std::make_shared<child_handle>();
    spawned_child child = spawn_child(request);
    log->close_writer();
    handle->pid = child.pid;
    handle->pidfd = std::move(child.pidfd);
    handle->exit_codes_carry_signals = true;
    handle->record = std::move(record);
    tracker_.track(handle);
    auto process = std::make_unique<child_process>(handle, std::move(child.channel), max_frame_, std::move(log),
                                                   std::move(watch));

    info_write.reset();
    if (auto init = read_sandbox_init_pid(info_read.get())) {
      std::lock_guard lock(handle->mutex);
      handle->sandbox_init_pidfd = open_pidfd(*init);
    }
    return process;
  }

  void destroy() override {
    tracker_.kill_all();
    resources_->release();
    strip_set_id_bits(workspace_);
    open_log(spec_.log_file);  // sets its mode back to 0600: the agent may have fchmod'ed its stdout
  }

  std::vector<std::string> warnings() const override {
    auto warnings = resources_->warnings();
    if (!features_.tmpfs_size)
      warnings.push_back(
          "/tmp and /dev/shm have no size of their own (bubblewrap is older than 0.7.0, or setuid): only "
          "the memory limit bounds them; install bubblewrap 0.7.0 or newer, not setuid");
    return warnings;
  }

 private:
  fs::path bwrap_;
  bwrap_features features_;
  sandbox_spec spec_;
  fs::path workspace_;
  std::optional<sandbox_user> user_;
  std::unique_ptr<sandbox_resources> resources_;
  std::size_t max_frame_;
  child_tracker tracker_;
};

class bwrap_backend final : public sandbox_backend {
 public:
  explicit bwrap_backend(bwrap_options options) : options_(std::move(options)) {}

  std::string name() const override { return "bwrap"; }

  std::unique_ptr<sandbox> create(const sandbox_spec& spec) override {
    auto bwrap = find_bwrap(options_.bwrap);
    if (!bwrap) throw sandbox_error(sandbox_errc::bwrap_missing, bwrap_missing_message);
    auto user = resolve_sandbox_user(options_);
    if (spec.log_file.empty())
      throw sandbox_error(sandbox_errc::bad_spec, "the sandbox spec has no log file");
    fs::path workspace = prepare_workspace(spec.workspace);
    bwrap_features features = features_of(*bwrap);  // first: sweeps what dead hosts left
    if (user) {
      if (auto blocked = first_unsearchable_dir(workspace, user->uid, user->gid))
        throw sandbox_error(
            sandbox_errc::bad_spec,
            fmt::format("workspace {} is out of reach of the sandbox uid {}: it may not enter {}; keep "
                        "workspaces under folders that others may enter (chmod o+x {})",
                        workspace.string(), user->uid, blocked->string(), blocked->string()));
    }
    auto resources = std::make_unique<sandbox_resources>(spec, workspace, user);
    resources->acquire();
    std::size_t max_frame = options_.max_frame ? options_.max_frame : protocol::default_max_frame;
    return std::make_unique<bwrap_sandbox>(*bwrap, features, spec, workspace, user, std::move(resources),
                                           max_frame);
  }

  std::vector<doctor_check> check() const override { return bwrap_checks(options_); }

  void release_workspace(const fs::path& workspace, const fs::path& image) override {
    if (!image.empty()) release_workspace_image(workspace, image);
    strip_set_id_bits(workspace);
  }
  workspace_upkeep upkeep(const fs::path& workspace) const override { return workspace_upkeep_of(workspace); }

 private:
  // Once per backend: `bwrap --version` costs a process, the sweeps a scan
  // of /proc, of the cgroup folders and of the mounts.
  bwrap_features features_of(const fs::path& bwrap) {
    std::lock_guard lock(mutex_);
    if (!features_) {
      kill_orphaned_sandboxes();
      sweep_orphaned_cgroups(detect_cgroups());
      if (::geteuid() == 0) sweep_orphaned_workspace_mounts();
      features_ = detect_bwrap_features(bwrap);
    }
    return *features_;
  }

  bwrap_options options_;
  std::mutex mutex_;
  std::optional<bwrap_features> features_;
};

}  // namespace

std::unique_ptr<sandbox_backend> make_bwrap_backend(bwrap_options options) {
  return std::make_unique<bwrap_backend>(std::move(options));
}

}  // namespace cairn::runtime
