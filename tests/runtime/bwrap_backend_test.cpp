// The bwrap backend against a real bubblewrap: what the agent sees, how
// its processes end, and how set-up failures are reported.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>

#include "runtime/agent_sdks.hpp"
#include "runtime/bwrap_support.hpp"
#include "runtime/cgroup.hpp"
#include "runtime/host_paths.hpp"
#include "runtime/own_records.hpp"
#include "tests/cairn_cli.hpp"
#include "tests/runtime/sandbox_fixture.hpp"

namespace cairn::runtime::test {

TEST_CASE_METHOD(bwrap_fixture,
                 "bwrap: the probe starts with the channel on fd 3 and a minimal environment") {
  json report = probe({"status"});
  REQUIRE(report["ok"] == true);
  json detail = report["detail"];
  CHECK(detail["cwd"] == "/workspace");
  CHECK(detail["hostname"] == "cairn");
  std::vector<std::string> env = detail["env"];
  std::sort(env.begin(), env.end());
  // bwrap adds PWD for --chdir; without a cgroup, what runtimes need under RLIMIT_AS comes too.
  std::vector<std::string> expected{"CAIRN_CHANNEL_FD=3", "CAIRN_RUN_ID=run-test-1", "HOME=/workspace",
                                    "LANG=C.UTF-8"};
  if (detect_cgroups().mode == cgroup_mode::none)
    expected.insert(expected.end(), {"MALLOC_ARENA_MAX=2", "NODE_OPTIONS=--disable-wasm-trap-handler"});
  expected.insert(expected.end(), {"PATH=/usr/local/bin:/usr/bin:/bin", "PWD=/workspace",
                                   "PYTHONPATH=/run/cairn/python", "TMPDIR=/tmp"});
  CHECK(env == expected);
  // Nothing but stdio and the channel is inherited.
  std::vector<std::string> fds = detail["fds"];
  std::sort(fds.begin(), fds.end());
  CHECK(fds == std::vector<std::string>{"0", "1", "2", "3"});
}

TEST_CASE_METHOD(bwrap_fixture, "bwrap: the workspace is writable and the host sees the result") {
  std::ofstream(dir.path / "ws" / "from-host.txt") << "host";
  // The host's file was chowned to the sandbox uid by create(), so the agent may replace it.
  box = backend->create(spec);
  CHECK(probe({"write", "/workspace/x", "hello from the sandbox"})["ok"] == true);
  CHECK(probe({"write", "/workspace/from-host.txt", "agent"})["ok"] == true);
  std::ifstream in(dir.path / "ws" / "x");
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(content == "hello from the sandbox");
}

TEST_CASE_METHOD(bwrap_fixture, "bwrap: the exit code or signal reaches the host") {
  auto process = box->exec(SANDBOX_PROBE, {"exit", "3"});
  next_report(*process);
  auto status = process->wait_for(patience);
  REQUIRE(status);
  CHECK(status->describe() == "exited with code 3");
  CHECK(process->poll_exit() == status);

  // bwrap passes a signal on as 128+N; the host reports the signal.
  process = box->exec(SANDBOX_PROBE, {"abort"});
  next_report(*process);
  status = process->wait_for(patience);
  REQUIRE(status);
  CHECK(status->describe() == "killed by signal 6 (SIGABRT)");
}

TEST_CASE_METHOD(bwrap_fixture, "bwrap: kill() ends every process of the sandbox, grandchildren included") {
  std::string token = unique_token("cairn-kill-token");
  auto process = box->exec(SANDBOX_PROBE, {"grandchild", token});
  json report = next_report(*process);
  REQUIRE(report["ok"] == true);
  // The probe's SIGTERM-ignoring child and the probe; started cold, also
  // bwrap and the sandbox's pid 1, which carry the agent's arguments (a
  // pooled sandbox's carry its launcher's); started ahead, the probe's own
  // arguments were not yet these.
  CHECK(count_processes_with(token) == (box->agent_started() ? 1 : box->pooled() ? 2 : 4));
  CHECK_FALSE(process->poll_exit());

  exit_status status = process->kill();
  CHECK(status.describe() == "killed by signal 9 (SIGKILL)");
  CHECK(count_processes_with(token) == 0);
  CHECK(process->kill() == status);  // idempotent
}

TEST_CASE_METHOD(bwrap_fixture, "bwrap: destroy() and the handle's destructor kill the sandbox") {
  std::string token = unique_token("cairn-destroy-token");
  auto process = box->exec(SANDBOX_PROBE, {"grandchild", token});
  REQUIRE(next_report(*process)["ok"] == true);
  box->destroy();
  CHECK(count_processes_with(token) == 0);
  auto status = process->wait_for(patience);
  REQUIRE(status);
  CHECK(status->signal == SIGKILL);

  token = unique_token("cairn-destructor-token");
  process = box->exec(SANDBOX_PROBE, {"grandchild", token});
  REQUIRE(next_report(*process)["ok"] == true);
  process.reset();
  CHECK(count_processes_with(token) == 0);
}

// This process's zombie children that were a sandbox's pid 1: their NSpid
// line names a second pid, in the pid namespace they were pid 1 of.
std::vector<pid_t> zombie_sandbox_inits() {
  std::vector<pid_t> found;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "status");
    std::string line, state;
    pid_t ppid = 0;
    std::vector<pid_t> nspid;
    while (std::getline(in, line)) {
      std::istringstream fields(line.substr(line.find(':') + 1));
      if (line.rfind("State:", 0) == 0) state = line;
      if (line.rfind("PPid:", 0) == 0) fields >> ppid;
      if (line.rfind("NSpid:", 0) == 0) nspid.assign(std::istream_iterator<pid_t>(fields), {});
    }
    if (state.find("zombie") != std::string::npos && ppid == ::getpid() && nspid.size() == 2 && nspid[1] == 1)
      found.push_back(std::stoi(name));
  }
  return found;
}

