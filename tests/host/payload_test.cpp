// Payloads from outside cannot hurt the host, and what a run makes the host
// store is bounded (issue 16 finding 2, issue 9 finding 5). Each attack is
// mounted as its author would: a user through the `cairn` binary, another
// program writing the journal, an agent flooding it.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <thread>

#include <nlohmann/json.hpp>

#include "engine/engine.hpp"
#include "storage/journal.hpp"
#include "tests/cairn_cli.hpp"
#include "tests/temp_dir.hpp"

using namespace cairn;
using json = nlohmann::json;
using namespace std::chrono_literals;

namespace {

namespace fs = std::filesystem;
using storage::run_status;

constexpr std::uintmax_t mib = 1 << 20;

// A JSON text `depth` arrays deep: 2 bytes a level.
std::string nested(std::size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }

// Polls `ready` until it holds; fails the test after `limit`, showing `context`.
void eventually(const std::string& what, const std::function<bool()>& ready,
                const std::function<std::string()>& context = {}, std::chrono::seconds limit = 60s) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!ready()) {
    if (std::chrono::steady_clock::now() >= deadline)
      FAIL("gave up after " << limit.count() << " s waiting until " << what << "\n" << (context ? context() : ""));
    std::this_thread::sleep_for(20ms);
  }
}

// A CAIRN_HOME of its own, and the ways into its journal.
class cairn_home {
 public:
  fs::path path() const { return dir_ / "home"; }
  fs::path file(const std::string& name) const { return dir_ / name; }

  testing::cli_result cairn(const std::vector<std::string>& args) const {
    return testing::run_program(CAIRN_BIN, args, dir_.path(), {.env = {{"CAIRN_HOME", path().string()}}});
  }

  // `cairn submit` of a run without a sandbox (the attacks here need none).
  void submit(const std::string& agent, const std::string& id, const json& input,
              std::vector<std::string> extra = {}) const {
    std::vector<std::string> args{"submit", agent, "--id", id, "--sandbox", "none", "--input", input.dump()};
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = cairn(args);
    INFO(r.err);
    REQUIRE(r.code == 0);
  }

  std::optional<storage::run_record> run(const std::string& id) const {
    return storage::open_journal(path() / "cairn.db", {.read_only = true})->find_run(id);
  }

  bool has_status(const std::string& id, run_status status) const {
    auto r = run(id);
    return r && r->status == status;
  }

  std::unique_ptr<storage::journal> journal() const {
    return storage::open_journal(path() / "cairn.db", storage::journal_options{.read_only = true});
  }

  // The journal's bytes on disk: the database and its write-ahead log.
  std::uintmax_t journal_bytes() const {
    std::uintmax_t total = 0;
    for (const char* suffix : {"", "-wal"}) {
      std::error_code ec;
      auto size = fs::file_size(path() / (std::string("cairn.db") + suffix), ec);
      if (!ec) total += size;
    }
    return total;
  }

