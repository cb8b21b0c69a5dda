// Shared by the runtime tests: a temporary folder and a way to run the
// sandbox_probe program and collect its one report.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "runtime/cgroup.hpp"
#include "runtime/own_records.hpp"
#include "runtime/sandbox.hpp"
#include "runtime/workspace_quota.hpp"
#include "tests/capabilities.hpp"

namespace cairn::runtime::test {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// How long a test waits for what normally takes well under a second (a
// report, an exit, a breach): a loaded 2-core machine has taken over 10 s.
// Every wait ends as soon as its condition holds, so only a failure waits it out.
constexpr auto patience = 60s;

// A fresh folder under /tmp that others may enter (the sandbox uid must
// reach workspaces in it); removed with everything in it.
struct temp_dir {
  fs::path path;
  temp_dir() {
    char name[] = "/tmp/cairn-runtime-test-XXXXXX";
    REQUIRE(::mkdtemp(name) != nullptr);
    path = name;
    fs::permissions(path, fs::perms(0755));
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// How the fixtures' sandboxes are made: CAIRN_TEST_SANDBOXES=pooled takes
// each from a warm pool, =started from a pool that starts its agent ahead;
// otherwise each starts cold.
inline std::string sandbox_kind() {
  const char* kind = std::getenv("CAIRN_TEST_SANDBOXES");
  return kind ? kind : "cold";
}

// Pooled or started without root: a normal user's run with a workspace
// quota starts cold (its image is mounted through FUSE after the take, out
// of a pooled sandbox's sight), so these runs have none.
inline bool pooled_without_quota() { return sandbox_kind() != "cold" && ::geteuid() != 0; }

// Small quotas keep the tests fast: a 16 MiB workspace image (the least a
// policy allows) and 8 MiB tmpfs.
inline sandbox_spec make_spec(const temp_dir& dir) {
  sandbox_spec spec;
  spec.run_id = "run-test-1";
  spec.workspace = dir.path / "ws";
  spec.log_file = dir.path / "agent.log";
  if (!pooled_without_quota()) {
    spec.workspace_image = dir.path / "images" / "ws.img";
    spec.limits.max_workspace_bytes = 16u << 20;
  }
  spec.limits.max_tmp_bytes = 8u << 20;
  return spec;
}

// The capabilities some cases need; see tests/capabilities.hpp.
inline bool require_root(const std::string& why) {
  return testing::require_capability("root", ::geteuid() == 0, why);
}
inline bool require_cgroups() {
  return testing::require_capability("cgroups", detect_cgroups().mode != cgroup_mode::none,
                                     "sandbox totals and the orphan sweep work through cgroups");
}
inline bool require_quota() {
  return testing::require_capability(
      "quota", detect_workspace_quota().available && !pooled_without_quota(),
      pooled_without_quota() ? "a normal user's pooled sandboxes have no workspace image"
                             : "the workspace quota is an ext4 image, mounted through a loop device (root) or FUSE");
}

inline std::string unique_token(const char* prefix) {
  static std::atomic<int> counter{0};
  return std::string(prefix) + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
}

// A file on the host the sandbox must not see, outside /tmp: the sandbox's
// own /tmp would hide one there whatever its mounts are. Removed at the end.
struct host_secret {
  fs::path path = fs::path("/var/tmp") / (unique_token("cairn-host-secret") + ".txt");
  explicit host_secret(const std::string& content) {
    std::ofstream out(path);
    REQUIRE((out << content << std::flush));
  }
  ~host_secret() {
    std::error_code ec;
    fs::remove(path, ec);
  }
};

// The first report of a started probe; FAILs with the agent's log when the
// probe ends without one. The deadline only bounds a hung probe: a report
// ends the wait, and a busy machine can take many seconds over a tree walk.
inline json next_report(agent_process& process) {
  try {
    auto frame = process.io().receive(patience);
    if (!frame) FAIL("the probe sent nothing within " << patience.count() << " s; log: " << process.log_tail());
    return *frame;
  } catch (const channel_closed& e) {
    auto status = process.wait_for(5s);
    FAIL("the probe closed its channel without reporting (" << (status ? status->describe() : "still running")
                                                            << "); log: " << process.log_tail());
  }
  return {};
}

// Runs the probe with `args` to completion and returns its report.
inline json run_probe(sandbox& box, const std::vector<std::string>& args,
                      const fs::path& program = SANDBOX_PROBE) {
  auto process = box.exec(program, args);
  json report = next_report(*process);
  auto status = process->wait_for(patience);
  REQUIRE(status);
  INFO("log: " << process->log_tail());
  CHECK(status->describe() == "exited with code 0");
  return report;
}

// Polls check_limits() until it reports a breach or `limit` passes.
inline std::optional<limit_breach> wait_for_breach(agent_process& process, std::chrono::milliseconds limit = patience) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    if (auto breach = process.check_limits()) return breach;
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(20ms);
  }
}

// Host processes whose command line contains `token`.
inline int count_processes_with(const std::string& token) {
  int count = 0;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    // Plain read(): the process may vanish mid-read, which iostreams turn into a throw.
    int fd = ::open((entry.path() / "cmdline").c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    std::string cmdline(4096, '\0');
    ssize_t n = ::read(fd, cmdline.data(), cmdline.size());
    ::close(fd);
    cmdline.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
    if (cmdline.find(token) != std::string::npos) ++count;
  }
  return count;
}

// A record as a host that died leaves it: never removed. Held from a static
// so that LeakSanitizer sees it is kept on purpose (make test-sanitize).
inline const own_record& record_left_by_dead_host(const std::string& kind, const std::string& subject) {
  static auto* const left = new std::vector<std::unique_ptr<own_record>>;
  return *left->emplace_back(std::make_unique<own_record>(kind, subject));
}

// A sandbox whose agent, the probe, was started ahead by its pool with the
// one argument "ahead" and waits for its run. The first exec() of that
// program sends it what to do as its run's first frame (as a run's `start`
// reaches an SDK started ahead); anything else is passed on.
class started_sandbox final : public sandbox {
 public:
  started_sandbox(std::unique_ptr<sandbox> box, fs::path program, std::string run_id)
      : box_(std::move(box)), program_(std::move(program)), run_id_(std::move(run_id)) {}