// For one case, this process is handed every orphan below it, as a
// container's pid 1 is (or a subreaper, as systemd's user manager).
struct handed_orphans {
  handed_orphans() { REQUIRE(::prctl(PR_SET_CHILD_SUBREAPER, 1) == 0); }
  ~handed_orphans() {
    ::prctl(PR_SET_CHILD_SUBREAPER, 0);
    for (pid_t pid : zombie_sandbox_inits()) ::waitpid(pid, nullptr, WNOHANG);
  }
};

// bwrap exits with the status its sandbox's pid 1 reports without waiting
// for that pid 1: a host that is a container's pid 1 must reap it, or keep
// a zombie per sandbox until the container runs out of pids.
TEST_CASE_METHOD(bwrap_fixture,
                 "bwrap: a host handed orphans, as a container's pid 1 is, keeps no zombie of a sandbox") {
  handed_orphans host;
  // An agent that ends by itself (bwrap leaves its pid 1), then one killed.
  for (const bool killed : {false, true}) {
    new_run();
    auto process =
        box->exec(SANDBOX_PROBE, {killed ? "grandchild" : "exit", killed ? unique_token("cairn-orphan-token") : "0"});
    REQUIRE(next_report(*process)["ok"] == true);
    if (killed)
      process->kill();
    else
      REQUIRE(process->wait_for(patience));
    process.reset();
    box.reset();
    CHECK(zombie_sandbox_inits().empty());
  }
}

// `cairn serve` runs the doctor's checks at its start, a trial sandbox among them.
TEST_CASE("bwrap: the doctor's trial sandbox leaves no zombie to a host handed orphans") {
  handed_orphans host;
  bool started = false;
  for (const auto& check : make_bwrap_backend()->check())
    if (check.name == "sandbox starts") started = check.ok;
  REQUIRE(started);
  CHECK(zombie_sandbox_inits().empty());
}

// A pooled sandbox is started by its pool's thread (warm_pool_test kills a
// host with a full pool): this case is for cold ones only.
TEST_CASE_METHOD(bwrap_fixture, "bwrap: the sandbox dies with the thread that started it", "[cold]") {
  // PR_SET_PDEATHSIG follows the thread, not the process.
  std::string token = unique_token("cairn-orphan-token");
  std::unique_ptr<agent_process> process;
  std::thread([&] { process = box->exec(SANDBOX_PROBE, {"grandchild", token}); }).join();
  auto status = process->wait_for(patience);
  REQUIRE(status);
  CHECK(status->describe() == "killed by signal 9 (SIGKILL)");
  process->kill();  // waits until the sandbox's pid namespace is gone
  CHECK(count_processes_with(token) == 0);
}

