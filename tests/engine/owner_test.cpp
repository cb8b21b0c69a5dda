#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <optional>
#include <thread>

#include "engine/owner.hpp"
#include "storage/journal.hpp"
#include "tests/cairn_cli.hpp"
#include "tests/engine/proc_ticks.hpp"
#include "tests/temp_dir.hpp"

using namespace cairn::engine;

TEST_CASE("an owner string round-trips and names this process") {
  const auto& me = current_owner();
  CHECK(me.pid == getpid());
  auto parsed = owner_id::parse(me.str());
  REQUIRE(parsed);
  CHECK(parsed->str() == me.str());
  CHECK(check_owner(me.str()) == owner_state::alive);
  CHECK_FALSE(owner_id::parse("garbage"));
}

TEST_CASE("a process that exited is a dead owner, even before it is reaped") {
  pid_t child = fork();
  if (child == 0) _exit(0);
  // Zombie until waitpid: still dead for ownership purposes.
  owner_id o = current_owner();
  o.pid = child;
  siginfo_t info{};
  waitid(P_PID, child, &info, WEXITED | WNOWAIT);
  o.start_ticks = proc_start_ticks(child);  // the zombie's own, so only its state makes it dead
  CHECK(check_owner(o.str()) == owner_state::dead);
  waitpid(child, nullptr, 0);
  CHECK(check_owner(o.str()) == owner_state::dead);
}

TEST_CASE("an owner from before the last reboot is dead; one from another host is unknown") {
  owner_id o = current_owner();
  o.boot_id = "00000000-0000-0000-0000-000000000000";
  CHECK(check_owner(o.str()) == owner_state::dead);
  o = current_owner();
  o.hostname = "some-other-host";
  CHECK(check_owner(o.str()) == owner_state::unknown);
}

TEST_CASE("a recycled pid is a dead owner: same pid, another start time") {
  owner_id o = current_owner();
  o.start_ticks += 1;  // the pid now names a process that started at another time
  CHECK(check_owner(o.str()) == owner_state::dead);
  CHECK(check_owner(current_owner().str()) == owner_state::alive);
}

TEST_CASE("an owner of the older HOSTNAME:PID form still parses and is judged by its pid") {
  const auto& me = current_owner();
  const std::string mine = me.hostname + ":" + std::to_string(me.pid);
  auto parsed = owner_id::parse(mine);
  REQUIRE(parsed);
  CHECK(parsed->str() == mine);
  CHECK(check_owner(mine) == owner_state::alive);
  CHECK(describe_owner(mine) == "pid " + std::to_string(me.pid) + " on " + me.hostname);
  pid_t child = fork();
  if (child == 0) _exit(0);
  waitpid(child, nullptr, 0);
  CHECK(check_owner(me.hostname + ":" + std::to_string(child)) == owner_state::dead);
  CHECK(check_owner("some-other-host:" + std::to_string(me.pid)) == owner_state::unknown);
  CHECK_FALSE(owner_id::parse("host:-1"));
  CHECK_FALSE(owner_id::parse("host:boot:12x:5"));
}

namespace {

using namespace std::chrono_literals;

// Polls `ready` for up to a minute (a loaded machine).
template <class F>
bool eventually(F&& ready) {
  for (auto until = std::chrono::steady_clock::now() + 60s; std::chrono::steady_clock::now() < until;
       std::this_thread::sleep_for(20ms))
    if (ready()) return true;
  return false;
}

std::optional<cairn::storage::run_record> run_in(const std::filesystem::path& db, const std::string& id) {
  if (!std::filesystem::exists(db)) return std::nullopt;
  try {
    auto j = cairn::storage::open_journal(db, {.read_only = true});
    return j->find_run(id);
  } catch (const cairn::storage::storage_error&) {
    return std::nullopt;  // not created or migrated yet
  }
}

std::size_t steps_in(const std::filesystem::path& db, const std::string& id) {
  if (!run_in(db, id)) return 0;
  return cairn::storage::open_journal(db, {.read_only = true})->steps(id).size();
}

}  // namespace