  std::unique_ptr<agent_process> exec(const fs::path& program, const std::vector<std::string>& args) override {
    if (std::exchange(taken_, true)) return box_->exec(program, args);
    if (program != program_)
      FAIL("this sandbox's agent " << program_ << " was started ahead; the case runs " << program
                                   << " first: set spec.agent to it before create()");
    auto process = box_->exec(program, {"ahead"});
    auto hello = process->io().receive(patience);
    if (!hello || hello->value("t", "") != "hello")
      FAIL("the probe started ahead did not say hello; log: " << process->log_tail());
    process->io().send({{"t", "start"}, {"run_id", run_id_}, {"args", args}});
    return process;
  }
  void destroy() override { box_->destroy(); }
  void destroy_ending_run() override { box_->destroy_ending_run(); }
  std::vector<std::string> warnings() const override { return box_->warnings(); }
  bool pooled() const override { return box_->pooled(); }
  bool agent_started() const override { return box_->agent_started(); }

 private:
  std::unique_ptr<sandbox> box_;
  fs::path program_;
  std::string run_id_;
  bool taken_ = false;
};

// Under CAIRN_TEST_SANDBOXES=pooled (ctest runtime_test_pooled), every
// sandbox a fixture makes is taken from a warm pool made for that sandbox's
// own limits, not started cold: each case then attacks, and bounds, a pooled
// sandbox. One that production would start cold (a script agent's folder to
// bind; without root, a workspace that is not new and empty) starts cold here too.
//
// Under =started (ctest runtime_test_started), the pool also starts agents
// ahead (warm_pool_options::start_agents), and every sandbox a fixture makes
// for a new run comes running the probe (or spec.agent) already: each case
// then attacks, and bounds, an agent started before its run, in the sandbox
// it was started in. The pool learns which agent to start from a first run
// it then discards, as `cairn serve --prestart` learns it from the runs it
// serves. A run that production would not give a started agent (a workspace
// holding files) gets what production gives it.
class pool_backend final : public sandbox_backend {
 public:
  pool_backend(fs::path folder, bool start_agents) : folder_(std::move(folder)), start_agents_(start_agents) {}

