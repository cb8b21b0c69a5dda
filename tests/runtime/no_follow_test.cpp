// The host's folders are opened and made without following a link at any
// component: a link planted on the way (by an agent in its workspace, by
// another user in a shared folder) is refused, and nothing is made where it
// points.
#include <sys/stat.h>

#include "runtime/no_follow.hpp"
#include "tests/runtime/sandbox_fixture.hpp"

namespace cairn::runtime::test {
namespace {

mode_t mode_of(const fs::path& p) {
  struct stat st {};
  REQUIRE(::lstat(p.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

// Sets the umask for as long as it lives.
struct umask_set {
  explicit umask_set(mode_t mask) : before(::umask(mask)) {}
  ~umask_set() { ::umask(before); }
  mode_t before;
};

}  // namespace

TEST_CASE("no_follow: a missing folder is made with exactly its mode, whatever the umask") {
  temp_dir dir;
  umask_set mask(077);
  SECTION("the last folder alone missing (a new run's workspace)") {
    REQUIRE(open_folder_no_follow(dir.path / "ws", 0711));
    CHECK(mode_of(dir.path / "ws") == 0711);
  }
  SECTION("folders missing higher up too") {
    REQUIRE(open_folder_no_follow(dir.path / "a" / "b" / "ws", 0711));
    for (const auto& made : {dir.path / "a", dir.path / "a" / "b", dir.path / "a" / "b" / "ws"})
      CHECK(mode_of(made) == 0711);
  }
  SECTION("a folder that exists keeps its mode") {
    fs::create_directory(dir.path / "ws");
    fs::permissions(dir.path / "ws", fs::perms(0750));
    REQUIRE(open_folder_no_follow(dir.path / "ws", 0711));
    CHECK(mode_of(dir.path / "ws") == 0750);
  }
}

TEST_CASE("no_follow: a link on the way to a folder to make is refused, and nothing is made where it points") {
  temp_dir dir;
  fs::create_directory(dir.path / "elsewhere");
  fs::create_directory(dir.path / "home");
  SECTION("the parent is a link") {
    fs::create_directory_symlink(dir.path / "elsewhere", dir.path / "home" / "workspaces");
    CHECK_THROWS_WITH(open_folder_no_follow(dir.path / "home" / "workspaces" / "ws", 0700),
                      Catch::Contains("is a symbolic link or not a folder"));
    CHECK(fs::is_empty(dir.path / "elsewhere"));
  }
  SECTION("a folder higher up is a link") {
    fs::create_directory_symlink(dir.path / "elsewhere", dir.path / "home" / "up");
    CHECK_THROWS_WITH(open_folder_no_follow(dir.path / "home" / "up" / "missing" / "ws", 0700),
                      Catch::Contains("is a symbolic link or not a folder"));
    CHECK(fs::is_empty(dir.path / "elsewhere"));
  }
  SECTION("the folder itself is a link") {
    fs::permissions(dir.path / "elsewhere", fs::perms(0755));
    fs::create_directory_symlink(dir.path / "elsewhere", dir.path / "home" / "ws");
    CHECK_THROWS_WITH(open_folder_no_follow(dir.path / "home" / "ws", 0700),
                      Catch::Contains("is a symbolic link or not a folder"));
    CHECK(mode_of(dir.path / "elsewhere") == 0755);
  }
  SECTION("a link to nowhere, where the folder is to be made") {
    fs::create_directory_symlink(dir.path / "elsewhere" / "new", dir.path / "home" / "ws");
    CHECK_THROWS_WITH(open_folder_no_follow(dir.path / "home" / "ws", 0700),
                      Catch::Contains("is a symbolic link or not a folder"));
    CHECK_FALSE(fs::exists(dir.path / "elsewhere" / "new"));
  }
}

}  // namespace cairn::runtime::test
