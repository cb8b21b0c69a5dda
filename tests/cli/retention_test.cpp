// `cairn rm` and `cairn gc` as users and scripts see them: what goes (journal
// rows, log, workspace), what is refused and why, exit codes, --dry-run,
// and the journal file shrinking.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <fstream>

#include <SQLiteCpp/SQLiteCpp.h>
#include <nlohmann/json.hpp>

#include "tests/cairn_cli.hpp"
#include "tests/temp_dir.hpp"

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

// A CAIRN_HOME in a folder of its own, and `cairn` run against it.
struct home {
  cairn::testing::temp_dir dir;
  fs::path cairn_home() const { return dir / ".cairn"; }
  fs::path db() const { return cairn_home() / "cairn.db"; }
  cairn::testing::cli_result cli(std::vector<std::string> args) const {
    return cairn::testing::run_program(CAIRN_BIN, std::move(args), dir.path(),
                                       {.cwd = dir.path(),
                                        .env = {{"CAIRN_HOME", cairn_home().string()}},
                                        .unset = {"CAIRN_DB", "CAIRN_CRASH_POINT"}});
  }
  // A run of step_agent to its end, without a sandbox (quick); `terminal_at` fails it there.
  void run(const std::string& id, int steps = 2, int terminal_at = -1) const {
    json input{{"steps", steps}};
    if (terminal_at >= 0) input["terminal_at"] = terminal_at;
    auto r = cli({"run", STEP_AGENT, "--id", id, "--sandbox", "none", "--max-attempts", "1", "--input", input.dump()});
    INFO(r.out << r.err);
    REQUIRE(r.code == (terminal_at >= 0 ? 1 : 0));
  }
  std::vector<std::string> ids() const {
    auto r = cli({"ls", "--json"});
    REQUIRE(r.code == 0);
    std::vector<std::string> out;
    for (const auto& run : json::parse(r.out)) out.push_back(run["id"]);
    std::sort(out.begin(), out.end());
    return out;
  }
  void sql(const std::string& statement) const {
    SQLite::Database raw(db().string(), SQLite::OPEN_READWRITE);
    raw.exec(statement);
  }
};

}  // namespace

TEST_CASE("cairn rm removes an ended run: its journal rows, its log and its workspace, never through a link") {
  home h;
  h.run("r1");
  h.run("r2");
  const auto workspace = h.cairn_home() / "workspaces" / "r1";
  const auto log = h.cairn_home() / "logs" / "r1.log";
  REQUIRE(fs::is_directory(workspace));
  REQUIRE(fs::exists(log));
  // What an agent could plant in its workspace: links to a file and a folder of the host's.
  std::ofstream(h.dir / "precious.txt") << "keep me";
  fs::create_directories(h.dir / "precious" / "inside");
  std::ofstream(h.dir / "precious" / "inside" / "file") << "keep me too";
  fs::create_directories(workspace / "deep" / "er");
  std::ofstream(workspace / "deep" / "er" / "notes") << "agent's";
  fs::create_symlink(h.dir / "precious.txt", workspace / "link-to-file");
  fs::create_symlink(h.dir / "precious", workspace / "deep" / "link-to-folder");

  auto r = h.cli({"rm", "r1"});
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("removed 1 run: r1"));
  CHECK_FALSE(fs::exists(fs::symlink_status(workspace)));
  CHECK_FALSE(fs::exists(log));
  CHECK(cairn::testing::slurp(h.dir / "precious.txt") == "keep me");
  CHECK(cairn::testing::slurp(h.dir / "precious" / "inside" / "file") == "keep me too");
  CHECK(h.ids() == std::vector<std::string>{"r2"});
  auto show = h.cli({"show", "r1"});
  CHECK(show.code == 2);
  CHECK(fs::is_directory(h.cairn_home() / "workspaces" / "r2"));  // another run's files stay

  // Again: it is gone, so it is unknown.
  auto again = h.cli({"rm", "r1"});
  CHECK(again.code == 2);
  CHECK_THAT(again.err, Catch::Contains("no run r1"));
}

TEST_CASE("cairn rm refuses an unknown run (2), a live one (2, cancel it first) and one another worker holds (4)") {
  home h;
  h.run("done");
  auto queued = h.cli({"submit", STEP_AGENT, "--id", "queued", "--sandbox", "none"});
  REQUIRE(queued.code == 0);
  auto submitted = h.cli({"submit", STEP_AGENT, "--id", "held", "--sandbox", "none"});
  REQUIRE(submitted.code == 0);
  h.sql("UPDATE runs SET status = 'running', owner = 'otherhost:4121' WHERE id = 'held'");

  auto unknown = h.cli({"rm", "nobody"});
  CHECK(unknown.code == 2);
  CHECK_THAT(unknown.err, Catch::Contains("no run nobody"));

  auto live = h.cli({"rm", "queued"});
  CHECK(live.code == 2);
  CHECK_THAT(live.err, Catch::Contains("has not ended (pending)") && Catch::Contains("`cairn cancel queued`"));

  auto held = h.cli({"rm", "held"});
  CHECK(held.code == 4);
  CHECK_THAT(held.err, Catch::Contains("held by") && Catch::Contains("otherhost") &&
                           Catch::Contains("`cairn cancel held`"));

  // Several at once: what may go goes; the exit code is the worst refusal's.
  auto mixed = h.cli({"rm", "queued", "done", "held", "--json"});
  CHECK(mixed.code == 4);
  CHECK(json::parse(mixed.out)["removed"] == json::array({"done"}));
  CHECK(h.ids() == std::vector<std::string>{"held", "queued"});
}

