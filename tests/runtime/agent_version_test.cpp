// An agent's version and its kept copy (runtime/agent_version.hpp): what the
// hash covers, what it leaves out, and a copy nobody can write.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "runtime/agent_version.hpp"
#include "runtime/sandbox.hpp"
#include "tests/temp_dir.hpp"

using namespace cairn;
namespace fs = std::filesystem;

namespace {

void write(const fs::path& p, const std::string& text, fs::perms perms = fs::perms::owner_read | fs::perms::owner_write) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
  fs::permissions(p, perms);
}

constexpr auto executable = fs::perms::owner_all | fs::perms::group_read | fs::perms::others_read;

// A script agent: agent.py in `folder`, with a module beside it.
fs::path script_agent(const fs::path& folder) {
  write(folder / "agent.py", "#!/usr/bin/env python3\nimport helper\n", executable);
  write(folder / "helper.py", "X = 1\n");
  return folder / "agent.py";
}

std::string id_of(const fs::path& program, const std::vector<fs::path>& private_paths = {}) {
  return runtime::identify_agent(program, private_paths).id;
}

}  // namespace

TEST_CASE("a script agent's version covers its folder's files, not its caches, dot-entries or private paths") {
  testing::temp_dir dir;
  const auto agent = script_agent(dir / "app");
  write(dir / "app/lib/mod.py", "Y = 1\n");
  const auto v = runtime::identify_agent(agent, {});
  CHECK(v.script);
  CHECK(v.partial.empty());
  CHECK(v.files == 4);  // agent.py, helper.py, lib, lib/mod.py
  CHECK(v.id.starts_with("sha256:"));
  CHECK(v.program_sha256.size() == 64);

  // Left out: nothing the sandbox hides or a cache holds changes the version.
  write(dir / "app/.cairn/cairn.db", "journal");
  write(dir / "app/.env", "OPENAI_API_KEY=sk-secret");
  write(dir / "app/__pycache__/helper.cpython-311.pyc", "bytecode");
  write(dir / "app/lib/.git/HEAD", "ref");
  write(dir / "app/journal.db", "another journal");  // a private path inside the folder
  CHECK(id_of(agent, {dir / "app/journal.db"}) == v.id);

  SECTION("a module's content changes it") {
    write(dir / "app/helper.py", "X = 2\n");
    CHECK(id_of(agent, {dir / "app/journal.db"}) != v.id);
  }
  SECTION("a new file changes it, node_modules too") {
    write(dir / "app/node_modules/dep/index.js", "export {}\n");
    CHECK(id_of(agent, {dir / "app/journal.db"}) != v.id);
  }
  SECTION("a mode's executable bit changes it") {
    fs::permissions(dir / "app/helper.py", executable);
    CHECK(id_of(agent, {dir / "app/journal.db"}) != v.id);
  }
  SECTION("a link is covered by its target's text and never followed") {
    write(dir / "outside/secret.txt", "secret");
    fs::create_symlink(dir / "outside", dir / "app/data");
    const auto linked = id_of(agent, {dir / "app/journal.db"});
    CHECK(linked != v.id);
    write(dir / "outside/secret.txt", "another secret");
    CHECK(id_of(agent, {dir / "app/journal.db"}) == linked);
  }
}

TEST_CASE("a compiled agent's version is its program's content and name") {
  testing::temp_dir dir;
  write(dir / "bin/agent", "\x7f" "ELF one", executable);
  write(dir / "bin/other", "not covered", executable);
  const auto v = runtime::identify_agent(dir / "bin/agent", {});
  CHECK_FALSE(v.script);
  CHECK(v.files == 1);
  write(dir / "bin/other", "still not covered", executable);
  CHECK(id_of(dir / "bin/agent") == v.id);
  write(dir / "bin/agent", "\x7f" "ELF two", executable);
  CHECK(id_of(dir / "bin/agent") != v.id);
}

TEST_CASE("a folder past its bounds is versioned by its program alone and not kept") {
  testing::temp_dir dir;
  const auto agent = script_agent(dir / "app");
  for (int i = 0; i < 5; ++i) write(dir / "app/data" / std::to_string(i), "x");
  const auto v = runtime::identify_agent(agent, {}, {.max_files = 4});
  CHECK(v.script);
  CHECK_THAT(v.partial, Catch::Contains("more than 4 files"));
  CHECK(v.files == 1);
  const auto kept = runtime::keep_agent(v, dir / "store", {}, {.max_files = 4});
  REQUIRE(std::holds_alternative<std::string>(kept));
  CHECK_THAT(std::get<std::string>(kept), Catch::Contains("only its program is versioned"));
}

