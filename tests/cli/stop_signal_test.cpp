// `cairn run` and `cairn resume` stopped by a signal (systemd's SIGTERM,
// `timeout`, a closed terminal's SIGHUP, Ctrl-C) stop as `cairn serve` does:
// the run is handed back resumable, its sandbox taken down and its workspace
// image unmounted, the command says how to continue and exits 128 + signal.
// Then `cairn resume` takes it to the end with no step executed twice.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <map>
#include <thread>

#include <SQLiteCpp/SQLiteCpp.h>
#include <nlohmann/json.hpp>

#include "tests/cairn_cli.hpp"
#include "tests/temp_dir.hpp"

using json = nlohmann::json;
using namespace std::chrono_literals;

namespace {

struct home {
  cairn::testing::temp_dir dir;
  cairn::testing::cli_options options() const {
    cairn::testing::cli_options o;
    o.cwd = dir.path();
    o.env = {{"CAIRN_HOME", (dir / ".cairn").string()}};
    return o;
  }

  // The run's status, owner and journaled steps, read as another process would.
  std::tuple<std::string, std::string, int> row(const std::string& id) const {
    const auto db = dir / ".cairn" / "cairn.db";
    if (!std::filesystem::exists(db)) return {"", "", 0};
    try {
      SQLite::Database reader(db.string(), SQLite::OPEN_READONLY);
      reader.setBusyTimeout(10'000);
      SQLite::Statement run(reader, "SELECT status, owner FROM runs WHERE id = ?");
      run.bind(1, id);
      if (!run.executeStep()) return {"", "", 0};
      SQLite::Statement steps(reader, "SELECT count(*) FROM steps WHERE run_id = ?");
      steps.bind(1, id);
      steps.executeStep();
      return {run.getColumn(0).getString(), run.getColumn(1).getString(), steps.getColumn(0).getInt()};
    } catch (const SQLite::Exception&) {
      return {"", "", 0};  // the journal is being created: no schema yet
    }
  }

  // Starts `cairn ARGS...`, waits until the run has `steps` journaled steps, sends `signal`; the exit code and stderr.
  std::pair<int, std::string> stop_after(std::vector<std::string> args, const std::string& id, int steps,
                                         int signal) const {
    const auto out = dir / "out", err = dir / "err";
    const pid_t pid = cairn::testing::spawn_program(CAIRN_BIN, std::move(args), out, err, options());
    // A bound for a run that never gets there only; the signal comes once the steps are in.
    const auto limit = std::chrono::steady_clock::now() + 120s;
    while (std::get<2>(row(id)) < steps && std::chrono::steady_clock::now() < limit) std::this_thread::sleep_for(20ms);
    INFO(cairn::testing::slurp(err));
    REQUIRE(std::get<2>(row(id)) >= steps);
    ::kill(pid, signal);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), cairn::testing::slurp(err)};
  }

  // Whether anything is still mounted on or under the run's workspace.
  bool mounted(const std::string& id) const {
    std::ifstream mounts("/proc/self/mountinfo");
    const auto workspace = (dir / ".cairn" / "workspaces" / id).string();
    for (std::string line; std::getline(mounts, line);)
      if (line.find(" " + workspace + " ") != std::string::npos) return true;
    return false;
  }

  std::map<int, int> executions(const std::string& id) const {
    std::map<int, int> count;
    std::ifstream in(dir / ".cairn" / "workspaces" / id / "exec.log");
    for (std::string line; std::getline(in, line);) ++count[std::stoi(line)];
    return count;
  }
};

}  // namespace

TEST_CASE("cairn run and cairn resume stop gracefully on SIGTERM, SIGHUP and SIGINT; the run resumes to its end") {
  for (const int signal : {SIGTERM, SIGHUP, SIGINT}) {
    INFO("signal " << signal);
    home h;
    const json input = {{"steps", 12}, {"sleep_ms", 100}};
    auto [code, err] =
        h.stop_after({"run", STEP_AGENT, "--id", "r", "--input", input.dump()}, "r", 2, signal);
    CHECK(code == 128 + signal);
    CHECK_THAT(err, Catch::Contains("stopped by SIG") && Catch::Contains("continue it with `cairn resume r`"));
    auto [status, owner, steps] = h.row("r");
    CHECK(status == "pending");  // handed back: no dead owner to wait out
    CHECK(owner.empty());
    CHECK_FALSE(h.mounted("r"));

    std::tie(code, err) = h.stop_after({"resume", "r"}, "r", steps + 2, signal);
    CHECK(code == 128 + signal);
    CHECK_THAT(err, Catch::Contains("continue it with `cairn resume r`"));
    std::tie(status, owner, steps) = h.row("r");
    CHECK(status == "pending");
    CHECK(owner.empty());
    CHECK_FALSE(h.mounted("r"));

    const auto done = cairn::testing::run_program(CAIRN_BIN, {"resume", "r"}, h.dir.path(), h.options());
    INFO(done.out << done.err);
    CHECK(done.code == 0);
    CHECK(std::get<0>(h.row("r")) == "completed");
    const auto executed = h.executions("r");
    CHECK(executed.size() == 12);
    for (auto [seq, n] : executed) CHECK(n == 1);  // a step in flight at the signal finished in its drain period
  }
}
