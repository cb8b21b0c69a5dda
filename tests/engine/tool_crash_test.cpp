// Kills the cairn host with SIGKILL between a tool call's durable `started`
// record and its journaled result, for both kinds of tool, and checks what
// users rely on: an at-most-once call is never silently repeated (the run
// stops in doubt and `cairn settle` decides), an idempotent one is made again
// with the same idempotency key, and no result the agent saw changes.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include "storage/journal.hpp"
#include "tests/support/test_db.hpp"
#include "tests/temp_dir.hpp"

using namespace cairn;
using json = nlohmann::json;

namespace {

struct host {
  testing::temp_dir home;

  host() { setenv("CAIRN_TEST_TOOL_LOG", (home / "calls.log").c_str(), 1); }
  ~host() { unsetenv("CAIRN_TEST_TOOL_LOG"); }

  // Runs `cairn ARGS...`; returns the wait status.
  int cairn(const std::vector<std::string>& args, const std::string& crash_point = "") {
    const std::string db = testing::journal_of(home.path());
    pid_t pid = fork();
    if (pid == 0) {
      setenv("CAIRN_HOME", home.path().c_str(), 1);
      setenv("CAIRN_DB", db.c_str(), 1);
      // The tools are commands on the host: a shared journal's host must be told it may run them.
      setenv("CAIRN_ALLOW", "command-tools", 1);
      if (crash_point.empty()) unsetenv("CAIRN_CRASH_POINT");
      else setenv("CAIRN_CRASH_POINT", crash_point.c_str(), 1);
      int log = open((home / "cli.log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      dup2(log, 1);
      dup2(log, 2);
      std::vector<std::string> argv{CAIRN_BIN};
      argv.insert(argv.end(), args.begin(), args.end());
      std::vector<char*> cargv;
      for (auto& a : argv) cargv.push_back(a.data());
      cargv.push_back(nullptr);
      execv(cargv[0], cargv.data());
      _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return status;
  }

  std::filesystem::path policy(const std::string& idempotency) {
    auto file = home / ("policy-" + idempotency + ".json");
    std::ofstream(file) << json{{"tools",
                                 {{"mailer",
                                   {{"command", {RECORD_TOOL}},
                                    {"input", {{"to", "string"}}},
                                    {"idempotency", idempotency},
                                    {"env", {"CAIRN_TEST_TOOL_LOG"}}}}}}}
                               .dump();
    return file;
  }

  std::vector<std::string> calls() {
    std::vector<std::string> lines;
    std::ifstream in(home / "calls.log");
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }

  storage::run_record run(const std::string& id) {
    auto j = storage::open_journal(testing::journal_of(home.path()), {.read_only = true});
    return *j->find_run(id);
  }

  std::string log() {
    std::ifstream in(home / "cli.log");
    return {std::istreambuf_iterator<char>(in), {}};
  }
};

const json input = {{"calls", {{{"tool", "mailer"}, {"args", {{"to", "ana@example.com"}}}},
                               {{"tool", "mailer"}, {"args", {{"to", "bo@example.com"}}}}}}};

bool killed(int status) { return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL; }
int exit_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : -1; }

}  // namespace

TEST_CASE("at-most-once: killed after the started record, before the call") {
  for (int call = 1; call <= 2; ++call) {
    DYNAMIC_SECTION("call " << call) {
      host h;
      const std::string id = "amo-started-" + std::to_string(call);
      REQUIRE(killed(h.cairn({"run", TOOL_AGENT, "--id", id, "--policy", h.policy("at_most_once"), "--input",
                              input.dump()},
                             "tool_started:" + std::to_string(call))));
      REQUIRE(h.calls().size() == static_cast<std::size_t>(call - 1));

      CHECK(exit_code(h.cairn({"resume", id})) == 1);
      auto run = h.run(id);
      REQUIRE(run.status == storage::run_status::in_doubt);
      CHECK_THAT(run.error->message, Catch::Contains("cairn settle " + id + " " + std::to_string(call)));
      CHECK_THAT(h.log(), Catch::Contains("stopped in doubt"));
      REQUIRE(h.calls().size() == static_cast<std::size_t>(call - 1));  // not repeated

      // The operator checked: the mail never went out. Record it as failed.
      REQUIRE(exit_code(h.cairn({"settle", id, std::to_string(call), "--error", "not sent; checked the outbox"})) == 0);
      // No `cairn serve` holds the journal: this process is to continue it.
      CHECK_THAT(h.log(), Catch::Contains("recorded it as failed. Continue with `cairn resume " + id + "`"));
      REQUIRE(exit_code(h.cairn({"resume", id})) == 0);
      run = h.run(id);
      REQUIRE(run.status == storage::run_status::completed);
      CHECK(run.output["results"][call - 1]["error"] == "settled");
      CHECK(h.calls().size() == 1);  // only the other call ever ran
    }
  }
}

TEST_CASE("at-most-once: killed after the call returned, before its result was journaled") {
  host h;
  const std::string id = "amo-returned";
  REQUIRE(killed(h.cairn({"run", TOOL_AGENT, "--id", id, "--policy", h.policy("at_most_once"), "--input",
                          input.dump()},
                         "tool_returned:1")));
  REQUIRE(h.calls().size() == 1);  // it happened, but the journal cannot know
  CHECK(exit_code(h.cairn({"resume", id})) == 1);
  REQUIRE(h.run(id).status == storage::run_status::in_doubt);
  CHECK(h.calls().size() == 1);
  // A settle for the wrong step is refused and changes nothing.
  CHECK(exit_code(h.cairn({"settle", id, "2", "--retry"})) == 2);
  CHECK(h.run(id).status == storage::run_status::in_doubt);

  REQUIRE(exit_code(h.cairn({"settle", id, "1", "--result", R"({"sent":true,"checked":"by hand"})"})) == 0);
  REQUIRE(exit_code(h.cairn({"resume", id})) == 0);
  auto run = h.run(id);
  REQUIRE(run.status == storage::run_status::completed);
  CHECK(run.output["results"][0] == json{{"sent", true}, {"checked", "by hand"}});
  CHECK(run.output["results"][1]["key"] == id + "/2");
  CHECK(h.calls().size() == 2);  // call 1 once, call 2 once
}

TEST_CASE("idempotent: killed before or after the call, the call is made again with the same key") {
  for (std::string point : {"tool_started:1", "tool_returned:1", "tool_returned:2"}) {
    DYNAMIC_SECTION(point) {
      host h;
      const std::string id = "idem-" + point.substr(5, 3) + point.substr(point.size() - 1);
      REQUIRE(killed(h.cairn({"run", TOOL_AGENT, "--id", id, "--policy", h.policy("idempotent"), "--input",
                              input.dump()},
                             point)));
      const auto before = h.calls();
      REQUIRE(exit_code(h.cairn({"resume", id})) == 0);
      auto run = h.run(id);
      REQUIRE(run.status == storage::run_status::completed);
      auto calls = h.calls();
      // Every execution of a call used that call's key; a repeat only happened
      // for the call whose result was never journaled.
      std::map<std::string, int> per_key;
      for (const auto& line : calls) ++per_key[line.substr(0, line.find(' '))];
      CHECK(per_key[id + "/1"] == (point == "tool_returned:1" ? 2 : 1));
      CHECK(per_key[id + "/2"] == (point == "tool_returned:2" ? 2 : 1));
      CHECK(run.output["results"][0]["key"] == id + "/1");
      CHECK(run.output["results"][1]["key"] == id + "/2");
      CHECK(before.size() < calls.size());
    }
  }
}