TEST_CASE("cairn gc: --dry-run changes nothing; --status, --keep-last and --older-than select what goes") {
  home h;
  for (const char* id : {"c1", "c2", "c3", "c4"}) h.run(id);
  h.run("f1", 2, 0);
  REQUIRE(h.cli({"submit", STEP_AGENT, "--id", "p1", "--sandbox", "none"}).code == 0);
  const auto all = h.ids();

  auto dry = h.cli({"gc", "--dry-run"});
  INFO(dry.out << dry.err);
  REQUIRE(dry.code == 0);
  CHECK_THAT(dry.out, Catch::Contains("c1  completed") && Catch::Contains("f1  failed") &&
                          Catch::Contains("would remove 5 runs") && Catch::Contains("nothing was changed"));
  CHECK(h.ids() == all);
  CHECK(fs::is_directory(h.cairn_home() / "workspaces" / "c1"));
  auto dry_json = h.cli({"gc", "--dry-run", "--json", "--status", "failed"});
  CHECK(json::parse(dry_json.out)["runs"].size() == 1);
  CHECK(h.ids() == all);

  // Nothing ended more than an hour ago.
  auto young = h.cli({"gc", "--older-than", "1h"});
  CHECK(young.code == 0);
  CHECK_THAT(young.out, Catch::Contains("removed 0 runs"));
  CHECK(h.ids() == all);

  auto failed = h.cli({"gc", "--status", "failed"});
  INFO(failed.out << failed.err);
  CHECK(failed.code == 0);
  CHECK_THAT(failed.out, Catch::Contains("removed 1 run;"));
  CHECK(h.ids() == std::vector<std::string>{"c1", "c2", "c3", "c4", "p1"});

  // The newest two stay (by creation); the pending run is never a candidate.
  auto keep = h.cli({"gc", "--keep-last", "2", "--json"});
  INFO(keep.out << keep.err);
  CHECK(keep.code == 0);
  CHECK(json::parse(keep.out)["removed"] == json::array({"c1", "c2"}));
  CHECK(h.ids() == std::vector<std::string>{"c3", "c4", "p1"});
  CHECK_FALSE(fs::exists(h.cairn_home() / "workspaces" / "c1"));

  // c3 ended two days ago.
  h.sql("UPDATE runs SET finished_at_ms = finished_at_ms - 2 * 86400000 WHERE id = 'c3'");
  auto old = h.cli({"gc", "--older-than", "1d"});
  CHECK(old.code == 0);
  CHECK(h.ids() == std::vector<std::string>{"c4", "p1"});

  auto bad_status = h.cli({"gc", "--status", "running"});
  CHECK(bad_status.code == 2);
  auto bad_age = h.cli({"gc", "--older-than", "soon"});
  CHECK(bad_age.code == 2);
  CHECK_THAT(bad_age.err, Catch::Contains("--older-than"));
  CHECK(h.ids() == std::vector<std::string>{"c4", "p1"});
}

TEST_CASE("cairn gc of many runs gives their space back: the journal file shrinks") {
  home h;
  h.run("seed");
  // 400 ended runs of 16 KB each, made in the journal directly (quicker than running them).
  h.sql("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 400) "
        "INSERT INTO runs (id, agent, input, status, max_attempts, sandbox, workspace, created_at_ms, updated_at_ms, "
        "finished_at_ms, policy) "
        "SELECT 'bulk' || i, agent, input, 'completed', max_attempts, sandbox, replace(workspace, 'seed', 'bulk' || i), "
        "created_at_ms + i, updated_at_ms, finished_at_ms, policy FROM n, runs WHERE runs.id = 'seed'");
  h.sql("INSERT INTO steps (run_id, seq, name, kind, status, output, attempt, duration_us, started_at_ms, "
        "finished_at_ms) SELECT id, 0, 'big', 'step', 'ok', json_quote(hex(randomblob(8000))), 1, 0, 0, 0 "
        "FROM runs WHERE id LIKE 'bulk%'");
  REQUIRE(h.ids().size() == 401);
  const auto before = fs::file_size(h.db());  // no cairn process holds it: checkpointed into the file
  REQUIRE(before > 6'000'000);

  auto r = h.cli({"gc", "--keep-last", "1", "--json"});
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  const auto summary = json::parse(r.out);
  CHECK(summary["removed"].size() == 400);
  CHECK(summary["journal_size_after"].get<std::uint64_t>() < summary["journal_size_before"].get<std::uint64_t>() / 4);
  CHECK(h.ids() == std::vector<std::string>{"bulk400"});  // the newest
  CHECK(fs::file_size(h.db()) < before / 4);
}
