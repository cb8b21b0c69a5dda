#include <signal.h>
#include <sys/socket.h>

#include <thread>

#include "runtime/agent_sdks.hpp"
#include "tests/runtime/sandbox_fixture.hpp"

namespace cairn::runtime::test {

TEST_CASE("process backend: the probe runs in the workspace with a minimal environment") {
  temp_dir dir;
  ::setenv("CAIRN_TEST_SECRET", "hunter2", 1);
  auto box = make_process_backend()->create(make_spec(dir));
  json status = run_probe(*box, {"status"})["detail"];
  json env_report = run_probe(*box, {"env", "2retnuh"});
  ::unsetenv("CAIRN_TEST_SECRET");

  fs::path workspace = fs::canonical(dir.path / "ws");
  CHECK(status["cwd"] == workspace.string());
  std::vector<std::string> env = status["env"];
  std::sort(env.begin(), env.end());
  std::vector<std::string> expected{"CAIRN_CHANNEL_FD=3",
                                    "CAIRN_RUN_ID=run-test-1",
                                    "HOME=" + workspace.string(),
                                    "LANG=C.UTF-8",
                                    "MALLOC_ARENA_MAX=2",
                                    "NODE_OPTIONS=--disable-wasm-trap-handler",
                                    "PATH=/usr/local/bin:/usr/bin:/bin"};
  // A Python agent imports the SDK from the host's copy.
  if (!find_agent_sdks().python.empty()) expected.push_back("PYTHONPATH=" + find_agent_sdks().python.string());
  CHECK(env == expected);
  std::vector<std::string> fds = status["fds"];
  std::sort(fds.begin(), fds.end());
  CHECK(fds == std::vector<std::string>{"0", "1", "2", "3"});
  // Only its own environment is checked: without a pid namespace the probe sees the test's.
  CHECK(std::find(env_report["detail"]["found_in"].begin(), env_report["detail"]["found_in"].end(),
                  "environ") == env_report["detail"]["found_in"].end());
}

TEST_CASE("process backend: the channel carries frames both ways") {
  temp_dir dir;
  auto box = make_process_backend()->create(make_spec(dir));
  auto process = box->exec(SANDBOX_PROBE, {"echo"});
  for (int i = 0; i < 3; ++i) {
    process->io().send({{"t", "ack"}, {"seq", i}});
    auto reply = process->io().receive(patience);
    REQUIRE(reply);
    CHECK(*reply == json{{"t", "ack"}, {"seq", i}, {"echoed", true}});
  }
  ::shutdown(process->io().fd(), SHUT_WR);  // the probe exits at EOF
  auto status = process->wait_for(patience);
  REQUIRE(status);
  CHECK(status->describe() == "exited with code 0");
  CHECK_THROWS_AS(process->io().receive(1s), channel_closed);
}

TEST_CASE("process backend: kill() ends the agent's process group") {
  temp_dir dir;
  auto box = make_process_backend()->create(make_spec(dir));
  std::string token = unique_token("cairn-none-kill-token");
  auto process = box->exec(SANDBOX_PROBE, {"grandchild", token});
  REQUIRE(next_report(*process)["ok"] == true);
  CHECK(count_processes_with(token) == 2);
  CHECK(process->kill().describe() == "killed by signal 9 (SIGKILL)");
  CHECK(count_processes_with(token) == 0);
}

TEST_CASE("process backend: the agent dies with the thread that started it") {
  temp_dir dir;
  auto box = make_process_backend()->create(make_spec(dir));
  std::unique_ptr<agent_process> process;
  std::thread([&] {
    process = box->exec(SANDBOX_PROBE, {"grandchild", unique_token("cairn-none-orphan")});
  }).join();
  auto status = process->wait_for(patience);
  REQUIRE(status);
  CHECK(status->describe() == "killed by signal 9 (SIGKILL)");
}

TEST_CASE("process backend: rlimits apply") {
  temp_dir dir;
  sandbox_spec spec = make_spec(dir);
  spec.limits.max_memory_bytes = 256u << 20;
  auto box = make_process_backend()->create(spec);
  CHECK(run_probe(*box, {"alloc", std::to_string(16u << 20)})["ok"] == true);
  CHECK(run_probe(*box, {"alloc", std::to_string(1u << 30)})["ok"] == false);
}

TEST_CASE("process backend: deaths by an rlimit's signal are limit breaches") {
  temp_dir dir;
  sandbox_spec spec = make_spec(dir);
  spec.limits.max_file_bytes = 1u << 20;
  auto backend = make_process_backend();
  auto box = backend->create(spec);
  auto process = box->exec(SANDBOX_PROBE, {"fill", (dir.path / "big").string()});
  auto status = process->wait_for(patience);
  REQUIRE(status);
  CHECK(status->signal == SIGXFSZ);
  auto breach = process->check_limits();
  REQUIRE(breach);
  CHECK(breach->limit == "file_size");
  CHECK_THAT(breach->message, Catch::Contains("limits.file_mb"));

  process = box->exec(SANDBOX_PROBE, {"status"});
  REQUIRE(process->wait_for(patience));
  CHECK_FALSE(process->check_limits());
}

TEST_CASE("process backend: it warns that nothing is bounded in total, and has no workspace to release") {
  temp_dir dir;
  auto backend = make_process_backend();
  auto warnings = backend->create(make_spec(dir))->warnings();
  REQUIRE(warnings.size() == 2);
  CHECK_THAT(warnings[0], Catch::Contains("per process only"));
  CHECK_THAT(warnings[1], Catch::Contains("no size quota"));
  std::ofstream(dir.path / "ws" / "kept.txt") << "kept";
  backend->release_workspace(dir.path / "ws", {});
  CHECK(fs::exists(dir.path / "ws" / "kept.txt"));
}

TEST_CASE("process backend: a program that cannot be exec'd is a spawn_failed with the reason") {
  temp_dir dir;
  fs::path garbage = dir.path / "not-a-program";
  std::ofstream(garbage) << "\x01\x02\x03 not an executable format";
  fs::permissions(garbage, fs::perms(0755));
  auto box = make_process_backend()->create(make_spec(dir));
  try {
    box->exec(garbage, {});
    FAIL("no sandbox_error");
  } catch (const sandbox_error& e) {
    CHECK(e.code() == sandbox_errc::spawn_failed);
    CHECK(std::string(e.what()) == "exec " + garbage.string() + ": Exec format error");
  }
  CHECK_THROWS_AS(box->exec(dir.path / "missing", {}), sandbox_error);
}

}  // namespace cairn::runtime::test