  // Runs `sql` with `text` as ?1 on the journal, as a program other than
  // this cairn (an older one, a script) could.
  void write_raw(const std::string& sql, const std::string& text) const {
    sqlite3* db = nullptr;
    REQUIRE(sqlite3_open((path() / "cairn.db").c_str(), &db) == SQLITE_OK);
    sqlite3_busy_timeout(db, 30'000);
    sqlite3_stmt* s = nullptr;
    REQUIRE(sqlite3_prepare_v2(db, sql.c_str(), -1, &s, nullptr) == SQLITE_OK);
    sqlite3_bind_text(s, 1, text.data(), static_cast<int>(text.size()), SQLITE_TRANSIENT);
    const int rc = sqlite3_step(s);
    sqlite3_finalize(s);
    INFO(sqlite3_errmsg(db));
    sqlite3_close(db);
    REQUIRE(rc == SQLITE_DONE);
  }

  fs::path write_file(const std::string& name, const std::string& text) const {
    std::ofstream(file(name)) << text;
    return file(name);
  }

 private:
  testing::temp_dir dir_;
};

// `cairn serve` on a home; killed if a test leaves it running.
class serve_process {
 public:
  explicit serve_process(const cairn_home& home) : log_(home.file("serve-" + std::to_string(count_++) + ".log")) {
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setenv("CAIRN_HOME", home.path().c_str(), 1);
      int out = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (out < 0) ::_exit(126);
      ::dup2(out, 1);
      ::dup2(out, 2);
      ::execl(CAIRN_BIN, CAIRN_BIN, "serve", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    REQUIRE(pid_ > 0);
  }
  ~serve_process() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  serve_process(const serve_process&) = delete;
  serve_process& operator=(const serve_process&) = delete;

  bool alive() {
    if (pid_ > 0 && ::waitpid(pid_, &status_, WNOHANG) == pid_) pid_ = -1;
    return pid_ > 0;
  }

  std::string log() {
    std::string state = alive() ? "(running)"
                        : WIFSIGNALED(status_) ? "(killed by signal " + std::to_string(WTERMSIG(status_)) + ")"
                                               : "(exited " + std::to_string(WEXITSTATUS(status_)) + ")";
    return "cairn serve " + state + ":\n" + testing::slurp(log_);
  }

  // SIGTERM once it serves; its exit code (128 + signal if one killed it).
  int stop() {
    eventually("cairn serve is up", [&] {
      return !alive() || testing::slurp(log_).find("cairn serve: journal") != std::string::npos;
    }, [&] { return log(); });
    if (alive()) ::kill(pid_, SIGTERM);
    eventually("cairn serve exits", [&] { return !alive(); }, [&] { return log(); });
    return WIFEXITED(status_) ? WEXITSTATUS(status_) : 128 + WTERMSIG(status_);
  }

 private:
  static inline int count_ = 0;
  fs::path log_;
  pid_t pid_ = -1;
  int status_ = 0;
};

const json wait_for_go = {{"plan", {{{"op", "signal"}, {"name", "go"}}}}};

json steps_plan(const std::string& name) {
  return {{"plan", {{{"op", "sleep"}, {"ms", 300}}, {{"op", "step"}, {"name", name}}}}};
}

}  // namespace

TEST_CASE("cairn signal refuses a payload nested deeper than a run can be handed and stores nothing") {
  cairn_home h;
  h.submit(WAIT_AGENT, "victim", wait_for_go);
  // 60,000 levels is 120 KB, one command-line argument; 200 failed the
  // receiving run on every attempt; one past the bound would too.
  for (std::size_t depth : {std::size_t{60'000}, std::size_t{200}, engine::max_signal_depth + 1}) {
    auto r = h.cairn({"signal", "victim", "go", "--data", nested(depth)});
    INFO("depth " << depth << ": " << r.err);
    CHECK(r.code == 2);
    CHECK(r.err.find("nests deeper than") != std::string::npos);
  }
  CHECK(h.journal()->signals("victim").empty());

  // The deepest payload accepted reaches the agent, replay included.
  const std::string deepest = nested(engine::max_signal_depth);
  auto sent = h.cairn({"signal", "victim", "go", "--data", deepest});
  INFO(sent.err);
  REQUIRE(sent.code == 0);
  auto resumed = h.cairn({"resume", "victim"});
  INFO(resumed.out << resumed.err);
  CHECK(resumed.code == 0);
  auto run = h.run("victim");
  REQUIRE(run);
  CHECK(run->status == run_status::completed);
  CHECK(run->output == json::array({{{"signal", json::parse(deepest)}}}));
}

TEST_CASE("the engine refuses a signal payload nested too deep before it is stored") {
  testing::temp_dir dir;
  auto journal = storage::open_journal(dir / "cairn.db");
  engine::engine_options options;
  options.home = dir / "home";
  engine::engine eng(*journal, options);
  storage::new_run run;
  run.id = "r";
  run.agent = WAIT_AGENT;
  run.workspace = (dir / "ws").string();
  journal->create_run(run);
  const json deep = json::parse(nested(200));
  try {
    eng.signal("r", "go", deep);
    FAIL("a payload 200 levels deep was queued");
  } catch (const engine::engine_error& e) {
    CHECK(e.code() == engine::errc::bad_request);
  }
  CHECK(journal->signals("r").empty());
}

TEST_CASE("values another writer stored too deep fail only their runs while cairn serve stays up and restarts") {
  cairn_home h;
  h.submit(WAIT_AGENT, "victim", wait_for_go);
  h.submit(WAIT_AGENT, "deep-input", steps_plan("never"));
  h.submit(WAIT_AGENT, "bystander", steps_plan("b"));
  // A run row whose input an older cairn (or a script) wrote 60,000 deep.
  h.write_raw("UPDATE runs SET input = ?1 WHERE id = 'deep-input'", nested(60'000));

  serve_process serve(h);
  eventually("the victim waits for its signal", [&] { return h.has_status("victim", run_status::waiting); },
             [&] { return serve.log(); });
  // The signal of the finding, stored as cairn before this fix stored it.
  h.write_raw("INSERT INTO signals (run_id, name, payload, sent_at_ms) VALUES ('victim', 'go', ?1, 0)",
              nested(60'000));

  eventually("the victim fails", [&] { return h.has_status("victim", run_status::failed); },
             [&] { return serve.log(); });
  eventually("the deep-input run fails", [&] { return h.has_status("deep-input", run_status::failed); },
             [&] { return serve.log(); });
  eventually("the bystander completes", [&] { return h.has_status("bystander", run_status::completed); },
             [&] { return serve.log(); });
  INFO(serve.log());
  CHECK(serve.alive());
  for (const std::string id : {"victim", "deep-input"}) {
    auto run = h.run(id);
    REQUIRE(run->error);
    INFO(run->error->message);
    CHECK(run->error->type == "journal");
    CHECK(run->error->message.find("nests deeper than 128 levels") != std::string::npos);
  }

  for (const std::string id : {"victim", "deep-input"})
    for (const bool as_json : {false, true}) {
      auto shown = h.cairn(as_json ? std::vector<std::string>{"show", id, "--json"} : std::vector<std::string>{"show", id});
      INFO(id << (as_json ? " --json: " : ": ") << shown.out << shown.err);
      CHECK(shown.code == 0);
      CHECK(shown.out.find("nests deeper than 128 levels") != std::string::npos);
    }
  auto listed = h.cairn({"ls"});
  CHECK(listed.code == 0);
  CHECK(serve.stop() == 0);

  // Each new daemon finds the same journal and serves a new run.
  int restarts = 0;
  for (int i = 0; i < 3; ++i) {
    const std::string id = "after-restart-" + std::to_string(i);
    h.submit(WAIT_AGENT, id, steps_plan(id));
    serve_process again(h);
    eventually(id + " completes", [&] { return h.has_status(id, run_status::completed); }, [&] { return again.log(); });
    INFO(again.log());
    CHECK(again.alive());
    CHECK(again.stop() == 0);
    ++restarts;
  }
  std::printf("payload_test: cairn serve survived %d restarts with the 60,000-level payloads in its journal\n",
              restarts);
}

TEST_CASE("signals past the run's limits.signals or limits.signal_kb are refused") {
  cairn_home h;
  const auto policy = h.write_file("policy.json", R"({"limits": {"signals": 3, "signal_kb": 1}})");
  h.submit(WAIT_AGENT, "limited", wait_for_go, {"--policy", policy.string()});
  for (int i = 0; i < 3; ++i) {
    auto r = h.cairn({"signal", "limited", "other", "--data", std::to_string(i)});
    INFO(r.err);
    REQUIRE(r.code == 0);
  }
  auto fourth = h.cairn({"signal", "limited", "go", "--data", "4"});
  CHECK(fourth.code == 2);
  CHECK(fourth.err.find("limits.signals") != std::string::npos);
  CHECK(h.journal()->signals("limited").size() == 3);

  // 64 KiB by default; 1 KiB under this policy.
  h.submit(WAIT_AGENT, "default", wait_for_go);
  const json big = std::string(65 << 10, 'x'), fits = std::string(60 << 10, 'x');
  auto too_big = h.cairn({"signal", "default", "go", "--data", big.dump()});
  CHECK(too_big.code == 2);
  CHECK(too_big.err.find("limits.signal_kb") != std::string::npos);
  CHECK(h.cairn({"signal", "default", "go", "--data", fits.dump()}).code == 0);
  auto over_policy = h.cairn({"signal", "limited", "go", "--data", json(std::string(2000, 'x')).dump()});
  CHECK(over_policy.code == 2);
  CHECK(h.journal()->signals("default").size() == 1);
}

TEST_CASE("an agent flooding the journal ends limit_exceeded at journal_mb and nothing acknowledged is lost") {
  cairn_home h;
  const auto policy = h.write_file("policy.json", R"({"limits": {"journal_mb": 32}})");
  // 30 steps of 4 MiB (just under step_output_mb), the finding's attack.
  const std::size_t block = (4 << 20) - 4096;
  auto r = h.cairn({"run", PAYLOAD_FLOOD_AGENT_PATH, "--id", "flood", "--sandbox", "none", "--policy",
                    policy.string(), "--input", json{{"steps", 30}, {"bytes", block}}.dump()});
  INFO(r.out << r.err);
  CHECK(r.code == 1);
  auto run = h.run("flood");
  REQUIRE(run);
  CHECK(run->status == run_status::failed);
  REQUIRE(run->error);
  CHECK(run->error->type == "limit_exceeded");
  CHECK(run->error->message.find("limits.journal_mb") != std::string::npos);
  const auto steps = h.journal()->steps("flood");
  CHECK(!steps.empty());
  CHECK(steps.size() < 30);  // about 3 MiB each once compressed: the limit stopped the run
  for (const auto& s : steps) CHECK(s.result.output.get_ref<const std::string&>().size() == block);
  const auto bytes = h.journal_bytes();
  std::printf("payload_test: journal after 30 x 4 MiB steps under journal_mb 32: %ju bytes, %zu steps kept\n",
              static_cast<std::uintmax_t>(bytes), steps.size());
  CHECK(bytes <= 40 * mib);
}

TEST_CASE("a step output over limits.step_output_mb ends the run limit_exceeded and is not journaled") {
  cairn_home h;
  auto r = h.cairn({"run", PAYLOAD_FLOOD_AGENT_PATH, "--id", "big", "--sandbox", "none", "--input",
                    json{{"steps", 1}, {"bytes", 5 << 20}}.dump()});
  INFO(r.out << r.err);
  CHECK(r.code == 1);
  auto run = h.run("big");
  REQUIRE(run);
  REQUIRE(run->error);
  CHECK(run->error->type == "limit_exceeded");
  CHECK(run->error->message.find("limits.step_output_mb") != std::string::npos);
  CHECK(h.journal()->steps("big").empty());
}

TEST_CASE("tool_started journals every call's arguments, their long strings once per run however often sent") {
  cairn_home h;
  const auto tool = h.write_file("echo_tool.sh", "#!/bin/sh\ncat > /dev/null\necho '{\"ok\": true}'\n");
  fs::permissions(tool, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                            fs::perms::others_read | fs::perms::others_exec);
  const json grant = {{"command", {tool.string()}}, {"input", {{"text", "string"}}}};
  json policy = {{"tools", {{"echo", grant}, {"mail", grant}}}};
  policy["tools"]["echo"]["idempotency"] = "idempotent";
  policy["tools"]["mail"]["idempotency"] = "at_most_once";
  const auto policy_file = h.write_file("policy.json", policy.dump());
  const json args = {{"text", std::string(100'000, 'a')}};
  const auto args_bytes = args.dump().size();

  for (const std::string name : {"echo", "mail"}) {
    auto r = h.cairn({"run", PAYLOAD_TOOL_AGENT_PATH, "--id", name, "--sandbox", "none", "--policy",
                      policy_file.string(), "--input", json{{"tool", name}, {"args", args}, {"calls", 20}}.dump()});
    INFO(r.out << r.err);
    REQUIRE(r.code == 0);
    int started = 0;
    for (const auto& e : h.journal()->events(name))
      if (e.kind == "tool_started") {
        ++started;
        CHECK(e.data["args"] == args);  // read back whole, for cairn show and for settle
      }
    CHECK(started == 20);
    // 20 calls of 100 KB: the string once, not 2 MB.
    const auto bytes = h.journal()->bytes_of_run(name);
    std::printf("payload_test: 20 %s calls with the same %zu bytes of args: the run's journal holds %llu bytes\n",
                name.c_str(), args_bytes, static_cast<unsigned long long>(bytes));
    CHECK(bytes < args_bytes + 20 * 1'000);
  }
}

TEST_CASE("an agent calling a tool with large distinct arguments ends limit_exceeded at journal_mb") {
  cairn_home h;
  // The tool answers a few bytes: only the calls' arguments, journaled with
  // tool_started, can fill the journal.
  const auto tool = h.write_file("echo_tool.sh", "#!/bin/sh\ncat > /dev/null\necho '{\"ok\": true}'\n");
  fs::permissions(tool, fs::perms::owner_all);
  const json policy = {{"limits", {{"journal_mb", 4}}},
                       {"tools", {{"echo", {{"command", {tool.string()}}, {"input", {{"text", "string"}}},
                                            {"idempotency", "idempotent"}}}}}};
  const auto policy_file = h.write_file("policy.json", policy.dump());
  // 20 calls, each with 1 MiB of arguments of its own.
  auto r = h.cairn({"run", PAYLOAD_TOOL_AGENT_PATH, "--id", "calls", "--sandbox", "none", "--policy",
                    policy_file.string(), "--input",
                    json{{"tool", "echo"}, {"args", json::object()}, {"calls", 20}, {"distinct_bytes", 1 << 20}}.dump()});
  INFO(r.out << r.err);
  CHECK(r.code == 1);
  auto run = h.run("calls");
  REQUIRE(run);
  CHECK(run->status == run_status::failed);
  REQUIRE(run->error);
  CHECK(run->error->type == "limit_exceeded");
  CHECK(run->error->message.find("limits.journal_mb") != std::string::npos);
  int started = 0;
  for (const auto& e : h.journal()->events("calls")) started += e.kind == "tool_started";
  CHECK(started >= 1);
  CHECK(started < 6);  // about 3/4 MiB each once compressed, under 4 MiB
  CHECK(h.journal()->bytes_of_run("calls") <= 4 * mib);
}

TEST_CASE("an input or settle result or policy file nested 60000 deep is refused with exit 2") {
  cairn_home h;
  const std::string deep = nested(60'000);
  auto input = h.cairn({"run", WAIT_AGENT, "--id", "r", "--sandbox", "none", "--input", deep});
  CHECK(input.code == 2);
  CHECK(input.err.find("nests deeper than") != std::string::npos);

  const auto policy = h.write_file("policy.json", R"({"limits": )" + deep + "}");
  auto with_policy = h.cairn({"run", WAIT_AGENT, "--id", "r", "--sandbox", "none", "--policy", policy.string()});
  CHECK(with_policy.code == 2);
  CHECK(with_policy.err.find("nests deeper than") != std::string::npos);

  auto settled = h.cairn({"settle", "r", "0", "--result", deep});
  CHECK(settled.code == 2);
  CHECK(settled.err.find("nests deeper than") != std::string::npos);
  CHECK((!fs::exists(h.path() / "cairn.db") || !h.run("r")));
}
