// `cairn workspace`: a suspended run's files read from the host, without
// waking the run, without writing to its image, and without following a
// link its agent planted or printing its escape sequences raw.
#include <sys/stat.h>
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <future>

#include "engine/workspace_files.hpp"
#include "tests/cairn_cli.hpp"
#include "tests/host/engine_host.hpp"
#include "tests/temp_dir.hpp"

namespace {

using cairn::testing::cli_result;

struct suspended_run {
  cairn::testing::engine_host host{std::chrono::milliseconds(0)};
  std::map<std::string, std::string> env{{"CAIRN_HOME", (host.dir / "home").string()}};

  suspended_run() {
    host.submit("viewed", WORKSPACE_VIEW_AGENT_PATH, nlohmann::json::object());
    auto run = host.eng->execute("viewed");
    REQUIRE(run.status == cairn::storage::run_status::waiting);
  }

  cli_result workspace(std::vector<std::string> args) const {
    args.insert(args.begin(), {"--db", (host.dir / "cairn.db").string(), "workspace", "viewed"});
    return cairn::testing::run_program(CAIRN_BIN, std::move(args), host.dir.path(), {.env = env});
  }
};

std::string mounts() {
  std::ifstream in("/proc/self/mountinfo");
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_CASE("cairn workspace lists and prints a suspended run's files without waking it or following its links") {
  suspended_run r;
  const auto attempts_before = r.host.count("viewed", "attempt_started");

  auto listing = r.workspace({});
  INFO(listing.err);
  REQUIRE(listing.code == 0);
  CHECK_THAT(listing.out, Catch::Contains("notes/a.txt") && Catch::Contains("escape -> /etc/shadow"));
  // A quota image, as root through a loop device, else through FUSE where fuse2fs is.
  const bool fuse = ::access("/dev/fuse", R_OK | W_OK) == 0 && ::access("/usr/bin/fuse2fs", X_OK) == 0;
  if (::geteuid() == 0 || fuse) CHECK_THAT(listing.out, Catch::Contains("quota image") && Catch::Contains("read-only"));
  // The name made of escape sequences is shown escaped.
  CHECK(listing.out.find('\x1b') == std::string::npos);
  CHECK(listing.out.find('\x07') == std::string::npos);
  CHECK_THAT(listing.out, Catch::Contains("\\x1b]0;pwned"));

  // What the agent made mode 0 is its user's own: listed and read.
  CHECK_THAT(listing.out, Catch::Contains("locked/kept.txt"));
  auto locked = r.workspace({"locked/kept.txt"});
  INFO(locked.err);
  CHECK(locked.code == 0);
  CHECK(locked.out == "kept\n");

  auto file = r.workspace({"notes/a.txt"});
  CHECK(file.code == 0);
  CHECK(file.out == "hello from the agent\n");
  CHECK(r.workspace({"/workspace/notes/a.txt"}).out == "hello from the agent\n");

  // The link is shown, never followed, alone or on the way.
  auto link = r.workspace({"escape"});
  CHECK(link.code == 0);
  CHECK_THAT(link.out, Catch::Contains("l ") && Catch::Contains("escape -> /etc/shadow"));
  CHECK_THAT(link.out, !Catch::Contains("root:"));
  auto through = r.workspace({"escape/x"});
  CHECK(through.code != 0);
  CHECK_THAT(through.err, Catch::Contains("'escape' is a link"));
  CHECK(through.out.empty());
  CHECK(r.workspace({"../../../etc/passwd"}).code != 0);

  // Nothing was woken and nothing stays mounted.
  CHECK(r.host.journal->find_run("viewed")->status == cairn::storage::run_status::waiting);
  CHECK(r.host.count("viewed", "attempt_started") == attempts_before);
  CHECK(mounts().find("cairn-workspace-") == std::string::npos);

  // The image is intact: the run reads its file after the wake-up.
  r.host.eng->signal("viewed", "go", nullptr);
  auto end = r.host.eng->execute("viewed");
  REQUIRE(end.status == cairn::storage::run_status::completed);
  CHECK(end.output == "hello from the agent\n");
}

TEST_CASE("cairn workspace reads the files a release cut short left beside the folder, not the empty folder") {
  // A host killed while it released the run's image, after its copy of the
  // files was whole (crash_test kills it there): the folder is the image's
  // empty mount point, the files are in .viewed.released beside it.
  suspended_run r;
  r.host.eng->signal("viewed", "go", nullptr);
  REQUIRE(r.host.eng->execute("viewed").status == cairn::storage::run_status::completed);
  const auto folder = r.host.journal->find_run("viewed")->workspace;
  const auto whole = std::filesystem::path(folder).parent_path() / ".viewed.released";
  std::filesystem::rename(folder, whole);
  std::filesystem::create_directories(folder);
  // The release's record of its copy, beside the image (workspace_quota.cpp): the copy's device and inode.
  struct stat st {};
  REQUIRE(::stat(whole.c_str(), &st) == 0);
  std::ofstream(r.host.dir / "home" / "images" / "viewed.img.released") << st.st_dev << " " << st.st_ino << "\n";

  auto listing = r.workspace({});
  INFO(listing.err);
  REQUIRE(listing.code == 0);
  CHECK_THAT(listing.out, Catch::Contains("notes/a.txt") && Catch::Contains(".viewed.released"));
  CHECK(r.workspace({"notes/a.txt"}).out == "hello from the agent\n");
}

TEST_CASE("cairn workspace reading a file an agent swapped for a fifo returns at once, saying so") {
  // `cairn workspace RUN FILE` checks that FILE is a file, then reads it;
  // the agent swaps a fifo in between. Here the read finds the fifo.
  using namespace std::chrono_literals;
  cairn::testing::temp_dir dir;
  const auto folder = dir / "ws";
  std::filesystem::create_directories(folder);
  REQUIRE(::mkfifo((folder / "swapped").c_str(), 0600) == 0);
  cairn::storage::run_record run;
  run.id = "swapper";
  run.workspace = folder.string();
  cairn::engine::workspace_files files(dir / "home", run);
  auto reading = std::async(std::launch::async, [&] {
    try {
      files.read("swapped", UINT64_MAX, [](const char*, std::size_t) {});
      return std::string("read it");
    } catch (const cairn::engine::engine_error& e) {
      return std::string(e.what());
    }
  });
  if (reading.wait_for(60s) != std::future_status::ready) {
    // A writer lets the blocked open return, so that the case can end.
    cairn::runtime::unique_fd writer(::open((folder / "swapped").c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC));
    reading.wait();
    FAIL("reading the fifo blocked for 60 s");
  }
  CHECK_THAT(reading.get(), Catch::Contains("'swapped' is not a regular file"));
}
