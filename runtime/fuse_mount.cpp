#include "runtime/fuse_mount.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "runtime/bwrap_support.hpp"
#include "runtime/mountinfo.hpp"
#include "runtime/unique_fd.hpp"

extern char** environ;

namespace cairn::runtime {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr auto mount_patience = 30s;
constexpr auto busy_patience = 3s;
constexpr auto flush_patience = 120s;

[[noreturn]] void failed(const std::string& what) {
  throw sandbox_error(sandbox_errc::spawn_failed, fmt::format("{}: {}", what, std::strerror(errno)));
}

std::optional<fs::path> find_program(std::initializer_list<const char*> names) {
  for (const char* name : names)
    for (const char* folder : {"/usr/bin", "/bin", "/usr/sbin", "/sbin", "/usr/local/bin"}) {
      fs::path path = fs::path(folder) / name;
      if (::access(path.c_str(), X_OK) == 0) return path;
    }
  return std::nullopt;
}

std::string text_of(int fd) {
  std::string text;
  char buf[4096];
  ::lseek(fd, 0, SEEK_SET);
  for (ssize_t n; text.size() < 8192 && (n = ::read(fd, buf, sizeof buf)) > 0;) text.append(buf, n);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

// Waits up to `patience` for `pid` to end; true if it did (and was reaped).
bool reaped_within(pid_t pid, std::chrono::milliseconds patience) {
  for (auto deadline = std::chrono::steady_clock::now() + patience;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid || (r < 0 && errno == ECHILD)) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
}

}  // namespace

std::optional<fuse_tools> find_fuse_tools(std::string& why) {
  auto fuse2fs = find_program({"fuse2fs"});
  auto fusermount = find_program({"fusermount3", "fusermount"});
  if (!fuse2fs || !fusermount) {
    why = "needs fuse2fs and fusermount (apt-get install fuse2fs fuse3)";
    return std::nullopt;
  }
  unique_fd device(::open("/dev/fuse", O_RDWR | O_CLOEXEC));
  if (!device) {
    why = fmt::format("/dev/fuse: {} (Debian's udev makes it 0666; chmod 0666 /dev/fuse)", std::strerror(errno));
    return std::nullopt;
  }
  return fuse_tools{*fuse2fs, *fusermount};
}

fuse_mount::fuse_mount(const fuse_tools& tools, const fs::path& image, const fs::path& target, bool read_only)
    : tools_(tools), target_(target) {
  // Its words go to a file of its own: a pipe nobody reads any more would
  // end it (SIGPIPE) the first time it writes after the mount.
  unique_fd log(::open("/tmp", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
  if (!log) failed("making a file for fuse2fs's messages");
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&actions);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, log.get(), 1);
  posix_spawn_file_actions_adddup2(&actions, log.get(), 2);
  // It outlives the attempt: it must hold no other file of the host's (an agent's channel, a pipe's end).
  posix_spawn_file_actions_addclosefrom_np(&actions, 3);
  // A session of its own: a terminal's ^C to cairn does not unmount a workspace under a run.
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  // fuse2fs names the mount after the image's path in its -o list, unescaped.
  if (image.string().find_first_of(",\\") != std::string::npos)
    throw sandbox_error(sandbox_errc::spawn_failed,
                        fmt::format("fuse2fs cannot mount an image whose path holds a comma or a backslash: {}",
                                    image.string()));
  // Read-only, it is a view for the image's owner (`cairn workspace`):
  // fakeroot lets this user read what an agent of theirs made mode 0. The
  // mount, as every FUSE mount without allow_other, serves this user alone.
  std::vector<std::string> args = {tools.fuse2fs.string(), image.string(), target.string(), "-f", "-o",
                                   read_only ? "ro,noatime,fakeroot" : "rw,noatime,nonempty"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::string path_env = "PATH=/usr/bin:/bin:/usr/sbin:/sbin";
  char* env[] = {path_env.data(), nullptr};
  const int error = ::posix_spawn(&daemon_, argv[0], &actions, &attr, argv.data(), env);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (error != 0) {
    errno = error;
    failed("starting " + tools.fuse2fs.string());
  }
  for (auto deadline = std::chrono::steady_clock::now() + mount_patience;;) {
    if (is_fuse_mount_of(target, image)) return;
    int status = 0;
    if (::waitpid(daemon_, &status, WNOHANG) == daemon_) {
      daemon_ = -1;
      throw sandbox_error(sandbox_errc::spawn_failed,
                          fmt::format("fuse2fs could not mount {} at {}: {}", image.string(), target.string(),
                                      text_of(log.get())));
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(daemon_, SIGKILL);
      reaped_within(daemon_, 5s);
      daemon_ = -1;
      fuse_unmount(tools, target);
      throw sandbox_error(sandbox_errc::spawn_failed,
                          fmt::format("fuse2fs did not mount {} at {} within {} s: {}", image.string(),
                                      target.string(), mount_patience.count(), text_of(log.get())));
    }
    std::this_thread::sleep_for(2ms);
  }
}

fuse_mount::~fuse_mount() {
  fuse_unmount(tools_, target_);
  // Unmounted, fuse2fs writes what it holds into the image, then ends.
  if (daemon_ > 0 && !reaped_within(daemon_, flush_patience)) {
    ::kill(daemon_, SIGKILL);
    reaped_within(daemon_, 5s);
  }
}

bool is_fuse_mount_of(const fs::path& folder, const fs::path& image) {
  std::optional<mount_entry> top;
  for (auto& m : read_mountinfo())
    if (m.mount_point == folder) top = std::move(m);
  std::error_code ec;
  return top && top->fstype.rfind("fuse", 0) == 0 &&
         (top->source == image.string() || top->source == fs::weakly_canonical(image, ec).string());
}

bool fuse_unmount(const fuse_tools& tools, const fs::path& folder) {
  const auto run = [&](std::vector<std::string> argv) {
    try {
      auto r = run_captured(argv, std::nullopt, 30s);
      return r.status && r.status->exited && r.status->code == 0;
    } catch (const sandbox_error&) {
      return false;
    }
  };
  for (auto deadline = std::chrono::steady_clock::now() + busy_patience;;) {
    if (run({tools.fusermount.string(), "-u", "-q", folder.string()})) return true;
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(20ms);
  }
  return run({tools.fusermount.string(), "-u", "-z", "-q", folder.string()});
}

}  // namespace cairn::runtime