TEST_CASE("a kept copy holds what the version covers, read-only, once per content") {
  testing::temp_dir dir;
  const auto agent = script_agent(dir / "app");
  write(dir / "app/.env", "OPENAI_API_KEY=sk-secret");
  write(dir / "app/__pycache__/helper.pyc", "bytecode");
  fs::create_symlink("helper.py", dir / "app/alias.py");
  const auto v = runtime::identify_agent(agent, {});
  const auto kept = runtime::keep_agent(v, dir / "store", {});
  REQUIRE(std::holds_alternative<fs::path>(kept));
  const auto program = std::get<fs::path>(kept);
  const auto copy = program.parent_path();
  CHECK(copy == dir / "store" / v.id.substr(7));
  CHECK(fs::exists(copy / "helper.py"));
  CHECK(fs::is_symlink(copy / "alias.py"));
  CHECK(fs::read_symlink(copy / "alias.py") == "helper.py");
  CHECK_FALSE(fs::exists(copy / ".env"));
  CHECK_FALSE(fs::exists(copy / "__pycache__"));
  struct stat st {};
  REQUIRE(::stat(program.c_str(), &st) == 0);
  CHECK((st.st_mode & 0222) == 0);
  CHECK((st.st_mode & S_IXUSR) != 0);
  // The copy is the same version: identified where it lies, it is what was kept.
  CHECK(id_of(program) == v.id);
  CHECK(runtime::find_kept_agent(dir / "store", v.id, "agent.py") == program);
  CHECK_FALSE(runtime::find_kept_agent(dir / "store", v.id, "other.py"));

  // Kept again: the same copy, nothing staged left behind.
  const auto again = runtime::keep_agent(v, dir / "store", {});
  CHECK(std::get<fs::path>(again) == program);
  int entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir / "store")) ++entries;
  CHECK(entries == 1);

  // What changed after it was identified is not kept under its id.
  write(dir / "app/helper.py", "X = 3\n");
  auto changed = runtime::keep_agent(v, dir / "other_store", {});
  if (auto* why = std::get_if<std::string>(&changed)) CHECK_THAT(*why, Catch::Contains("changed while it was copied"));
  else FAIL("a changed agent was kept under its old version");
}

TEST_CASE("identifying a missing agent names it") {
  testing::temp_dir dir;
  CHECK_THROWS_AS(runtime::identify_agent(dir / "nothing", {}), runtime::sandbox_error);
}

// What identifying costs, by hand: `agent_version_test "[.measure]"`; with
// CAIRN_MEASURE_AGENT=PATH, of that agent instead (a copy goes to a temporary folder).
TEST_CASE("identifying a folder of 1,000 files and 40 MiB", "[.measure]") {
  testing::temp_dir dir;
  fs::path agent;
  if (const char* given = std::getenv("CAIRN_MEASURE_AGENT")) {
    agent = given;
  } else {
    agent = script_agent(dir / "app");
    const std::string chunk(40 * 1024, 'x');
    for (int i = 0; i < 1000; ++i) write(dir / "app/node_modules" / std::to_string(i / 100) / std::to_string(i), chunk);
    // Files changed in the last 2 s are hashed again (hash_cache): past that, rounds 2 and 3 show the cache.
    std::this_thread::sleep_for(std::chrono::milliseconds(2100));
  }
  for (int round = 0; round < 3; ++round) {
    const auto start = std::chrono::steady_clock::now();
    const auto v = runtime::identify_agent(agent, {});
    const auto identified = std::chrono::steady_clock::now();
    const auto kept = runtime::keep_agent(v, dir / ("store" + std::to_string(round)), {});
    const auto end = std::chrono::steady_clock::now();
    using ms = std::chrono::duration<double, std::milli>;
    WARN(v.files << " entries, " << v.bytes << " bytes: identified in " << ms(identified - start).count()
                 << " ms, kept in " << ms(end - identified).count() << " ms");
    CHECK(std::holds_alternative<fs::path>(kept));
  }
}

TEST_CASE("a folder the sandbox refuses to show is neither versioned nor kept") {
  testing::temp_dir dir;
  const auto agent = script_agent(dir / "app");
  CHECK_THROWS_WITH(runtime::identify_agent(agent, {dir.path()}), Catch::Contains("lies inside"));
  fs::permissions(dir / "app", fs::perms::all | fs::perms::sticky_bit);
  CHECK_THROWS_WITH(runtime::identify_agent(agent, {}), Catch::Contains("may be written by every user"));
  CHECK_THROWS(runtime::keep_agent(runtime::agent_version{.program = agent, .id = "sha256:0"}, dir / "store", {}));
}
