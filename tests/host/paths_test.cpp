// Host paths, run ids, permissions and trust: every attack is mounted as an
// agent (tests/host/agents/symlink_agent.cpp) or another local user would
// mount it, and must leave the victim (a 0600 file of the test's user in a
// 0700 folder) with its owner, mode and bytes.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "engine/engine.hpp"
#include "tests/cairn_cli.hpp"
#include "tests/capabilities.hpp"
#include "tests/temp_dir.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;
using cairn::testing::cli_options;
using cairn::testing::cli_result;
using cairn::testing::run_program;
using cairn::testing::slurp;
using cairn::testing::temp_dir;

namespace {

constexpr uid_t nobody = 65534;

mode_t mode_of(const fs::path& p) {
  struct stat st {};
  REQUIRE(::lstat(p.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

uid_t owner_of(const fs::path& p) {
  struct stat st {};
  REQUIRE(::lstat(p.c_str(), &st) == 0);
  return st.st_uid;
}

// A secret of the test's user: victim/secret.txt, 0600 in a 0700 folder.
struct victim {
  explicit victim(const fs::path& base) : dir(base / "victim"), file(dir / "secret.txt") {
    fs::create_directories(dir);
    ::chmod(dir.c_str(), 0700);
    std::ofstream(file) << content;
    ::chmod(file.c_str(), 0600);
  }
  // Owner, mode and bytes as made.
  void check_untouched() const {
    CHECK(owner_of(dir) == ::geteuid());
    CHECK(mode_of(dir) == 0700);
    CHECK(owner_of(file) == ::geteuid());
    CHECK(mode_of(file) == 0600);
    CHECK(slurp(file) == content);
  }
  fs::path dir, file;
  std::string content = "top secret\n";
};

// A scratch folder for run_program's output that any user may write.
fs::path scratch_of(const temp_dir& t) {
  fs::path s = t.path() / "scratch";
  fs::create_directories(s);
  ::chmod(s.c_str(), 01777);
  return s;
}

cli_result cairn_cli(const temp_dir& t, const fs::path& home, std::vector<std::string> args, cli_options o = {}) {
  o.env["CAIRN_HOME"] = home.string();
  return run_program(CAIRN_BIN, std::move(args), scratch_of(t), o);
}

// Runs `body` in a section as this user and, under root, as nobody, each
// with a fresh folder `t` others may enter and a CAIRN_HOME in it that
// belongs to the user who runs cairn (`o`).
void for_each_user(
    const std::function<void(const temp_dir& t, const fs::path& home, const cli_options& o, bool as_nobody)>& body) {
  for (const bool as_nobody : {false, true}) {
    if (as_nobody && ::geteuid() != 0) continue;
    DYNAMIC_SECTION((as_nobody ? "as nobody" : "as this user")) {
      temp_dir t;
      ::chmod(t.path().c_str(), 0755);
      const fs::path home = t.path() / "home";
      cli_options o;
      if (as_nobody) {
        o.as_user = std::pair<uid_t, gid_t>{nobody, nobody};
        fs::create_directories(home);
        ::chmod(home.c_str(), 0700);
        ::chown(home.c_str(), nobody, nobody);
      }
      body(t, home, o, as_nobody);
    }
  }
}

}  // namespace

TEST_CASE("a child's workspace is never a link its parent planted, whatever --workspace says") {
  for (const std::string form : {"DIR/", "."}) {
    DYNAMIC_SECTION("--workspace " << form) {
      temp_dir t;
      ::chmod(t.path().c_str(), 0755);  // the sandbox uid passes to the workspace
      victim v(t.path());
      fs::path ws = t.path() / "ws", home = t.path() / "home";
      fs::create_directories(ws);
      cli_options o;
      std::string workspace = ws.string() + "/";
      if (form == ".") {
        o.cwd = ws;
        workspace = ".";
      }
      json input = {{"mode", "plant"}, {"target", v.dir.string()}};
      auto r = cairn_cli(t, home,
                         {"run", SYMLINK_AGENT_PATH, "--id", "p", "--workspace", workspace, "--input", input.dump(),
                          "--json"},
                         o);
      INFO(r.out << r.err);
      CHECK(r.code == 0);
      CHECK(json::parse(r.out)["output"] == "absent");  // the child saw its own empty workspace
      v.check_untouched();
      CHECK(fs::is_symlink(ws / "p.1"));  // the planted links are left as they were
      CHECK(fs::is_directory(home / "workspaces" / "p.1"));
      CHECK_FALSE(fs::exists(ws / "p.1.released"));
    }
  }
}

TEST_CASE("run ids outside [A-Za-z0-9][A-Za-z0-9._-]{0,127} or ending in cairn's suffixes are refused with exit 2") {
  temp_dir t;
  fs::path home = t.path() / "home";
  const std::vector<std::string> bad = {"a/b",   "../../../somewhere/pwn", "..",        "a..b",   ".hidden",
                                        "-x",    std::string(129, 'a'),    "x.img",     "x.log",  "v.released",
                                        "x.lock", "x.db",                  "a b",       "a\nb",   "x.img.new"};
  for (const auto& id : bad) {
    auto r = cairn_cli(t, home, {"submit", STEP_AGENT, "--id", id, "--sandbox", "none"});
    INFO(id << ": " << r.err);
    CHECK(r.code == 2);
    CHECK_THAT(r.err, Catch::Contains("not a valid run id") && Catch::Contains("1 to 128 letters"));
  }
  CHECK(cairn_cli(t, home, {"submit", STEP_AGENT, "--id", std::string(128, 'a'), "--sandbox", "none"}).code == 0);
  CHECK(cairn_cli(t, home, {"submit", STEP_AGENT, "--id", "Run-1.a_b", "--sandbox", "none"}).code == 0);
  CHECK_FALSE(fs::exists(t.path() / "somewhere"));
  CHECK_FALSE(fs::exists("/somewhere"));

  // A NUL byte cannot pass through argv; engine::submit is the other door.
  auto journal = cairn::storage::open_journal(t.path() / "nul.db");
  cairn::engine::engine_options options;
  options.home = home;
  cairn::engine::engine eng(*journal, options);
  cairn::engine::run_request request;
  request.id = std::string("a\0b", 3);
  request.agent = STEP_AGENT;
  request.sandbox = "none";
  try {
    eng.submit(request);
    FAIL("an id with a NUL byte was accepted");
  } catch (const cairn::engine::engine_error& e) {
    CHECK(e.code() == cairn::engine::errc::bad_request);
  }
  CHECK(journal->list_runs().empty());
}

TEST_CASE("a --workspace that holds CAIRN_HOME or lies in another run's workspace is refused") {
  temp_dir t;
  fs::path home = t.path() / "home";
  REQUIRE(cairn_cli(t, home, {"submit", STEP_AGENT, "--id", "first", "--sandbox", "none", "--workspace",
                              (t.path() / "first").string()})
              .code == 0);
  for (const fs::path& ws : {t.path(), home, home / "workspaces" / "other", t.path() / "first" / "inner"}) {
    auto r = cairn_cli(t, home, {"submit", STEP_AGENT, "--id", "second", "--sandbox", "none", "--workspace", ws.string()});
    INFO(ws << ": " << r.err);
    CHECK(r.code == 2);
  }
  CHECK(cairn_cli(t, home, {"submit", STEP_AGENT, "--id", "second", "--sandbox", "none"}).code == 0);
}

TEST_CASE("as root, a CAIRN_HOME another user prepared is refused and nothing it queued runs") {
  if (!cairn::testing::require_capability("root", ::geteuid() == 0, "only root can give a folder to another user"))
    return;
  for (const std::string how : {"owned by nobody", "0777"}) {
    DYNAMIC_SECTION(how) {
      temp_dir t;
      ::chmod(t.path().c_str(), 0755);
      victim v(t.path());
      fs::path home = t.path() / "home";
      fs::create_directories(home);
      cli_options as_nobody;
      as_nobody.as_user = {nobody, nobody};
      if (how == "0777") ::chmod(home.c_str(), 0777);
      else ::chown(home.c_str(), nobody, nobody);
      // What the other user queues: an agent that, as root without a sandbox, would read the victim.
      fs::path link = t.path() / "bait";
      fs::create_directories(link);
      ::chmod(link.c_str(), 0777);
      fs::create_symlink(v.file, link / "secret.txt");
      json input = {{"mode", "read"}};
      auto queued = cairn_cli(t, home,
                              {"submit", SYMLINK_AGENT_PATH, "--id", "bait", "--sandbox", "none", "--workspace",
                               link.string(), "--input", input.dump()},
                              how == "0777" ? cli_options{} : as_nobody);
      INFO(queued.err);
      if (how == "0777") {
        CHECK(queued.code == 3);  // root's own submit refuses the open folder too
        CHECK_THAT(queued.err, Catch::Contains("may be written by every user") && Catch::Contains("chmod go-w"));
      } else {
        REQUIRE(queued.code == 0);
      }
      for (std::vector<std::string> command : {std::vector<std::string>{"resume", "--all"},
                                               std::vector<std::string>{"resume", "bait"},
                                               std::vector<std::string>{"ls"}}) {
        auto r = cairn_cli(t, home, command);
        INFO(r.err);
        CHECK(r.code == 3);
        CHECK_THAT(r.err, Catch::Contains(home.string()));
      }
      v.check_untouched();
      if (how != "0777") {
        auto listed = cairn_cli(t, home, {"ls", "--json"}, as_nobody);
        INFO(listed.err);
        REQUIRE(listed.code == 0);
        CHECK(json::parse(listed.out)[0]["status"] == "pending");  // never executed
      }
    }
  }
}

// A user who may change a folder above root's workspace (its owner, or
// anyone when it is 0777 without the sticky bit) could swap the workspace
// for a folder of root's between two uses of its path (the chown to the
// sandbox uid, the mount of its image, bwrap's bind): as root, such a
// workspace, CAIRN_HOME or --workspace-root is refused, and the folder
// that would have been swapped in keeps its owner, mode and bytes.
TEST_CASE("as root, a workspace, CAIRN_HOME or workspace root below a folder another user may change is refused") {
  if (!cairn::testing::require_capability("root", ::geteuid() == 0, "only root can give a folder to another user"))
    return;
  for (const std::string how : {"owned by nobody", "0777"}) {
    DYNAMIC_SECTION(how) {
      temp_dir t;
      ::chmod(t.path().c_str(), 0755);
      const fs::path theirs = t.path() / "theirs";
      fs::create_directories(theirs);
      if (how == "0777") ::chmod(theirs.c_str(), 0777);
      else ::chown(theirs.c_str(), nobody, nobody);
      // What the other user would swap in: root's folder, under the workspace's name.
      victim v(theirs);
      const fs::path home = t.path() / "home";
      auto run = cairn_cli(t, home, {"run", SYMLINK_AGENT_PATH, "--id", "swapped", "--workspace", v.dir.string(),
                                     "--input", json{{"mode", "read"}}.dump()});
      INFO(run.out << run.err);
      CHECK(run.code != 0);
      CHECK_THAT(run.err, Catch::Contains("is refused") && Catch::Contains(theirs.string()) &&
                              Catch::Contains("chmod go-w"));
      v.check_untouched();

      auto listed = cairn_cli(t, theirs / "home", {"ls"});
      INFO(listed.err);
      CHECK(listed.code == 3);
      CHECK_THAT(listed.err, Catch::Contains("CAIRN_HOME") && Catch::Contains("is refused"));

      auto served = cairn_cli(t, home, {"serve", "--workspace-root", (theirs / "root").string()});
      INFO(served.err);
      CHECK(served.code != 0);
      CHECK_THAT(served.err, Catch::Contains("--workspace-root") && Catch::Contains("is refused"));
    }
  }
}

TEST_CASE("the run log is never opened through a planted link") {
  temp_dir t;
  ::chmod(t.path().c_str(), 0755);
  victim v(t.path());
  fs::path home = t.path() / "home";
  fs::create_directories(home);
  ::chmod(home.c_str(), 0700);

  SECTION("run log") {
    fs::create_directories(home / "logs");
    ::chmod((home / "logs").c_str(), 0700);
    fs::create_symlink(v.file, home / "logs" / "l.log");
    auto r = cairn_cli(t, home, {"run", STEP_AGENT, "--id", "l", "--sandbox", "none", "--input", R"({"steps":1})"});
    INFO(r.out << r.err);
    CHECK(r.code == 1);
    CHECK_THAT(r.err, Catch::Contains("l.log"));
  }
  v.check_untouched();
}

TEST_CASE("nothing an agent makes stays set-uid on the host, and what cairn creates is its user's alone") {
  for_each_user([](const temp_dir& t, const fs::path& home, const cli_options& o, bool as_nobody) {
    auto r = cairn_cli(t, home, {"run", SYMLINK_AGENT_PATH, "--id", "s", "--input", R"({"mode":"setuid"})", "--json"},
                       o);
    INFO(r.out << r.err);
    REQUIRE(r.code == 0);
    CHECK((json::parse(r.out)["output"].get<int>() & 06000) == 06000);  // the agent did make it set-uid
    CHECK((mode_of(home / "workspaces" / "s" / "suid") & 06000) == 0);
    CHECK(mode_of(home / "logs" / "s.log") == 0600);
    const bool root = ::geteuid() == 0 && !as_nobody;
    CHECK(mode_of(home) == (root ? 0711 : 0700));
    CHECK(mode_of(home / "workspaces") == (root ? 0711 : 0700));
    CHECK(mode_of(home / "logs") == 0700);
    CHECK(mode_of(home / "images") == 0700);
    CHECK(mode_of(home / "cairn.db") == 0600);
  });
}

TEST_CASE("what an agent leaves open in its workspace is closed to other users once its run ends") {
  for_each_user([](const temp_dir& t, const fs::path& home, const cli_options& o, bool) {
    auto r = cairn_cli(t, home, {"run", SYMLINK_AGENT_PATH, "--id", "o", "--input", R"({"mode":"open"})", "--json"},
                       o);
    INFO(r.out << r.err);
    REQUIRE(r.code == 0);
    // The agent did open them, inside its sandbox.
    const json modes = json::parse(r.out)["output"];
    CHECK(modes["open.txt"] == 0666);
    CHECK(modes["drop"] == 01777);
    CHECK(modes["."] == 0777);
    const fs::path ws = home / "workspaces" / "o";
    CHECK((mode_of(ws) & 077) == 0);  // no one else may enter it
    CHECK(mode_of(ws / "open.txt") == 0644);
    CHECK(mode_of(ws / "drop") == 0755);
    CHECK(slurp(ws / "open.txt") == "anyone may write this\n");
  });
}

TEST_CASE("the copy a release cut short keeps of an agent's files is closed to other users already") {
  if (!cairn::testing::require_capability("root", ::geteuid() == 0,
                                          "a run's files are copied out of a loop-mounted image only as root"))
    return;
  temp_dir t;
  ::chmod(t.path().c_str(), 0755);
  fs::path home = t.path() / "home";
  cli_options o;
  // Killed once its copy of the files is whole, before the copy takes the folder's place.
  o.env["CAIRN_CRASH_POINT"] = "workspace_copied:1";
  auto killed = cairn_cli(t, home, {"run", SYMLINK_AGENT_PATH, "--id", "o", "--input", R"({"mode":"open"})"}, o);
  INFO(killed.out << killed.err);
  REQUIRE(killed.code == 128 + SIGKILL);
  const fs::path whole = home / "workspaces" / ".o.released";
  REQUIRE(fs::is_directory(whole));
  CHECK((mode_of(whole) & 077) == 0);
  CHECK(mode_of(whole / "open.txt") == 0644);
  CHECK(mode_of(whole / "drop") == 0755);
  auto resumed = cairn_cli(t, home, {"resume", "o"});
  INFO(resumed.out << resumed.err);
  CHECK(resumed.code == 0);
  CHECK(mode_of(home / "workspaces" / "o" / "open.txt") == 0644);
}

TEST_CASE("a records folder another user made first under the old name does not stop a user's sandboxes") {
  if (!cairn::testing::require_capability("root", ::geteuid() == 0, "only root can act as two other users"))
    return;
  // A uid no account uses, so that the squat touches no real user's records.
  constexpr uid_t victim = 61999;
  const fs::path squatted = "/tmp/cairn-records-" + std::to_string(victim);
  const auto clear_records = [&] {
    for (const auto& entry : fs::directory_iterator("/tmp"))
      if (entry.path().filename().string().starts_with(squatted.filename().string())) fs::remove_all(entry.path());
  };
  clear_records();
  // What another user (nobody) did first: the name cairn used to trust, open to all.
  fs::create_directory(squatted);
  ::chown(squatted.c_str(), nobody, nobody);
  ::chmod(squatted.c_str(), 0777);

  temp_dir t;
  ::chmod(t.path().c_str(), 0755);
  fs::path home = t.path() / "home";
  fs::create_directories(home);
  ::chmod(home.c_str(), 0700);
  ::chown(home.c_str(), victim, victim);
  cli_options o;
  o.as_user = {victim, victim};
  o.unset = {"XDG_RUNTIME_DIR"};  // the victim has no runtime folder: /tmp is all it has
  auto r = cairn_cli(t, home, {"run", STEP_AGENT, "--id", "r", "--input", R"({"steps":1})"}, o);
  INFO(r.out << r.err);
  CHECK(r.code == 0);
  auto doctor = cairn_cli(t, home, {"doctor"}, o);
  INFO(doctor.out << doctor.err);
  CHECK_THAT(doctor.out, Catch::Contains(squatted.string() + " belongs to uid 65534"));
  // The squatter's folder is as it made it, and holds nothing of the victim's.
  CHECK(owner_of(squatted) == nobody);
  CHECK(mode_of(squatted) == 0777);
  CHECK(fs::is_empty(squatted));
  clear_records();
}

TEST_CASE("every command warns when config.json may be read by others") {
  temp_dir t;
  fs::path home = t.path() / "home";
  fs::create_directories(home);
  ::chmod(home.c_str(), 0700);
  std::ofstream(home / "config.json") << "{}";
  ::chmod((home / "config.json").c_str(), 0644);
  CHECK_THAT(cairn_cli(t, home, {"ls"}).err, Catch::Contains("config.json") && Catch::Contains("chmod 600"));
  CHECK_THAT(cairn_cli(t, home, {"doctor"}).err, Catch::Contains("config.json") && Catch::Contains("chmod 600"));
  ::chmod((home / "config.json").c_str(), 0600);
  CHECK_THAT(cairn_cli(t, home, {"ls"}).err, !Catch::Contains("config.json"));
}
