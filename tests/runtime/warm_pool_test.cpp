// The warm pool: a run takes a sandbox made before it asked, and sees what
// a cold sandbox would show it, and nothing of any run before it.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <mutex>
#include <thread>

#include "runtime/cgroup.hpp"
#include "runtime/warm_pool.hpp"
#include "tests/runtime/sandbox_fixture.hpp"

namespace cairn::runtime::test {
namespace {

std::unique_ptr<sandbox_backend> warm_backend(const temp_dir& dir, const resource_limits& limits, std::size_t size) {
  bwrap_options options;
  options.warm.size = size;
  options.warm.folder = dir.path / "warm";
  options.warm.limits = limits;
  auto backend = make_bwrap_backend(options);
  if (!backend->wait_warm(size, patience))
    FAIL("the pool made no sandbox: " << backend->warm_error().value_or("(no error)"));
  return backend;
}

sandbox_spec spec_for(const temp_dir& dir, const std::string& run) {
  sandbox_spec spec = make_spec(dir);
  spec.run_id = run;
  spec.workspace = dir.path / "ws" / run;
  // A normal user's run with a quota image starts cold (see "a run with a
  // workspace quota is held to it"): its pooled runs have none.
  if (::geteuid() == 0) spec.workspace_image = dir.path / "images" / (run + ".img");
  else spec.workspace_image.clear();
  spec.log_file = dir.path / (run + ".log");
  return spec;
}

// A pool whose sandboxes start the agent of the last run that could take one.
std::unique_ptr<sandbox_backend> starting_backend(const temp_dir& dir, const resource_limits& limits,
                                                  std::size_t size = 1) {
  bwrap_options options;
  options.warm.size = size;
  options.warm.folder = dir.path / "warm";
  options.warm.limits = limits;
  options.warm.start_agents = true;
  auto backend = make_bwrap_backend(options);
  if (!backend->wait_warm(size, patience))
    FAIL("the pool made no sandbox: " << backend->warm_error().value_or("(no error)"));
  return backend;
}

// Runs `program` in a sandbox of `backend` for run `run` as an agent waiting
// for its run would: sends it a start naming the run, returns its report.
// `pooled` and `started`: whether its sandbox came from the pool, and with
// the agent started already.
json await_run(sandbox_backend& backend, const temp_dir& dir, const std::string& run, const fs::path& program,
               bool* pooled = nullptr, bool* started = nullptr,
               const std::vector<std::string>& args = {"await_run"}) {
  auto spec = spec_for(dir, run);
  spec.agent = program;
  spec.agent_args = args;
  auto box = backend.create(spec);
  if (pooled) *pooled = box->pooled();
  if (started) *started = box->agent_started();
  auto process = box->exec(program, spec.agent_args);
  CHECK(next_report(*process)["t"] == "hello");
  process->io().send({{"t", "start"}, {"run_id", run}});
  json report = next_report(*process);
  auto status = process->wait_for(patience);
  REQUIRE(status);
  INFO("log: " << process->log_tail());
  CHECK(status->describe() == "exited with code 0");
  // The run ends: its files leave its image (if it has one) for its folder.
  box->destroy();
  backend.release_workspace(spec.workspace, spec.workspace_image);
  return report;
}

bool has_env(const json& report, const std::string& entry) {
  std::vector<std::string> env = report["detail"]["env"];
  return std::find(env.begin(), env.end(), entry) != env.end();
}

std::vector<std::string> sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

std::string file_text(const fs::path& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_CASE("warm pool: a pooled sandbox shows the agent what a cold one would") {
  temp_dir dir;
  auto cold_spec = spec_for(dir, "run-cold");
  auto cold_backend = make_bwrap_backend();
  auto cold = cold_backend->create(cold_spec);
  CHECK_FALSE(cold->pooled());
  json cold_status = run_probe(*cold, {"status"})["detail"];

  auto warm_spec = spec_for(dir, "run-warm");
  auto backend = warm_backend(dir, warm_spec.limits, 1);
  auto warm = backend->create(warm_spec);
  REQUIRE(warm->pooled());
  json warm_status = run_probe(*warm, {"status"})["detail"];

  CHECK(warm_status["cwd"] == "/workspace");
  CHECK(warm_status["hostname"] == cold_status["hostname"]);
  std::vector<std::string> env = warm_status["env"];
  CHECK(std::find(env.begin(), env.end(), "CAIRN_RUN_ID=run-warm") != env.end());
  std::erase(env, "CAIRN_RUN_ID=run-warm");
  std::vector<std::string> cold_env = cold_status["env"];
  std::erase(cold_env, "CAIRN_RUN_ID=run-cold");
  CHECK(sorted(env) == sorted(cold_env));
  CHECK(sorted(warm_status["fds"]) == std::vector<std::string>{"0", "1", "2", "3"});

  // Its workspace is the run's: what the agent writes, the host finds there.
  CHECK(run_probe(*warm, {"write", "/workspace/out.txt", "from a pooled sandbox"})["ok"] == true);
  CHECK(file_text(warm_spec.workspace / "out.txt") == "from a pooled sandbox");
  // The agent's output reaches the run's log: here a shell's complaint
  // that the probe's child cannot open the script "status".
  run_probe(*warm, {"exec", "/bin/sh"});
  CHECK(file_text(warm_spec.log_file).find("status") != std::string::npos);
}

TEST_CASE("warm pool: a run's files already in its workspace are there in a pooled sandbox, or it starts cold") {
  temp_dir dir;
  auto spec = spec_for(dir, "run-files");
  fs::create_directories(spec.workspace);
  std::ofstream(spec.workspace / "input.txt") << "given by the host";
  auto backend = warm_backend(dir, spec.limits, 1);
  auto box = backend->create(spec);
  // As root the workspace is mounted into a pooled sandbox; a normal user's
  // pooled sandbox only takes a new, empty workspace.
  CHECK(box->pooled() == (::geteuid() == 0));
  json read = run_probe(*box, {"read", "/workspace/input.txt"});
  CHECK(read["detail"] == "given by the host");
}

TEST_CASE("warm pool: nothing of one run reaches the next, through the pool's next sandbox") {
  temp_dir dir;
  auto first_spec = spec_for(dir, "run-first");
  auto backend = warm_backend(dir, first_spec.limits, 1);
  const std::string token = unique_token("cairn-warm-leftover");
  {
    auto first = backend->create(first_spec);
    REQUIRE(first->pooled());
    CHECK(run_probe(*first, {"write", "/tmp/left-in-tmp", "first"})["ok"] == true);
    CHECK(run_probe(*first, {"write", "/dev/shm/left-in-shm", "first"})["ok"] == true);
    CHECK(run_probe(*first, {"write", "/workspace/left-in-workspace", "first"})["ok"] == true);
    auto lingering = first->exec(SANDBOX_PROBE, {"grandchild", token});
    REQUIRE(next_report(*lingering)["ok"] == true);
    REQUIRE(count_processes_with(token) > 0);
  }  // destroyed with its processes
  CHECK(count_processes_with(token) == 0);

  auto second_spec = spec_for(dir, "run-second");
  REQUIRE(backend->wait_warm(1, patience));
  auto second = backend->create(second_spec);
  REQUIRE(second->pooled());
  for (const char* path : {"/tmp/left-in-tmp", "/dev/shm/left-in-shm", "/workspace/left-in-workspace"})
    CHECK(run_probe(*second, {"read", path})["ok"] == false);
  // Its pid namespace holds bwrap's pid 1 and the probe: nobody else.
  CHECK(run_probe(*second, {"pids"})["detail"].size() == 2);
  json env = run_probe(*second, {"status"})["detail"]["env"];
  CHECK(std::find(env.begin(), env.end(), "CAIRN_RUN_ID=run-second") != env.end());
  CHECK(std::find(env.begin(), env.end(), "CAIRN_RUN_ID=run-first") == env.end());
}

TEST_CASE("warm pool: an agent cannot change its own program on the host, even when its uid owns the file") {
  temp_dir dir;
  // A program the sandbox's uid owns: the caller's own file without root, as
  // root one given to the sandbox uid.
  const fs::path program = dir.path / "probe-copy";
  fs::copy_file(SANDBOX_PROBE, program);
  fs::permissions(program, fs::perms(0755));
  if (auto user = resolve_sandbox_user()) REQUIRE(::chown(program.c_str(), user->uid, user->gid) == 0);
  auto spec = spec_for(dir, "run-chmod");
  auto backend = warm_backend(dir, spec.limits, 1);
  auto box = backend->create(spec);
  REQUIRE(box->pooled());
  run_probe(*box, {"chmod_self"}, program);
  CHECK((fs::status(program).permissions() & fs::perms::all) == fs::perms(0755));
  // A cold sandbox binds it read-only.
  auto cold = make_bwrap_backend()->create(spec_for(dir, "run-chmod-cold"));
  run_probe(*cold, {"chmod_self"}, program);
  CHECK((fs::status(program).permissions() & fs::perms::all) == fs::perms(0755));
}

TEST_CASE("warm pool: a program changed on disk runs as it is now, never from a copy of what it was") {
  temp_dir dir;
  // A program the sandbox's uid owns, so that the launcher runs it from a
  // sealed copy in memory (one per version of the file, kept between runs).
  const fs::path program = dir.path / "agent";
  const auto own = [&] {
    fs::permissions(program, fs::perms(0755));
    if (auto user = resolve_sandbox_user()) REQUIRE(::chown(program.c_str(), user->uid, user->gid) == 0);
  };
  fs::copy_file(SANDBOX_PROBE, program);
  own();
  auto backend = warm_backend(dir, spec_for(dir, "limits").limits, 1);
  const auto pooled_run = [&](const std::string& run) {
    REQUIRE(backend->wait_warm(1, patience));
    auto box = backend->create(spec_for(dir, run));
    REQUIRE(box->pooled());
    return box;
  };
  CHECK(run_probe(*pooled_run("run-1"), {"status"}, program)["ok"] == true);
  CHECK(run_probe(*pooled_run("run-2"), {"status"}, program)["ok"] == true);  // the same copy
  // Rewritten in place (the same file): no longer a program.
  std::ofstream(program, std::ios::trunc) << "not a program\n";
  {
    auto box = pooled_run("run-3");
    auto process = box->exec(program, {"status"});
    auto status = process->wait_for(patience);
    REQUIRE(status);
    CHECK(status->describe() == "exited with code 127");  // the launcher could not execute it
  }
  // Replaced by a new file: the program again.
  fs::remove(program);
  fs::copy_file(SANDBOX_PROBE, program);
  own();
  CHECK(run_probe(*pooled_run("run-4"), {"status"}, program)["ok"] == true);
}

TEST_CASE("warm pool: a run whose limits differ from the pool's starts cold, with its own limits") {
  temp_dir dir;
  auto spec = spec_for(dir, "run-other-limits");
  auto backend = warm_backend(dir, spec.limits, 1);
  spec.limits.max_open_files = 64;
  auto box = backend->create(spec);
  CHECK_FALSE(box->pooled());
  CHECK(run_probe(*box, {"status"})["ok"] == true);
}

TEST_CASE("warm pool: a run with a workspace quota is held to it, pooled (root) or cold (FUSE)") {
  if (!require_quota()) return;
  temp_dir dir;
  auto spec = spec_for(dir, "run-quota");
  spec.workspace_image = dir.path / "images" / "run-quota.img";
  auto backend = warm_backend(dir, spec.limits, 1);
  auto box = backend->create(spec);
  // Root's pooled sandbox holds an image mounted already, which becomes the
  // run's; a normal user's image is mounted through FUSE after the take,
  // where a pooled sandbox would not see it: that run starts cold.
  CHECK(box->pooled() == (::geteuid() == 0));
  auto process = box->exec(SANDBOX_PROBE, {"fill", "/workspace/big"});
  json report = next_report(*process);
  INFO(report.dump());
  CHECK(report["detail"]["error"] == "No space left on device");
  CHECK(report["detail"]["written"].get<std::uint64_t>() <= workspace_image_size(16u << 20));
  auto breach = wait_for_breach(*process);
  REQUIRE(breach);
  CHECK(breach->limit == "workspace");
}

TEST_CASE("warm pool: a pooled folder takes a new or empty workspace's place, never a full one or a link") {
  temp_dir dir;
  fs::create_directories(dir.path / "warm");
  fs::create_directories(dir.path / "ws");
  const fs::path pooled = dir.path / "warm" / "pooled";
  SECTION("a workspace not made yet: the pooled folder moves into its place, and stays there after the pooled object") {
    {
      warm_folder folder(pooled, false);
      std::ofstream(pooled / "agent.txt") << "started ahead";
      REQUIRE(folder.become(dir.path / "ws" / "run"));
      CHECK(file_text(dir.path / "ws" / "run" / "agent.txt") == "started ahead");
      CHECK_FALSE(fs::exists(fs::symlink_status(pooled)));
    }
    CHECK(file_text(dir.path / "ws" / "run" / "agent.txt") == "started ahead");
    CHECK(fs::is_empty(dir.path / "warm"));
  }
  SECTION("a dangling link where the workspace is to be: refused, the link left as it was") {
    warm_folder folder(pooled, false);
    fs::create_directory_symlink(dir.path / "nowhere", dir.path / "ws" / "run");
    CHECK_FALSE(folder.become(dir.path / "ws" / "run"));
    CHECK(fs::is_symlink(dir.path / "ws" / "run"));
    CHECK_FALSE(fs::exists(dir.path / "nowhere"));
    CHECK(fs::is_directory(fs::symlink_status(pooled)));
  }
  SECTION("an empty workspace: the pooled folder is the workspace, and the empty one goes with the pooled object") {
    {
      warm_folder folder(pooled, false);
      std::ofstream(pooled / "agent.txt") << "started ahead";
      fs::create_directory(dir.path / "ws" / "run");
      REQUIRE(folder.become(dir.path / "ws" / "run"));
      CHECK(file_text(dir.path / "ws" / "run" / "agent.txt") == "started ahead");
    }
    CHECK(file_text(dir.path / "ws" / "run" / "agent.txt") == "started ahead");
    CHECK(fs::is_empty(dir.path / "warm"));
  }
  SECTION("a workspace that holds a file: refused, nothing moved") {
    warm_folder folder(pooled, false);
    fs::create_directory(dir.path / "ws" / "run");
    std::ofstream(dir.path / "ws" / "run" / "mine.txt") << "the run's";
    CHECK_FALSE(folder.become(dir.path / "ws" / "run"));
    CHECK(file_text(dir.path / "ws" / "run" / "mine.txt") == "the run's");
    CHECK(fs::is_empty(pooled));
  }
  SECTION("a workspace that is a link to an empty folder: refused, the link and its target left as they were") {
    warm_folder folder(pooled, false);
    fs::create_directory(dir.path / "elsewhere");
    fs::create_directory_symlink(dir.path / "elsewhere", dir.path / "ws" / "run");
    CHECK_FALSE(folder.become(dir.path / "ws" / "run"));
    CHECK(fs::is_symlink(dir.path / "ws" / "run"));
    CHECK(fs::is_directory(fs::symlink_status(pooled)));
    CHECK(fs::is_empty(dir.path / "elsewhere"));
  }
}

TEST_CASE("warm pool: a pooled folder's log made ahead becomes a new run's log, never an earlier attempt's") {
  temp_dir dir;
  fs::create_directories(dir.path / "warm");
  const fs::path pooled = dir.path / "warm" / "pooled", logs = dir.path / "logs";
  SECTION("no log yet: the one made ahead is moved there, open for appending, mode 0600") {
    {
      warm_folder folder(pooled, false);
      unique_fd log = folder.give_log(logs / "run.log");
      REQUIRE(log);
      REQUIRE(::write(log.get(), "out\n", 4) == 4);
    }
    CHECK(file_text(logs / "run.log") == "out\n");
    CHECK((fs::status(logs / "run.log").permissions() & fs::perms::all) ==
          (fs::perms::owner_read | fs::perms::owner_write));
    CHECK(fs::is_empty(dir.path / "warm"));
  }
  SECTION("a log from an earlier attempt: left as it is, and the one made ahead goes with the folder") {
    fs::create_directories(logs);
    std::ofstream(logs / "run.log") << "attempt 1\n";
    {
      warm_folder folder(pooled, false);
      CHECK_FALSE(folder.give_log(logs / "run.log"));
    }
    CHECK(file_text(logs / "run.log") == "attempt 1\n");
    CHECK(fs::is_empty(dir.path / "warm"));
  }
}

TEST_CASE("warm pool with agents started: the agent's next run takes one running it, in the run's own workspace") {
  temp_dir dir;
  auto backend = starting_backend(dir, spec_for(dir, "limits").limits);
  // The first run of the agent finds no sandbox running it: it takes one
  // whose launcher starts it, and tells the pool which agent to start.
  bool pooled = false;
  json first = await_run(*backend, dir, "run-1", SANDBOX_PROBE, &pooled);
  CHECK(pooled);
  CHECK(has_env(first, "CAIRN_RUN_ID=run-1"));
  REQUIRE(backend->wait_warm(1, patience));

  json second = await_run(*backend, dir, "run-2", SANDBOX_PROBE, &pooled);
  CHECK(pooled);
  // Started before its run existed: no run id in its environment, only in start.
  CHECK_FALSE(has_env(second, "CAIRN_RUN_ID=run-2"));
  CHECK_FALSE(has_env(second, "CAIRN_RUN_ID=run-1"));
  std::vector<std::string> env = second["detail"]["env"];
  std::vector<std::string> first_env = first["detail"]["env"];
  std::erase(first_env, "CAIRN_RUN_ID=run-1");
  CHECK(sorted(env) == sorted(first_env));
  // Its working folder is the run's workspace: the file it wrote after the
  // start is there, and what it said while it waited is in the run's log.
  CHECK(second["detail"]["cwd"] == "/workspace");
  CHECK(file_text(dir.path / "ws" / "run-2" / "run.txt") == "run-2");
  CHECK(file_text(dir.path / "run-2.log").find("probe: waiting for the host's first frame") != std::string::npos);
  CHECK(sorted(second["detail"]["fds"]) == std::vector<std::string>{"0", "1", "2", "3"});
  // Nothing of the first run: its file is in its own workspace only.
  CHECK(file_text(dir.path / "ws" / "run-1" / "run.txt") == "run-1");
}

TEST_CASE("warm pool with agents started: a run whose workspace holds files takes a kept launcher, never an agent") {
  temp_dir dir;
  // A pool of 4 keeps one sandbox whose launcher waits beside 3 running the agent.
  auto backend = starting_backend(dir, spec_for(dir, "limits").limits, 4);
  await_run(*backend, dir, "run-new", SANDBOX_PROBE);
  REQUIRE(backend->wait_warm(4, patience));
  // A run resumed, say: its files are in its folder (its image released).
  auto spec = spec_for(dir, "run-resumed");
  spec.agent = SANDBOX_PROBE;
  spec.agent_args = {"await_run"};
  fs::create_directories(spec.workspace);
  std::ofstream(spec.workspace / "input.txt") << "from an earlier attempt";
  auto box = backend->create(spec);
  CHECK_FALSE(box->agent_started());
  // As root a pooled sandbox shows it the run's files; a normal user's run
  // with files starts cold.
  CHECK(box->pooled() == (::geteuid() == 0));
  auto process = box->exec(SANDBOX_PROBE, {"read", "/workspace/input.txt"});
  CHECK(next_report(*process)["detail"] == "from an earlier attempt");
  // A new run of the agent still takes one running it.
  bool pooled = false;
  json report = await_run(*backend, dir, "run-next", SANDBOX_PROBE, &pooled);
  CHECK(pooled);
  CHECK_FALSE(has_env(report, "CAIRN_RUN_ID=run-next"));
}

TEST_CASE("warm pool with agents started: a program changed on disk is started anew, not taken from the pool") {
  temp_dir dir;
  const fs::path program = dir.path / "agent";
  fs::copy_file(SANDBOX_PROBE, program);
  fs::permissions(program, fs::perms(0755));
  auto backend = starting_backend(dir, spec_for(dir, "limits").limits);
  await_run(*backend, dir, "run-old", program);
  REQUIRE(backend->wait_warm(1, patience));
  // A new build of the agent: another file under the same name.
  fs::remove(program);
  fs::copy_file(SANDBOX_PROBE, program);
  fs::permissions(program, fs::perms(0755));
  json report = await_run(*backend, dir, "run-new", program);
  CHECK(has_env(report, "CAIRN_RUN_ID=run-new"));  // started for this run
  CHECK(file_text(dir.path / "ws" / "run-new" / "run.txt") == "run-new");
}

TEST_CASE("warm pool with agents started: a sandbox no run takes leaves nothing, whatever its agent wrote") {
  temp_dir dir;
  auto backend = starting_backend(dir, spec_for(dir, "limits").limits);
  const fs::path litterer = dir.path / "litterer";
  fs::copy_file(SANDBOX_PROBE, litterer);
  fs::permissions(litterer, fs::perms(0755));
  // A run of the litterer: from then on the pool starts it, and it leaves
  // a file in a folder it makes unwritable, then makes /workspace so too.
  auto spec = spec_for(dir, "run-litter");
  spec.agent = litterer;
  spec.agent_args = {"lock_and_await"};
  {
    auto box = backend->create(spec);
    auto process = box->exec(litterer, spec.agent_args);
    CHECK(next_report(*process)["t"] == "hello");
    process->io().send({{"t", "start"}, {"run_id", "run-litter"}});
    CHECK(next_report(*process)["ok"] == true);
  }
  REQUIRE(backend->wait_warm(1, patience));
  // A run of another agent: the pool's littered sandbox goes, folder and all.
  await_run(*backend, dir, "run-other", SANDBOX_PROBE);
  REQUIRE(backend->wait_warm(1, patience));
  auto leftovers = [&] {
    std::size_t n = 0;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir.path / "warm")) n += fs::exists(entry.path() / "locked", ec);
    return n;
  };
  const auto deadline = std::chrono::steady_clock::now() + patience;
  while (leftovers() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(leftovers() == 0);
}

TEST_CASE("warm pool with agents started: an agent that ends before it speaks is not started ahead again at once") {
  temp_dir dir;
  auto backend = starting_backend(dir, spec_for(dir, "limits").limits);
  auto spec = spec_for(dir, "run-exit-1");
  spec.agent = "/usr/bin/false";
  auto run = [&](const std::string& id) {
    auto s = spec;
    s.run_id = id;
    s.workspace = dir.path / "ws" / id;
    s.log_file = dir.path / (id + ".log");
    if (!s.workspace_image.empty()) s.workspace_image = dir.path / "images" / (id + ".img");
    auto box = backend->create(s);
    auto process = box->exec(s.agent, {});
    auto status = process->wait_for(patience);
    REQUIRE(status);
    CHECK(status->describe() == "exited with code 1");
    return box->pooled();
  };
  CHECK(run("run-exit-1"));
  // The pool tried to start it ahead, saw it end, and went on without it.
  const auto deadline = std::chrono::steady_clock::now() + patience;
  while (!backend->warm_error() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  REQUIRE(backend->warm_error());
  CHECK(backend->warm_error()->find("ended before it said anything") != std::string::npos);
  REQUIRE(backend->wait_warm(1, patience));
  CHECK(run("run-exit-2"));  // a sandbox whose launcher starts it, as before
}

namespace {

// Calls `done` until it is true or `patience` passes; its last answer.
template <class F>
bool within_patience(F done) {
  const auto deadline = std::chrono::steady_clock::now() + patience;
  while (!done() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  return done();
}

}  // namespace

TEST_CASE("warm pool with agents started: an agent that spins while it waits is ended, and not started ahead again "
          "at once") {
  temp_dir dir;
  auto backend = starting_backend(dir, spec_for(dir, "limits").limits);
  // The spinner forks a process that burns a CPU, then says hello and waits
  // for its run, as a well-behaved agent started ahead does.
  const std::string marker = "spinner-" + std::to_string(::getpid()) + "-" + dir.path.filename().string();
  const std::vector<std::string> spinner = {"spin_then_await", marker};
  // Its first run tells the pool to start it ahead.
  bool pooled = false, started = false;
  await_run(*backend, dir, "run-spin-1", SANDBOX_PROBE, &pooled, &started, spinner);
  // Started ahead, it spins with no run to charge: the pool ends it, says why,
  // and its spinning process is gone.
  CHECK(within_patience([&] {
    return backend->warm_error() && backend->warm_error()->find("more than a waiting agent may") != std::string::npos;
  }));
  INFO("the pool's last error: " << backend->warm_error().value_or("(none)"));
  CHECK_THAT(backend->warm_error().value_or(""),
             Catch::Contains("of CPU in the") && Catch::Contains("not started ahead for 60 s"));
  CHECK(within_patience([&] { return count_processes_with(marker) == 0; }));
  // Not started ahead again at once: its next run takes a launcher.
  REQUIRE(backend->wait_warm(1, patience));
  await_run(*backend, dir, "run-spin-2", SANDBOX_PROBE, &pooled, &started, spinner);
  CHECK(pooled);
  CHECK_FALSE(started);
  CHECK(within_patience([&] { return count_processes_with(marker) == 0; }));
  // An agent that waits quietly is still started ahead, and stays pooled
  // through the checks that ended the spinner.
  await_run(*backend, dir, "run-quiet-1", SANDBOX_PROBE);
  REQUIRE(backend->wait_warm(1, patience));
  std::this_thread::sleep_for(3 * warm_pool::idle_check_interval);
  await_run(*backend, dir, "run-quiet-2", SANDBOX_PROBE, &pooled, &started);
  CHECK(pooled);
  CHECK(started);
}

TEST_CASE("warm pool with agents started: a refused agent is asked for again after a pause, longer each time",
          "[cold]") {
  // The pool alone, with a maker that refuses the agent twice, then starts
  // it (no sandbox: only when the pool asks for what is tested here).
  using clock = std::chrono::steady_clock;
  const auto pause = std::chrono::milliseconds(500);
  auto agent = std::make_shared<warm_agent>();
  agent->program = "/usr/bin/agent";
  std::mutex m;
  std::vector<clock::time_point> asked, refused;  // for the agent
  warm_pool pool(
      1,
      [&](std::shared_ptr<const warm_agent> wanted) {
        auto made = std::make_unique<warm_sandbox>();
        if (!wanted) return made;  // a launcher's
        std::lock_guard lock(m);
        asked.push_back(clock::now());
        if (asked.size() <= 2) {
          refused.push_back(clock::now());
          throw sandbox_error(sandbox_errc::spawn_failed, "the agent ended before it said anything");
        }
        made->agent = wanted;
        return made;
      },
      /*start_agents=*/true, pause);
  const auto count = [&](const auto& v) {
    std::lock_guard lock(m);
    return v.size();
  };
  const auto at = [&](const auto& v, std::size_t i) {
    std::lock_guard lock(m);
    return v.at(i);
  };
  // Asks as runs of the agent do until the pool has asked `n` times.
  const auto asked_for = [&](std::size_t n) {
    const auto deadline = clock::now() + patience * 4;
    while (count(asked) < n && clock::now() < deadline) {
      pool.take(agent, false);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return count(asked) >= n;
  };
  REQUIRE(asked_for(1));
  // The maker counts the ask before it refuses; the pool records the refusal after.
  const auto told_by = clock::now() + patience;
  while (!pool.last_error() && clock::now() < told_by) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(pool.last_error());
  // Refused: asked again only once its pause is over, then after twice as long.
  REQUIRE(asked_for(2));
  CHECK(at(asked, 1) - at(refused, 0) >= pause);
  REQUIRE(asked_for(3));
  CHECK(at(asked, 2) - at(refused, 1) >= 2 * pause);
  // Started this time: its runs take it.
  const auto deadline = clock::now() + patience;
  std::unique_ptr<warm_sandbox> taken;
  while (!taken && clock::now() < deadline) {
    taken = pool.take(agent, false);
    if (!taken) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  REQUIRE(taken);
  CHECK(taken->agent == agent);
}

TEST_CASE("warm pool: a host killed with a full pool leaves nothing the next start does not sweep", "[serial]") {
  temp_dir dir;
  const fs::path pool = dir.path / "warm";
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  pid_t host = ::fork();
  REQUIRE(host >= 0);
  if (host == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlives the test
    ::close(ready[0]);
    bwrap_options options;
    options.warm.size = 2;
    options.warm.folder = pool;
    options.warm.limits = make_spec(dir).limits;
    auto backend = make_bwrap_backend(options);
    char ok = backend->wait_warm(2, patience) ? '1' : '0';
    (void)!::write(ready[1], &ok, 1);
    for (;;) ::pause();
  }
  ::close(ready[1]);
  char ok = 0;
  const bool told = ::read(ready[0], &ok, 1) == 1;
  ::close(ready[0]);
  // The dead host's: "PID-N" folders, "PID-N.log" logs made ahead, "PID-N.img" images (the image
  // template beside them is shared by every host).
  auto left = [&] {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(pool))
      if (entry.path().filename().string().starts_with(std::to_string(host) + "-"))
        names.push_back(entry.path().filename());
    return names;
  };
  // Two sandboxes' folders (and their images, with a quota).
  const std::size_t made = left().size();
  ::kill(host, SIGKILL);
  ::waitpid(host, nullptr, 0);
  REQUIRE(told);
  REQUIRE(ok == '1');
  CHECK(made >= 2);
  const std::string prefix = std::to_string(host) + "-";

  // The next host's first start sweeps: the folders, their mounts, the cgroups.
  bwrap_fixture next;
  CHECK(run_probe(*next.box, {"status"})["ok"] == true);
  CHECK(left().empty());
  CHECK(file_text("/proc/self/mountinfo").find(pool.string()) == std::string::npos);
  for (const auto& parent : detect_cgroups().parents)
    for (const auto& entry : fs::directory_iterator(parent))
      CHECK(entry.path().filename().string().find("warm-" + prefix) == std::string::npos);
}

}  // namespace cairn::runtime::test