TEST_CASE_METHOD(bwrap_fixture, "bwrap: the memory limit applies inside the sandbox, to one process too") {
  spec.limits.max_memory_bytes = 256u << 20;
  new_run();
  CHECK(probe({"alloc", std::to_string(16u << 20)})["ok"] == true);
  if (detect_cgroups().mode == cgroup_mode::none) {
    // Without a cgroup, RLIMIT_AS stands in: the allocation itself is refused.
    json report = probe({"alloc", std::to_string(1u << 30)});
    INFO(report.dump());
    CHECK(report["ok"] == false);
    return;
  }
  // With one, memory used counts, not address space reserved: 8 GiB of
  // reserved range (as V8 takes at start) is allowed, 1 GiB touched is not.
  CHECK(probe({"reserve", std::to_string(8ull << 30)})["ok"] == true);
  auto process = box->exec(SANDBOX_PROBE, {"memhog", "1", std::to_string(1u << 30)});
  REQUIRE(next_report(*process)["ok"] == true);
  auto breach = wait_for_breach(*process);
  REQUIRE(breach);
  CHECK(breach->limit == "memory");
}

TEST_CASE_METHOD(bwrap_fixture, "bwrap: a program the sandbox uid cannot reach is copied in") {
  if (!require_root("only root runs the sandbox under another uid")) return;
  fs::path hidden = dir.path / "private";
  fs::create_directories(hidden);
  fs::permissions(hidden, fs::perms(0700));
  fs::copy_file(SANDBOX_PROBE, hidden / "probe");
  fs::permissions(hidden / "probe", fs::perms(0700));
  spec.agent = hidden / "probe";  // what a pool that starts agents ahead starts
  new_run();
  json report = run_probe(*box, {"status"}, hidden / "probe");
  CHECK(report["ok"] == true);
}

TEST_CASE("bwrap: a sandbox orphaned before bwrap released it is found and killed", "[serial]") {
  // bwrap's child waits for its parent right after clone, before it arms
  // --die-with-parent. --userns-block-fd holds bwrap inside that window; the
  // test then kills bwrap as a host crash would.
  temp_dir dir;
  std::string token = unique_token("cairn-orphan-sweep");
  kill_orphaned_sandboxes();  // what an earlier crash left, so that only this test's orphan is found below
  fs::path args = dir.path / "args";
  {
    std::ofstream out(args, std::ios::binary);
    for (const char* arg : {"--unshare-all", "--unshare-user", "--die-with-parent", "--ro-bind", "/usr",
                            "/usr", "--info-fd", "5", "--userns-block-fd", "6"})
      out << arg << '\0';
  }
  // Above the targets 4..6, so that no dup2 below is a no-op that keeps O_CLOEXEC.
  auto high = [](int fd) {
    int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, 20);
    ::close(fd);
    return moved;
  };
  int args_fd = high(::open(args.c_str(), O_RDONLY | O_CLOEXEC));
  int info[2], block[2];
  REQUIRE(::pipe2(info, O_CLOEXEC) == 0);
  REQUIRE(::pipe2(block, O_CLOEXEC) == 0);
  for (int* fd : {&info[0], &info[1], &block[0], &block[1]}) *fd = high(*fd);
  // Recorded as the host records its sandboxes; never removed, as by a host that died.
  auto* record = new own_record(sandbox_record_kind, host_identity());
  const std::string record_env = std::string(sandbox_record_env) + "=" + record->token();
  pid_t bwrap = ::fork();
  if (bwrap == 0) {
    int devnull = ::open("/dev/null", O_RDWR);  // an orphan must not hold the test's output open
    for (int fd : {0, 1, 2}) ::dup2(devnull, fd);
    ::dup2(args_fd, 4);
    ::dup2(info[1], 5);
    ::dup2(block[0], 6);
    const char* env[] = {record_env.c_str(), nullptr};
    ::execle("/usr/bin/bwrap", "bwrap", "--args", "4", "--", "/run/cairn/agent", token.c_str(), nullptr, env);
    ::_exit(127);
  }
  ::close(info[1]);
  std::string info_text;
  char buffer[512];
  pollfd p{info[0], POLLIN, 0};
  while (::poll(&p, 1, 5000) > 0) {
    ssize_t n = ::read(info[0], buffer, sizeof buffer);
    if (n <= 0) break;
    info_text.append(buffer, static_cast<std::size_t>(n));
  }
  REQUIRE_THAT(info_text, Catch::Contains("child-pid"));
  // To clean up should the sweep fail; a pidfd cannot hit a recycled pid.
  int orphan =
      static_cast<int>(::syscall(SYS_pidfd_open, json::parse(info_text)["child-pid"].get<pid_t>(), 0));
  ::kill(bwrap, SIGKILL);
  ::waitpid(bwrap, nullptr, 0);
  // The orphan now waits forever. [serial]: no other test process's sweep can get there first.
  CHECK(count_processes_with(token) == 1);
  CHECK(kill_orphaned_sandboxes() == 1);
  CHECK(count_processes_with(token) == 0);
  ::syscall(SYS_pidfd_send_signal, orphan, SIGKILL, nullptr, 0);
  delete record;
  for (int fd : {orphan, args_fd, info[0], block[0], block[1]}) ::close(fd);
}

