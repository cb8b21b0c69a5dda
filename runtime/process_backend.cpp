// The "none" backend: the agent as a plain child process of the host, for
// machines without bubblewrap when the user explicitly accepts no isolation.
// It still gets its own process group, the channel on fd 3, a minimal
// environment, the workspace as cwd and the rlimits; nothing else is hidden.

#include <fmt/format.h>

#include "runtime/agent_sdks.hpp"
#include "runtime/child_process.hpp"
#include "runtime/host_paths.hpp"
#include "runtime/no_follow.hpp"

namespace cairn::runtime {
namespace {

namespace fs = std::filesystem;

class process_sandbox final : public sandbox {
 public:
  process_sandbox(sandbox_spec spec, fs::path workspace, std::size_t max_frame)
      : spec_(std::move(spec)), workspace_(std::move(workspace)), max_frame_(max_frame) {}

  ~process_sandbox() override {
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

    spawn_request request;
    request.argv = {agent.string()};
    request.argv.insert(request.argv.end(), args.begin(), args.end());
    std::map<std::string, std::string> base = {
        {"PATH", "/usr/local/bin:/usr/bin:/bin"}, {"HOME", workspace_.string()}, {"LANG", "C.UTF-8"}};
    add_address_space_environment(base);  // no cgroup: RLIMIT_AS bounds each process
    auto env = agent_environment(spec_, std::move(base));
    // A Python agent imports the SDK from the host's copy.
    if (const auto& python = find_agent_sdks().python; !python.empty() && !env.contains("PYTHONPATH"))
      env["PYTHONPATH"] = python.string();
    for (const auto& [name, value] : env) request.env.push_back(name + "=" + value);
    request.cwd = workspace_;
    request.log_fd = log->writer();
    request.limits = spec_.limits;

    spawned_child child = spawn_child(request);
    log->close_writer();
    auto handle = std::make_shared<child_handle>();
    handle->pid = child.pid;
    handle->pidfd = std::move(child.pidfd);
    tracker_.track(handle);
    // No cgroup, no quota image: only deaths by an rlimit's signal tell.
    return std::make_unique<child_process>(handle, std::move(child.channel), max_frame_, std::move(log),
                                           std::make_unique<limit_watch>(spec_.limits, nullptr, nullptr));
  }

  void destroy() override {
    tracker_.kill_all();
    close_to_others(workspace_);
    open_log(spec_.log_file);  // sets its mode back to 0600: the agent may have fchmod'ed its stdout
  }

  std::vector<std::string> warnings() const override {
    return {"resource totals are per process only (--sandbox none has no cgroup): memory, processes and CPU "
            "time are bounded for each process by rlimits",
            fmt::format("workspace {} has no size quota (--sandbox none): files are bounded one by one "
                        "(limits.file_mb)",
                        workspace_.string())};
  }

 private:
  sandbox_spec spec_;
  fs::path workspace_;
  std::size_t max_frame_;
  child_tracker tracker_;
};

class process_backend final : public sandbox_backend {
 public:
  explicit process_backend(std::size_t max_frame) : max_frame_(max_frame) {}

  std::string name() const override { return "none"; }

  std::unique_ptr<sandbox> create(const sandbox_spec& spec) override {
    if (spec.log_file.empty())
      throw sandbox_error(sandbox_errc::bad_spec, "the sandbox spec has no log file");
    fs::path workspace = prepare_workspace(spec.workspace);
    return std::make_unique<process_sandbox>(spec, workspace, max_frame_);
  }

  std::vector<doctor_check> check() const override {
    return {{"sandbox", true,
             "--sandbox none runs agents as plain child processes with NO isolation: they can read and "
             "write everything this user can, and use the network",
             ""}};
  }

  // The workspace always is a plain folder.
  void release_workspace(const fs::path& workspace, const fs::path&) override { close_to_others(workspace); }
  workspace_upkeep upkeep(const fs::path&) const override { return {}; }

 private:
  std::size_t max_frame_;
};

}  // namespace

std::unique_ptr<sandbox_backend> make_process_backend(std::size_t max_frame) {
  return std::make_unique<process_backend>(max_frame ? max_frame : protocol::default_max_frame);
}

}  // namespace cairn::runtime