  std::string name() const override { return "bwrap"; }
  std::unique_ptr<sandbox> create(const sandbox_spec& spec) override {
    bwrap_options options;
    const fs::path pool_folder = folder_ / ("pool-" + std::to_string(pools_.size()));
    options.warm = {1, pool_folder, spec.limits, start_agents_};
    auto& pool = *pools_.emplace_back(make_bwrap_backend(options));
    if (!pool.wait_warm(1, patience)) FAIL("the pool made no sandbox: " << pool.warm_error().value_or("(no error)"));
    return start_agents_ ? started(pool, pool_folder, spec) : pooled(pool, spec);
  }
  std::vector<doctor_check> check() const override { return cold_->check(); }
  void release_workspace(const fs::path& workspace, const fs::path& image) override {
    cold_->release_workspace(workspace, image);
  }
  workspace_upkeep upkeep(const fs::path& workspace) const override { return cold_->upkeep(workspace); }

 private:
  static std::unique_ptr<sandbox> pooled(sandbox_backend& pool, const sandbox_spec& spec) {
    std::error_code ec;
    const bool new_workspace = !fs::exists(spec.workspace, ec) || fs::is_empty(spec.workspace, ec);
    const bool poolable = spec.app_folder.empty() && (::geteuid() == 0 || new_workspace);
    auto box = pool.create(spec);
    if (poolable) REQUIRE(box->pooled());
    return box;
  }

  static std::unique_ptr<sandbox> started(sandbox_backend& pool, const fs::path& pool_folder, const sandbox_spec& spec) {
    sandbox_spec run = spec;
    if (run.agent.empty()) run.agent = SANDBOX_PROBE;
    run.agent_args = {"ahead"};
    // As bwrap_backend's agent_for(): only a new run, whose workspace is
    // new and empty and has no image yet.
    std::error_code ec;
    const bool startable = (!fs::exists(spec.workspace, ec) || fs::is_empty(spec.workspace, ec)) &&
                           (spec.workspace_image.empty() || !fs::exists(spec.workspace_image, ec));
    if (!startable) return pool.create(run);
    sandbox_spec first = run;
    first.run_id += "-first";
    first.workspace = pool_folder.string() + "-first";
    if (!first.workspace_image.empty()) first.workspace_image = pool_folder.string() + "-first.img";
    pool.create(first)->destroy();
    if (!pool.wait_warm(1, patience))
      FAIL("the pool started no agent ahead: " << pool.warm_error().value_or("(no error)"));
    auto box = pool.create(run);
    REQUIRE(box->agent_started());
    return std::make_unique<started_sandbox>(std::move(box), run.agent, run.run_id);
  }

  fs::path folder_;
  bool start_agents_;
  std::unique_ptr<sandbox_backend> cold_ = make_bwrap_backend();
  std::vector<std::unique_ptr<sandbox_backend>> pools_;  // outlive the sandboxes taken from them
};

inline std::unique_ptr<sandbox_backend> test_backend(const temp_dir& dir) {
  const std::string kind = sandbox_kind();
  if (kind == "pooled" || kind == "started") return std::make_unique<pool_backend>(dir.path, kind == "started");
  return make_bwrap_backend();
}

// A bwrap sandbox with a fresh workspace, for one test.
struct bwrap_fixture {
  temp_dir dir;
  std::unique_ptr<sandbox_backend> backend = test_backend(dir);
  sandbox_spec spec = make_spec(dir);
  std::unique_ptr<sandbox> box;

  bwrap_fixture() { box = backend->create(spec); }
  json probe(const std::vector<std::string>& args) { return run_probe(*box, args); }
  // The sandbox of a new run with `spec` as the case changed it (its
  // limits): a new workspace (and image), as a new run has, so that a pool
  // may give it a started agent as it gave the first.
  void new_run() {
    box.reset();
    const std::string name = "ws-" + std::to_string(++runs_);
    spec.workspace = dir.path / name;
    if (!spec.workspace_image.empty()) spec.workspace_image = dir.path / "images" / (name + ".img");
    box = backend->create(spec);
  }

 private:
  int runs_ = 0;
};

}  // namespace cairn::runtime::test