TEST_CASE("a host stopped while its run is taken over writes nothing more to it and gives it up") {
  using cairn::testing::run_program;
  cairn::testing::temp_dir home;
  const auto db = home / "cairn.db";
  cairn::testing::cli_options env;
  env.env["CAIRN_HOME"] = home.path().string();
  const std::string input = R"({"steps": 4, "sleep_ms": 3000, "mark_begin": true})";
  cairn::testing::cli_result a_result, b_result;
  std::thread a([&] { a_result = run_program(CAIRN_BIN, {"run", STEP_AGENT, "--id", "r", "--input", input}, home.path(), env); });

  // A is stopped while its agent executes step 1 (its body began: A had
  // acked step 0; stopped between step 0's commit and its ack, A would hold
  // the agent back); the agent sends step 1 meanwhile.
  const auto exec_log = home / "workspaces" / "r" / "exec.log";
  const auto began_log = home / "workspaces" / "r" / "began.log";
  auto step_1_done = [&] { return cairn::testing::slurp(exec_log).find("\n1 ") != std::string::npos; };
  auto step_1_began = [&] { return cairn::testing::slurp(began_log).find("\n1\n") != std::string::npos; };
  REQUIRE(eventually([&] { return step_1_began() && steps_in(db, "r") == 1 && !step_1_done(); }));
  const std::string owner_a = run_in(db, "r")->owner;
  const pid_t pid_a = owner_id::parse(owner_a)->pid;
  REQUIRE(kill(pid_a, SIGSTOP) == 0);
  REQUIRE(eventually(step_1_done));

  // The test seam: A's owner made to look dead (its boot id forged), then B
  // resumes the run as `cairn resume` does after a host died.
  owner_id forged = *owner_id::parse(owner_a);
  forged.boot_id = "00000000-0000-0000-0000-000000000000";
  {
    auto j = cairn::storage::open_journal(db);
    REQUIRE(j->claim_run("r", owner_a, forged.str()));
  }
  std::thread b([&] { b_result = run_program(CAIRN_BIN, {"resume", "r"}, home.path(), env); });
  REQUIRE(eventually([&] {
    auto run = run_in(db, "r");
    return run && run->owner != forged.str() && run->attempts == 2;
  }));
  const auto steps_at_takeover = cairn::storage::open_journal(db, {.read_only = true})->steps("r").size();
  CHECK(steps_at_takeover == 1);
  REQUIRE(kill(pid_a, SIGCONT) == 0);
  b.join();
  a.join();

  INFO("A: " << a_result.out << a_result.err << "\nB: " << b_result.out << b_result.err);
  CHECK(b_result.code == 0);
  // A's step 1 was refused: A said so and did not take the run again.
  CHECK_THAT(a_result.err, Catch::Contains("run r was taken over by"));
  auto j = cairn::storage::open_journal(db, {.read_only = true});
  auto run = j->find_run("r");
  CHECK(run->status == cairn::storage::run_status::completed);
  CHECK(run->attempts == 2);
  // Every step after the takeover holds what B's agent (run attempt 2) computed.
  const auto log = cairn::testing::slurp(home / "workspaces" / "r" / "exec.log");
  auto steps = j->steps("r");
  REQUIRE(steps.size() == 4);
  for (std::size_t seq = steps_at_takeover; seq < steps.size(); ++seq) {
    INFO("step " << seq);
    const std::string nonce = steps[seq].result.output["nonce"];
    CHECK(log.find(std::to_string(seq) + " " + nonce + " attempt 2") != std::string::npos);
  }
  int attempts_started = 0;
  for (const auto& e : j->events("r")) attempts_started += e.kind == "attempt_started";
  CHECK(attempts_started == 2);
}