TEST_CASE("bwrap: set-up failures are sandbox_errors that say what to do") {
  temp_dir dir;
  sandbox_spec spec = make_spec(dir);

  SECTION("bwrap missing") {
    bwrap_options options;
    options.bwrap = "/nonexistent/bwrap";
    try {
      make_bwrap_backend(options)->create(spec);
      FAIL("no sandbox_error");
    } catch (const sandbox_error& e) {
      CHECK(e.code() == sandbox_errc::bwrap_missing);
      CHECK_THAT(e.what(), Catch::Contains("apt-get install bubblewrap"));
    }
  }
  SECTION("agent program missing") {
    auto box = make_bwrap_backend()->create(spec);
    try {
      box->exec(dir.path / "no-such-agent", {});
      FAIL("no sandbox_error");
    } catch (const sandbox_error& e) {
      CHECK(e.code() == sandbox_errc::bad_spec);
      CHECK_THAT(e.what(), Catch::Contains("no-such-agent") && Catch::Contains("does not exist"));
    }
  }
  SECTION("workspace out of the sandbox uid's reach") {
    if (!require_root("only root runs the sandbox under another uid")) return;
    fs::create_directories(dir.path / "private");
    fs::permissions(dir.path / "private", fs::perms(0700));
    spec.workspace = dir.path / "private" / "ws";
    try {
      make_bwrap_backend()->create(spec);
      FAIL("no sandbox_error");
    } catch (const sandbox_error& e) {
      CHECK(e.code() == sandbox_errc::bad_spec);
      CHECK_THAT(e.what(), Catch::Contains("chmod o+x " + (dir.path / "private").string()));
    }
  }
}

TEST_CASE("bwrap: when user namespaces are denied, the log explains why") {
  temp_dir dir;
  // A stand-in for bwrap on a kernel that refuses user namespaces: same message, same exit.
  fs::path fake = dir.path / "bwrap";
  std::ofstream(fake)
      << "#!/bin/sh\necho 'bwrap: No permissions to creating new namespace, likely because the "
         "kernel does not allow non-privileged user namespaces.' >&2\nexit 1\n";
  fs::permissions(fake, fs::perms(0755));
  bwrap_options options;
  options.bwrap = fake;
  auto box = make_bwrap_backend(options)->create(make_spec(dir));
  auto process = box->exec(SANDBOX_PROBE, {"status"});
  auto status = process->wait_for(patience);
  REQUIRE(status);
  CHECK(status->describe() == "exited with code 1");
  auto cause = diagnose_bwrap_failure(process->log_tail());
  REQUIRE(cause);
  CHECK_THAT(*cause, Catch::StartsWith("user namespaces are denied by the kernel"));
}

}  // namespace cairn::runtime::test

