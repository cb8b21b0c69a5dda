// The workspace quota image (root only): mounted while a sandbox lives, its
// files kept across attempts, and turned back into a plain folder by
// release_workspace(), whatever crash came in between.
#include <linux/magic.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <functional>

#include "runtime/mountinfo.hpp"
#include "runtime/own_records.hpp"
#include "runtime/sandbox_resources.hpp"
#include "runtime/workspace_quota.hpp"
#include "tests/runtime/sandbox_fixture.hpp"

namespace cairn::runtime::test {
namespace {

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

bool is_mount_point(const fs::path& folder) {
  struct stat here {}, parent {};
  return ::stat(folder.c_str(), &here) == 0 && ::stat((folder / "..").c_str(), &parent) == 0 &&
         here.st_dev != parent.st_dev;
}

// The loop device's sysfs folder behind the mount at `folder`.
fs::path loop_sysfs(const fs::path& folder) {
  struct stat st {};
  REQUIRE(::stat(folder.c_str(), &st) == 0);
  return fs::path("/sys/dev/block") / (std::to_string(major(st.st_dev)) + ":" + std::to_string(minor(st.st_dev)));
}

// Not root: images are mounted through FUSE, by fuse2fs.
bool through_fuse() { return ::geteuid() != 0; }

// Whether the image is let go, polled until it is: its loop device serves
// it no more (root), or no fuse2fs serves it (FUSE).
bool loop_released(const fs::path& sysfs, const fs::path& image) {
  // A loop device detached meanwhile has no backing file to read (ENXIO).
  auto backing = [&]() -> std::string {
    try {
      return read_file(sysfs / "loop" / "backing_file");
    } catch (const std::exception&) {
      return "";
    }
  };
  auto deadline = std::chrono::steady_clock::now() + patience;
  while (std::chrono::steady_clock::now() < deadline) {
    if (through_fuse() ? count_processes_with(image.string()) == 0 : backing().find(image.string()) == std::string::npos)
      return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

// Whether `file` is gone, polled until it is (an image a release renamed
// away is deleted in the background).
bool eventually_gone(const fs::path& file) {
  for (auto deadline = std::chrono::steady_clock::now() + patience; std::chrono::steady_clock::now() < deadline;) {
    if (!fs::exists(file)) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

// The name a release gives an image it deletes, and the name of its copy
// of the files once that is whole (workspace_quota.cpp).
fs::path doomed_image(const fs::path& image) { return image.parent_path() / ("." + image.filename().string() + ".doomed"); }
fs::path whole_copy(const fs::path& workspace) {
  return workspace.parent_path() / ("." + workspace.filename().string() + ".released");
}

// Two sandboxes write result.txt in turn, "older" then "done"; the image as
// the first left it is copied to `older_image`.
void write_older_then_done(sandbox_backend& backend, const sandbox_spec& spec, const fs::path& older_image) {
  for (const char* text : {"older", "done"}) {
    auto box = backend.create(spec);
    CHECK(run_probe(*box, {"write", "/workspace/result.txt", text})["ok"] == true);
    box.reset();
    if (text == std::string("older")) fs::copy_file(spec.workspace_image, older_image);
  }
}

// The state a release leaves when a crash cuts it short after its copy of
// the files was whole: the copy beside the folder, the folder an empty
// mount point, the image still there, older than the copy when `older_image`
// is given (it is never flushed again once the copy is whole).
// The release has recorded the copy as its own beside the image
// (IMAGE.released: the copy's device and inode).
void cut_short_after_copy(sandbox_backend& backend, const sandbox_spec& spec, const fs::path& older_image) {
  backend.release_workspace(spec.workspace, spec.workspace_image);
  fs::rename(spec.workspace, whole_copy(spec.workspace));
  fs::create_directories(spec.workspace);
  struct stat st {};
  REQUIRE(::stat(whole_copy(spec.workspace).c_str(), &st) == 0);
  std::ofstream(fs::path(spec.workspace_image) += ".released") << st.st_dev << " " << st.st_ino << "\n";
  if (!older_image.empty()) fs::copy_file(older_image, spec.workspace_image);
}

// The images made ahead in `folder` (workspace_template.hpp).
std::vector<fs::path> images_ready(const fs::path& folder) {
  std::vector<fs::path> found;
  for (const auto& entry : fs::directory_iterator(folder))
    if (entry.path().filename().string().find(".ready-") != std::string::npos) found.push_back(entry.path());
  return found;
}

// Whether the background has made images_made_ahead images in `folder`,
// polled until it has.
bool stock_full(const fs::path& folder) {
  for (auto deadline = std::chrono::steady_clock::now() + patience; std::chrono::steady_clock::now() < deadline;) {
    if (images_ready(folder).size() == images_made_ahead) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

// The command a dead host's mount of `image` at `folder` is made with: one
// that outlives the process that made it.
std::string outliving_mount(const fs::path& image, const fs::path& folder) {
  return through_fuse() ? "fuse2fs " + image.string() + " " + folder.string() + " -o rw,nonempty 2>/dev/null"
                        : "mount -o loop,nosuid,nodev " + image.string() + " " + folder.string();
}

// Where these tests keep a folder's image when they call the quota functions directly.
fs::path image_of(const fs::path& folder) { return folder.string() + ".img"; }

// The filesystem UUID in an ext4 image: s_uuid, 0x68 into the superblock at 1024.
std::string ext4_uuid(const fs::path& image) {
  std::ifstream in(image, std::ios::binary);
  in.seekg(1024 + 0x68);
  std::string uuid(16, '\0');
  in.read(uuid.data(), static_cast<std::streamsize>(uuid.size()));
  return uuid;
}

// Runs `body` in a child process with a mount namespace of its own where no
// loop device is mounted: a sweep there sees only what `body` mounts, and no
// other process's sweep sees that. Returns what `body` reports; FAILs with
// what it threw.
json in_private_mount_world(const std::function<json()>& body) {
  // A normal user's FUSE mounts are only this user's: no other test's sweep unmounts them.
  if (through_fuse()) return body();
  int out[2];
  REQUIRE(::pipe(out) == 0);
  pid_t child = ::fork();
  if (child == 0) {
    ::close(out[0]);
    json report;
    try {
      if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
        throw std::runtime_error(std::string("a private mount namespace: ") + std::strerror(errno));
      auto mounts = read_mountinfo();
      for (auto m = mounts.rbegin(); m != mounts.rend(); ++m)
        if (m->source.rfind("/dev/loop", 0) == 0) ::umount2(m->mount_point.c_str(), MNT_DETACH);
      report = body();
    } catch (const std::exception& e) {
      report = {{"error", e.what()}};
    }
    std::string text = report.dump();
    bool sent = ::write(out[1], text.data(), text.size()) == static_cast<ssize_t>(text.size());
    ::_exit(sent ? 0 : 1);
  }
  ::close(out[1]);
  std::string text;
  char buffer[4096];
  for (ssize_t n; (n = ::read(out[0], buffer, sizeof buffer)) > 0;) text.append(buffer, static_cast<std::size_t>(n));
  ::close(out[0]);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  INFO(text);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  json report = json::parse(text);
  REQUIRE_FALSE(report.contains("error"));
  return report;
}

}  // namespace

TEST_CASE_METHOD(bwrap_fixture, "quota: the workspace is an image mounted while the sandbox lives") {
  if (!require_quota()) return;
  fs::path ws = dir.path / "ws", image = spec.workspace_image;
  REQUIRE(fs::exists(image));
  CHECK(fs::file_size(image) == workspace_image_size(16u << 20));
  REQUIRE(is_mount_point(ws));
  CHECK(fs::is_empty(ws));  // no lost+found in the agent's way
  // noatime as the agent sees it too (a pooled sandbox's copy of the mount
  // included): its reads leave nothing for the unmount to flush.
  json mounts = probe({"read", "/proc/self/mountinfo"});
  REQUIRE(mounts["ok"] == true);
  std::istringstream lines(mounts["detail"].get<std::string>());
  std::optional<std::string> workspace_options;
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    std::string id, parent, device, root, point, options;
    fields >> id >> parent >> device >> root >> point >> options;
    if (point == "/workspace") workspace_options = options;  // the last: the one on top
  }
  REQUIRE(workspace_options);
  CHECK_THAT(*workspace_options, Catch::Contains("noatime"));
  fs::path loop = loop_sysfs(ws);
  CHECK(probe({"write", "/workspace/kept.txt", "from attempt 1"})["ok"] == true);

  box->destroy();
  CHECK_FALSE(is_mount_point(ws));
  CHECK(fs::is_empty(ws));
  CHECK(loop_released(loop, image));

  // The next attempt finds the file; so does a second exec after destroy().
  box = backend->create(spec);
  CHECK(probe({"read", "/workspace/kept.txt"})["detail"] == "from attempt 1");
  box->destroy();
  CHECK(probe({"read", "/workspace/kept.txt"})["detail"] == "from attempt 1");
}

TEST_CASE("quota: files already in the workspace folder move into the image") {
  if (!require_quota()) return;
  temp_dir dir;
  sandbox_spec spec = make_spec(dir);
  fs::create_directories(spec.workspace / "sub");
  std::ofstream(spec.workspace / "input.txt") << "from the user";
  std::ofstream(spec.workspace / "sub" / "deep.txt") << "deep";
  auto backend = make_bwrap_backend();
  {
    auto box = backend->create(spec);
    CHECK(run_probe(*box, {"read", "/workspace/input.txt"})["detail"] == "from the user");
    CHECK(run_probe(*box, {"read", "/workspace/sub/deep.txt"})["detail"] == "deep");
  }
  CHECK(fs::is_empty(spec.workspace));  // they live in the image now
  backend->release_workspace(spec.workspace, spec.workspace_image);
  CHECK(read_file(spec.workspace / "input.txt") == "from the user");
  CHECK(read_file(spec.workspace / "sub" / "deep.txt") == "deep");
}

TEST_CASE("quota: release_workspace leaves a plain folder and is idempotent") {
  if (!require_quota()) return;
  temp_dir dir;
  sandbox_spec spec = make_spec(dir);
  auto backend = make_bwrap_backend();
  {
    auto box = backend->create(spec);
    CHECK(run_probe(*box, {"write", "/workspace/result.txt", "done"})["ok"] == true);
    CHECK_THROWS_AS(backend->release_workspace(spec.workspace, spec.workspace_image),
                    sandbox_error);  // still in use
  }
  backend->release_workspace(spec.workspace, spec.workspace_image);
  CHECK(read_file(spec.workspace / "result.txt") == "done");
  CHECK_FALSE(fs::exists(spec.workspace / "lost+found"));
  CHECK_FALSE(fs::exists(spec.workspace_image));
  CHECK_FALSE(fs::exists(dir.path / "ws.released"));
  CHECK_FALSE(is_mount_point(spec.workspace));
  backend->release_workspace(spec.workspace, spec.workspace_image);
  CHECK(read_file(spec.workspace / "result.txt") == "done");
  // A plain folder with no image: the next run starts a new image from it.
  auto box = backend->create(spec);
  CHECK(run_probe(*box, {"read", "/workspace/result.txt"})["detail"] == "done");
}

TEST_CASE("quota: the attempt that ends its run releases the workspace from the image its sandbox mounted") {
  if (!require_quota() || pooled_without_quota()) return;
  temp_dir dir;
  sandbox_spec spec = make_spec(dir);
  auto backend = test_backend(dir);  // pooled too, under runtime_test_pooled: the pool's image, taken
  auto box = backend->create(spec);
  CHECK(run_probe(*box, {"write", "/workspace/result.txt", "done"})["ok"] == true);
  REQUIRE(is_mount_point(spec.workspace));
  const auto loop = through_fuse() ? fs::path() : loop_sysfs(spec.workspace);
  box->destroy_ending_run();
  CHECK(read_file(spec.workspace / "result.txt") == "done");
  CHECK_FALSE(fs::exists(spec.workspace / "lost+found"));
  CHECK_FALSE(fs::exists(spec.workspace_image));
  CHECK_FALSE(fs::exists(dir.path / "ws.released"));
  CHECK_FALSE(is_mount_point(spec.workspace));
  if (!through_fuse()) CHECK(loop_released(loop, spec.workspace_image));
  CHECK(eventually_gone(doomed_image(spec.workspace_image)));
  CHECK_FALSE(fs::exists(whole_copy(spec.workspace)));
  // What the engine does next finds nothing left to do.
  backend->release_workspace(spec.workspace, spec.workspace_image);
  CHECK(read_file(spec.workspace / "result.txt") == "done");
  box.reset();
  CHECK(read_file(spec.workspace / "result.txt") == "done");
}

TEST_CASE("quota: a workspace another sandbox still uses is not released by the attempt that ends its run") {
  if (!require_quota()) return;
  temp_dir dir;
  sandbox_spec spec = make_spec(dir);
  auto backend = make_bwrap_backend();
  auto ending = backend->create(spec);
  CHECK(run_probe(*ending, {"write", "/workspace/result.txt", "done"})["ok"] == true);
  auto other = backend->create(spec);  // the same workspace, one mount
  CHECK_THROWS_AS(ending->destroy_ending_run(), sandbox_error);
  // Destroyed all the same; the files stay in the image the other one uses.
  CHECK(run_probe(*other, {"read", "/workspace/result.txt"})["detail"] == "done");
  CHECK(fs::exists(spec.workspace_image));
  other.reset();
  backend->release_workspace(spec.workspace, spec.workspace_image);
  CHECK(read_file(spec.workspace / "result.txt") == "done");
  CHECK_FALSE(fs::exists(spec.workspace_image));
}

TEST_CASE("quota: a folder and a file the agent made mode 0 are released all the same") {
  // Root reads them anyway; another user, through FUSE, owns them and
  // opens them up for the copy.
  if (!require_quota()) return;
  temp_dir dir;
  sandbox_spec spec = make_spec(dir);
  auto backend = make_bwrap_backend();
  {
    auto box = backend->create(spec);
    CHECK(run_probe(*box, {"lock_out", "/workspace/locked"})["ok"] == true);
  }
  backend->release_workspace(spec.workspace, spec.workspace_image);
  CHECK_FALSE(fs::exists(spec.workspace_image));
  // Released as the agent left them, mode 0; their owner may open them again.
  const fs::path locked = spec.workspace / "locked";
  struct stat st {};
  REQUIRE(::lstat(locked.c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0);
  fs::permissions(locked, fs::perms::owner_all);
  fs::permissions(locked / "secret.txt", fs::perms::owner_read);
  CHECK(read_file(locked / "secret.txt") == "kept");
}

TEST_CASE("quota: release_workspace finishes after a crash at any point") {
  if (!require_quota()) return;
  temp_dir dir;
  sandbox_spec spec = make_spec(dir);
  fs::path image = spec.workspace_image, staging = dir.path / "ws.released";
  auto backend = make_bwrap_backend();
  write_older_then_done(*backend, spec, dir.path / "older.img");
  fs::copy_file(image, dir.path / "backup.img");

  SECTION("during the copy: a partial copy is left beside the folder") {
    fs::create_directories(staging);
    std::ofstream(staging / "half-copied") << "junk";
  }
  SECTION("after the swap, before the image was deleted") {
    backend->release_workspace(spec.workspace, spec.workspace_image);
    fs::copy_file(dir.path / "backup.img", image);
  }
  SECTION("while the image was mounted for the copy (the mount outlived the host)") {
    REQUIRE(std::system(outliving_mount(image, spec.workspace).c_str()) == 0);
    REQUIRE(is_mount_point(spec.workspace));
  }
  SECTION("after the copy was whole, before the image was renamed away: the copy wins over an older image") {
    cut_short_after_copy(*backend, spec, dir.path / "older.img");
  }
  SECTION("after the image was renamed away, before the copy took the folder's place") {
    cut_short_after_copy(*backend, spec, {});
  }
  SECTION("while a new image was made") {
    backend->release_workspace(spec.workspace, spec.workspace_image);
    std::ofstream(spec.workspace_image.string() + ".new") << "half an image";
  }
  backend->release_workspace(spec.workspace, spec.workspace_image);
  CHECK(read_file(spec.workspace / "result.txt") == "done");
  CHECK_FALSE(fs::exists(spec.workspace / "half-copied"));
  CHECK_FALSE(fs::exists(image));
  CHECK_FALSE(fs::exists(staging));
  CHECK_FALSE(fs::exists(whole_copy(spec.workspace)));
  CHECK(eventually_gone(doomed_image(image)));
  CHECK_FALSE(is_mount_point(spec.workspace));
  auto box = backend->create(spec);
  CHECK(run_probe(*box, {"read", "/workspace/result.txt"})["detail"] == "done");
}

// A workspace whose release a crash cut short after its copy of the files
// ("done") was whole, beside an image older than it ("older").
struct cut_short_release {
  temp_dir dir;
  sandbox_spec spec = make_spec(dir);
  std::unique_ptr<sandbox_backend> backend = make_bwrap_backend();

  // False: no quota here, and the case is left (require_quota says so).
  bool made() {
    if (!require_quota()) return false;
    write_older_then_done(*backend, spec, dir.path / "older.img");
    cut_short_after_copy(*backend, spec, dir.path / "older.img");
    return true;
  }
};

TEST_CASE_METHOD(cut_short_release, "quota: a release cut short is not finished while another process holds the image") {
  if (!made()) return;
  {
    // As a live host holds the image it mounted (flock: one holder per open file).
    int held = ::open(spec.workspace_image.c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(::flock(held, LOCK_EX) == 0);
    CHECK_THROWS_WITH(backend->release_workspace(spec.workspace, spec.workspace_image),
                      Catch::Contains("in use by another cairn process"));
    CHECK(fs::exists(spec.workspace_image));  // left as it was
    CHECK(fs::exists(whole_copy(spec.workspace)));
    ::close(held);
  }
  backend->release_workspace(spec.workspace, spec.workspace_image);
  CHECK(read_file(spec.workspace / "result.txt") == "done");
  CHECK_FALSE(fs::exists(spec.workspace_image));
}

TEST_CASE_METHOD(cut_short_release, "quota: an attempt after a release cut short sees the copied files, not the older image") {
  // The engine replays a run whose end a crash interrupted: its next
  // sandbox mounts the workspace before any release is called again.
  if (!made()) return;
  {
    auto box = backend->create(spec);
    CHECK(run_probe(*box, {"read", "/workspace/result.txt"})["detail"] == "done");
    CHECK(is_mount_point(spec.workspace));  // a new image, the files moved into it
  }
  CHECK_FALSE(fs::exists(whole_copy(spec.workspace)));
  backend->release_workspace(spec.workspace, spec.workspace_image);
  CHECK(read_file(spec.workspace / "result.txt") == "done");
}

// In a folder others may write (a shared parent of a --workspace), another
// user plants a folder under the name a release gives its whole copy: it
// must never become the run's files, nor cost the run its image.
TEST_CASE("quota: a folder planted under the name of a release's copy is never taken for the run's files") {
  if (!require_quota()) return;
  temp_dir dir;
  sandbox_spec spec = make_spec(dir);
  auto backend = make_bwrap_backend();
  {
    auto box = backend->create(spec);
    CHECK(run_probe(*box, {"write", "/workspace/result.txt", "the run's"})["ok"] == true);
  }
  const fs::path planted = whole_copy(spec.workspace);
  fs::create_directories(planted);
  std::ofstream(planted / "result.txt") << "planted";
  ::chown(planted.c_str(), 65534, 65534);
  // A mount adopts no such folder: the agent sees its own files.
  {
    auto box = backend->create(spec);
    CHECK(run_probe(*box, {"read", "/workspace/result.txt"})["detail"] == "the run's");
  }
  // Nor does the release: it stops, the files safe in their image, until the folder is gone.
  CHECK_THROWS_WITH(backend->release_workspace(spec.workspace, spec.workspace_image),
                    Catch::Contains("cairn did not make it"));
  CHECK(fs::exists(spec.workspace_image));
  CHECK(read_file(planted / "result.txt") == "planted");
  fs::remove_all(planted);
  backend->release_workspace(spec.workspace, spec.workspace_image);
  CHECK(read_file(spec.workspace / "result.txt") == "the run's");
  CHECK_FALSE(fs::exists(spec.workspace_image));
}

TEST_CASE("quota: a stale mount left by a dead host is replaced") {
  if (!require_quota()) return;
  temp_dir dir;
  sandbox_spec spec = make_spec(dir);
  auto backend = make_bwrap_backend();
  backend->create(spec).reset();
  REQUIRE(std::system(outliving_mount(spec.workspace_image, spec.workspace).c_str()) == 0);
  fs::path stale_loop = loop_sysfs(spec.workspace);
  {
    auto box = backend->create(spec);
    CHECK(run_probe(*box, {"write", "/workspace/x", "y"})["ok"] == true);
  }
  CHECK_FALSE(is_mount_point(spec.workspace));
  CHECK(loop_released(stale_loop, spec.workspace_image));
}

TEST_CASE("quota: the mounts dead hosts left behind are swept", "[serial]") {
  if (!require_quota()) return;
  temp_dir dir;
  sandbox_spec spec = make_spec(dir);
  fs::path image = spec.workspace_image;
  auto backend = make_bwrap_backend();
  {
    auto box = backend->create(spec);
    CHECK(run_probe(*box, {"write", "/workspace/x", "kept"})["ok"] == true);
    sweep_orphaned_workspace_mounts();  // whatever else it finds, a live sandbox's mount is held
    CHECK(is_mount_point(spec.workspace));
  }
  // What a dead host leaves: the image mounted, nobody holding it, and the
  // record of that mount, never removed.
  // [serial]: another test process's sweep, which cannot see this private
  // mount, would forget the record first.
  record_left_by_dead_host("mount", spec.workspace.string() + "\n" + image.string());
  // And an image of an earlier run of it, renamed for deletion, not deleted.
  const fs::path doomed = doomed_image(image);
  fs::copy_file(image, doomed);
  json swept = in_private_mount_world([&] {
    const std::string mount = outliving_mount(image, spec.workspace);
    if (std::system(mount.c_str()) != 0) throw std::runtime_error(mount + " failed");
    struct stat st {};
    ::stat(spec.workspace.c_str(), &st);
    json report = {{"loop", "/sys/dev/block/" + std::to_string(major(st.st_dev)) + ":" +
                                std::to_string(minor(st.st_dev))}};
    {
      int held = ::open(image.c_str(), O_RDONLY | O_CLOEXEC);  // as a live host holds it
      ::flock(held, LOCK_EX);
      report["swept_while_held"] = sweep_orphaned_workspace_mounts();
      report["mounted_while_held"] = is_mount_point(spec.workspace);
      report["doomed_while_held"] = fs::exists(doomed);
      ::close(held);
    }
    report["swept"] = sweep_orphaned_workspace_mounts();
    report["mounted_after"] = is_mount_point(spec.workspace);
    return report;
  });
  CHECK(swept["swept_while_held"] == 0);
  CHECK(swept["mounted_while_held"] == true);
  CHECK(swept["swept"] == 1);
  CHECK(swept["mounted_after"] == false);
  CHECK(swept["doomed_while_held"] == true);
  CHECK_FALSE(fs::exists(doomed));
  CHECK(loop_released(swept["loop"].get<std::string>(), image));
  backend->release_workspace(spec.workspace, image);
  CHECK(read_file(spec.workspace / "x") == "kept");
}

TEST_CASE("quota: where the image cannot be mounted, its workspace is refused, not shown empty") {
  temp_dir dir;
  sandbox_spec spec = make_spec(dir);
  // No sandbox is made: the image is named whatever sandboxes the tests take.
  spec.workspace_image = dir.path / "images" / "ws.img";
  spec.limits.max_workspace_bytes = 16u << 20;
  fs::create_directories(spec.workspace);
  fs::create_directories(spec.workspace_image.parent_path());
  std::ofstream(spec.workspace_image) << "an image from a run started as root";
  sandbox_resources resources(spec, fs::canonical(spec.workspace), std::nullopt,
                              detect_workspace_quota());  // as without root
  try {
    resources.acquire();
    FAIL("no sandbox_error");
  } catch (const sandbox_error& e) {
    CHECK(e.code() == sandbox_errc::workspace_failed);
    // Through FUSE the image is mounted, and fuse2fs says what is wrong with it.
    if (detect_workspace_quota().fuse)
      CHECK_THAT(e.what(), Catch::Contains("ws.img") && Catch::Contains("fuse2fs"));
    else
      CHECK_THAT(e.what(), Catch::Contains("ws.img") && Catch::Contains("run cairn as root"));
  }
}

TEST_CASE("quota: a later run asking for another size keeps its image and says so") {
  if (!require_quota()) return;
  temp_dir dir;
  sandbox_spec spec = make_spec(dir);
  auto backend = make_bwrap_backend();
  auto about_size = [](const std::vector<std::string>& warnings) {
    std::vector<std::string> found;
    for (const auto& w : warnings)
      if (w.find("limits.workspace_mb") != std::string::npos) found.push_back(w);
    return found;
  };
  CHECK(about_size(backend->create(spec)->warnings()).empty());
  spec.limits.max_workspace_bytes = 32u << 20;
  auto box = backend->create(spec);
  auto warnings = about_size(box->warnings());
  REQUIRE(warnings.size() == 1);
  CHECK_THAT(warnings[0], Catch::Contains("16 MiB") && Catch::Contains("32 MiB") && Catch::Contains("keeps its image"));
  CHECK(fs::file_size(spec.workspace_image) == workspace_image_size(16u << 20));
}

TEST_CASE("quota: copying in and out never follows a symlink the agent planted") {
  if (!require_quota()) return;
  temp_dir dir;
  sandbox_spec spec = make_spec(dir);
  fs::path victim = dir.path / "victim";
  fs::create_directories(victim);
  fs::permissions(victim, fs::perms(0777));
  auto backend = make_bwrap_backend();
  {
    auto box = backend->create(spec);
    CHECK(run_probe(*box, {"symlink", victim.string(), "/workspace/dir"})["ok"] == true);
    CHECK(run_probe(*box, {"symlink", (victim / "out.txt").string(), "/workspace/out.txt"})["ok"] == true);
  }
  // Between attempts the host puts files where the agent's links are.
  fs::create_directories(spec.workspace / "dir");
  std::ofstream(spec.workspace / "dir" / "file.txt") << "host input";
  std::ofstream(spec.workspace / "out.txt") << "host output";
  {
    auto box = backend->create(spec);
    CHECK(run_probe(*box, {"read", "/workspace/dir/file.txt"})["detail"] == "host input");
    CHECK(run_probe(*box, {"symlink", (victim / "late.txt").string(), "/workspace/late.txt"})["ok"] == true);
  }
  backend->release_workspace(spec.workspace, spec.workspace_image);
  CHECK(fs::is_empty(victim));
  CHECK(fs::is_directory(fs::symlink_status(spec.workspace / "dir")));
  CHECK(fs::is_symlink(spec.workspace / "late.txt"));
  CHECK(read_file(spec.workspace / "out.txt") == "host output");
}

// A folder for images of 16 MiB. Root makes them for another uid; a normal
// user for itself.
struct image_folder {
  temp_dir dir;
  fs::path folder = fs::canonical(dir.path);
  static constexpr std::uint64_t bytes = 16u << 20;
  const uid_t uid = through_fuse() ? ::getuid() : 4321;
  const gid_t gid = through_fuse() ? ::getgid() : 4322;
};

TEST_CASE_METHOD(image_folder, "quota: a new image is a sparse copy of a template made once per folder, size and owner") {
  if (!require_quota()) return;
  fs::path first = folder / "first", second = folder / "second", third = folder / "third";
  for (const auto& ws : {first, second, third}) fs::create_directories(ws);
  fs::path made = workspace_template_path(folder, workspace_image_size(bytes), uid, gid);
  quota_support support = detect_workspace_quota();
  CHECK(mount_workspace_image(support, first, image_of(first), bytes, uid, gid).lease);
  REQUIRE(fs::exists(made));
  CHECK_FALSE(fs::exists(made.string() + ".new"));

  // With no mkfs.ext4 to run, only the template can make the next image.
  support.tools = {"/bin/false", "/bin/false"};
  {
    auto mounted = mount_workspace_image(support, second, image_of(second), bytes, uid, gid);
    REQUIRE(mounted.lease);
    CHECK(mounted.warnings.empty());
    CHECK(ext4_uuid(folder / "second.img") == ext4_uuid(made));
    CHECK(mounted.lease.mount()->quota_bytes() == bytes);
    struct statfs mounted_fs {};
    REQUIRE(::statfs(second.c_str(), &mounted_fs) == 0);
    CHECK(mounted_fs.f_type == (through_fuse() ? FUSE_SUPER_MAGIC : EXT4_SUPER_MAGIC));
    CHECK(fs::is_empty(second));  // no lost+found either
    struct stat root {};
    REQUIRE(::stat(second.c_str(), &root) == 0);
    CHECK(root.st_uid == uid);
    CHECK(root.st_gid == gid);
    std::ofstream(second / "written.txt") << "kept";
  }
  CHECK_FALSE(is_mount_point(second));
  struct stat image {};
  REQUIRE(::stat((folder / "second.img").c_str(), &image) == 0);
  CHECK(static_cast<std::uint64_t>(image.st_size) == workspace_image_size(bytes));
  CHECK(static_cast<std::uint64_t>(image.st_blocks) * 512 < bytes / 8);  // the holes were kept
  release_workspace_image(second, image_of(second));
  CHECK(read_file(second / "written.txt") == "kept");

  // The control: with the template gone, and the images made ahead from
  // it, a support without mkfs.ext4 makes no image.
  REQUIRE(stock_full(folder));  // nothing is being made as they go
  fs::remove(made);
  for (const auto& ready : images_ready(folder)) fs::remove(ready);
  auto plain = mount_workspace_image(support, third, image_of(third), bytes, uid, gid);
  CHECK_FALSE(plain.lease);
  CHECK_FALSE(fs::exists(folder / "third.img"));
  CHECK_FALSE(fs::exists(made));
}

TEST_CASE_METHOD(image_folder, "quota: a new image is one made ahead, a fresh copy of the template that nothing mounted before") {
  if (!require_quota()) return;
  fs::path first = folder / "first", second = folder / "second";
  for (const auto& ws : {first, second}) fs::create_directories(ws);
  const quota_support support = detect_workspace_quota();
  {
    auto mounted = mount_workspace_image(support, first, image_of(first), bytes, uid, gid);
    REQUIRE(mounted.lease);
    std::ofstream(first / "secret.txt") << "first run's";
  }
  release_workspace_image(first, image_of(first));
  REQUIRE(stock_full(folder));
  const auto ready = images_ready(folder);
  {
    auto mounted = mount_workspace_image(support, second, image_of(second), bytes, uid, gid);
    REQUIRE(mounted.lease);
    CHECK(fs::is_empty(second));  // nothing of the first run, no lost+found
    // One of those made ahead, taken by a rename.
    bool one_of_them = false;
    for (const auto& r : ready) {
      struct stat st {};
      one_of_them |= ::stat(r.c_str(), &st) < 0 && errno == ENOENT;
    }
    CHECK(one_of_them);
    CHECK(ext4_uuid(image_of(second)) ==
          ext4_uuid(workspace_template_path(folder, workspace_image_size(bytes), uid, gid)));
  }
  CHECK(stock_full(folder));  // made again in the background
  release_workspace_image(second, image_of(second));
}

TEST_CASE_METHOD(image_folder, "quota: a template left half made or broken costs one run at most") {
  if (!require_quota()) return;
  fs::path made = workspace_template_path(folder, workspace_image_size(bytes), uid, gid);
  quota_support support = detect_workspace_quota();
  fs::create_directories(folder / "ws");

  SECTION("a host died while making it") {
    std::ofstream(made.string() + ".new") << "half a template";
    CHECK(mount_workspace_image(support, folder / "ws", image_of(folder / "ws"), bytes, uid, gid).lease);
    CHECK(fs::exists(made));
    CHECK_FALSE(fs::exists(made.string() + ".new"));
  }
  SECTION("it is no filesystem") {
    std::ofstream(made) << "";
    fs::resize_file(made, bytes);
    auto dropped = mount_workspace_image(support, folder / "ws", image_of(folder / "ws"), bytes, uid, gid);
    CHECK_FALSE(dropped.lease);
    REQUIRE(dropped.warnings.size() == 1);
    CHECK_THAT(dropped.warnings[0], Catch::Contains("no size quota"));
    CHECK_FALSE(fs::exists(made));
    // a new template
    CHECK(mount_workspace_image(support, folder / "ws", image_of(folder / "ws"), bytes, uid, gid).lease);
  }
  CHECK(fs::exists(folder / "ws.img"));
}

}  // namespace cairn::runtime::test