namespace cairn::runtime::test {

TEST_CASE("the SDKs under a folder the sandbox uid may not enter reach it as a root-only copy, without their tests") {
  if (!require_root("only under root does the sandbox run as another uid")) return;
  temp_dir dir;
  const fs::path closed = dir.path / "closed", sdk = closed / "js";
  fs::create_directories(sdk / "lib");
  fs::create_directories(sdk / "node_modules" / "typescript");
  fs::create_directories(sdk / "test");
  std::ofstream(sdk / "package.json") << R"({"name":"cairn"})";
  std::ofstream(sdk / "lib" / "wire.js") << "export const x = 1;\n";
  std::ofstream(sdk / "node_modules" / "typescript" / "big.js") << "x";
  std::ofstream(sdk / "test" / "a.test.js") << "x";
  // Copies are shared by content: this process's own, so that removing it
  // cannot pull one from under the same test running in another process.
  std::ofstream(sdk / "owner") << dir.path.string();
  ::chmod(closed.c_str(), 0700);
  const uid_t nobody = 65534;

  auto readable = readable_agent_sdks({{}, sdk}, nobody, nobody);
  REQUIRE(readable.js != sdk);
  CHECK(readable.js.parent_path() == "/var/cache/cairn/sdk");
  CHECK_FALSE(first_unsearchable_dir(readable.js / "lib" / "wire.js", nobody, nobody));
  CHECK(may_read_and_execute(readable.js / "lib", nobody, nobody));
  CHECK(fs::exists(readable.js / "package.json"));
  CHECK_FALSE(fs::exists(readable.js / "node_modules"));
  CHECK_FALSE(fs::exists(readable.js / "test"));
  // The same content is the same copy; changed content, another.
  CHECK(readable_agent_sdks({{}, sdk}, nobody, nobody).js == readable.js);
  std::ofstream(sdk / "lib" / "wire.js") << "export const x = 2;\n";
  const auto changed = readable_agent_sdks({{}, sdk}, nobody, nobody).js;
  CHECK(changed != readable.js);
  fs::remove_all(readable.js);
  fs::remove_all(changed);
}

// The modules of the Python SDK at `sdk` that Python compiled from their
// sources when importing it, as a sandboxed agent does (it may not write
// bytecode there), rather than loading their bytecode; and how many it loaded.
struct python_import {
  std::vector<std::string> compiled, loaded;
};
python_import import_python_sdk(const fs::path& sdk) {
  temp_dir scratch;
  // -S: the machine's own .pth files are not the SDK's.
  auto r = cairn::testing::run_program("/usr/bin/python3", {"-S", "-v", "-c", "import cairn"}, scratch.path,
                                       {.env = {{"PYTHONPATH", sdk.string()}, {"PYTHONDONTWRITEBYTECODE", "1"}}});
  INFO(r.err);
  REQUIRE(r.code == 0);
  python_import found;
  std::istringstream lines(r.err);
  const std::string prefix = "# code object from ";
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(prefix, 0) != 0 || line.find((sdk / "cairn").string()) == std::string::npos) continue;
    (line.find(".pyc") != std::string::npos ? found.loaded : found.compiled).push_back(line.substr(prefix.size()));
  }
  return found;
}

TEST_CASE("the Python SDK reaches sandboxes compiled: no agent compiles it at its start") {
  const fs::path sdk = find_agent_sdks().python;
  REQUIRE_FALSE(sdk.empty());
  std::size_t modules = 0;
  for (const auto& e : fs::directory_iterator(sdk / "cairn")) modules += e.path().extension() == ".py";
  const auto here = import_python_sdk(sdk);
  CHECK(here.compiled.empty());
  CHECK(here.loaded.size() == modules);
  if (!require_root("only under root does the sandbox run as another uid")) return;
  // The root-only copy made for a sandbox uid that may not reach the SDK keeps the bytecode.
  temp_dir dir;
  const fs::path closed = dir.path / "closed";
  fs::create_directories(closed);
  fs::copy(sdk, closed / "python", fs::copy_options::recursive);
  // This process's own copy (they are shared by content): removing it below
  // cannot pull one from under this test in another process, or a sandbox.
  std::ofstream(closed / "python" / "owner") << dir.path.string();
  ::chmod(closed.c_str(), 0700);
  const auto readable = readable_agent_sdks({closed / "python", {}}, 65534, 65534);
  REQUIRE(readable.python.parent_path() == "/var/cache/cairn/sdk");
  const auto copied = import_python_sdk(readable.python);
  CHECK(copied.compiled.empty());
  CHECK(copied.loaded.size() == modules);
  fs::remove_all(readable.python);
}

}  // namespace cairn::runtime::test
