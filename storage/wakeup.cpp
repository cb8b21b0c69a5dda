#include "storage/wakeup.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "storage/journal.hpp"
#include "storage/postgres/postgres_journal.hpp"

namespace cairn::storage {
namespace {

constexpr std::array<std::string_view, 7> change_names = {"submitted", "signalled", "cancel_requested", "ended",
                                                          "child_ended", "waiting", "released"};
constexpr std::string_view socket_suffix = ".sock";
// Names this code makes are PID-N.sock; a longer one is not a listener's.
constexpr std::size_t max_socket_name = 48;
// A folder is ours alone, but readdir of a huge one must not hold up a commit.
constexpr int max_listeners = 256;

std::filesystem::path folder_of(const std::filesystem::path& db) { return db.string() + ".wake"; }

class fd_guard {
 public:
  explicit fd_guard(int fd) : fd_(fd) {}
  ~fd_guard() {
    if (fd_ >= 0) ::close(fd_);
  }
  fd_guard(const fd_guard&) = delete;
  fd_guard& operator=(const fd_guard&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// Through the folder's descriptor: a journal path of any length fits sun_path.
std::optional<sockaddr_un> address_in(int dir_fd, std::string_view name) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const int n = std::snprintf(address.sun_path, sizeof address.sun_path, "/proc/self/fd/%d/%.*s", dir_fd,
                              static_cast<int>(name.size()), name.data());
  if (n < 0 || static_cast<std::size_t>(n) >= sizeof address.sun_path) return std::nullopt;
  return address;
}

bool is_socket_name(std::string_view name) {
  return name.size() > socket_suffix.size() && name.size() <= max_socket_name &&
         name.substr(name.size() - socket_suffix.size()) == socket_suffix;
}

// A listener that died without cleaning up: its socket goes, if it is a
// socket of this user (never a link, never someone else's file).
void forget(int dir_fd, const char* name) {
  struct stat st {};
  if (::fstatat(dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISSOCK(st.st_mode) && st.st_uid == ::geteuid())
    ::unlinkat(dir_fd, name, 0);
}

}  // namespace

std::string wakeup_text(std::string_view run_id, change what) {
  return fmt::format("{} {}", change_names[static_cast<std::size_t>(what)], run_id);
}

// A known word, a space, printable ASCII without spaces.
std::optional<std::pair<std::string, change>> parse_wakeup(std::string_view text) {
  const auto space = text.find(' ');
  if (space == std::string_view::npos || space + 1 == text.size()) return std::nullopt;
  std::optional<change> what;
  for (std::size_t i = 0; i < change_names.size(); ++i)
    if (change_names[i] == text.substr(0, space)) what = static_cast<change>(i);
  if (!what) return std::nullopt;
  const auto id = text.substr(space + 1);
  for (char c : id)
    if (c <= 0x20 || c >= 0x7f) return std::nullopt;
  return std::pair{std::string(id), *what};
}

void notify(const std::filesystem::path& db, std::string_view run_id, change what) noexcept {
  // PostgreSQL: the journal NOTIFYs inside the transaction that made the change.
  if (is_postgres_url(db.string())) return;
  // An in-memory journal (storage/memory) has no folder: its waiters are this process's.
  if (db.string().starts_with("memory:")) return;
  const std::string message = wakeup_text(run_id, what);
  if (message.size() > max_wakeup_bytes) return;
  fd_guard dir(::open(folder_of(db).c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (dir.get() < 0) return;  // no listener ever ran here, or not ours to reach
  const int list_fd = ::dup(dir.get());
  DIR* entries = list_fd < 0 ? nullptr : ::fdopendir(list_fd);
  if (!entries) {
    if (list_fd >= 0) ::close(list_fd);
    return;
  }
  const std::string own = fmt::format("{}-", ::getpid());
  std::optional<fd_guard> out;  // made for the first listener there is to tell
  int seen = 0;
  while (const dirent* entry = ::readdir(entries)) {
    if (!is_socket_name(entry->d_name) || ++seen > max_listeners) continue;
    if (std::string_view(entry->d_name).starts_with(own)) continue;  // this process's: see the header
    const auto address = address_in(dir.get(), entry->d_name);
    if (!address) continue;
    if (!out) out.emplace(::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (::sendto(out->get(), message.data(), message.size(), MSG_NOSIGNAL,
                 reinterpret_cast<const sockaddr*>(&*address), sizeof *address) >= 0)
      continue;
    // EAGAIN: its queue is full, so it has hints to act on already.
    if (errno == ECONNREFUSED || errno == ENOENT) forget(dir.get(), entry->d_name);
  }
  ::closedir(entries);
}

struct wake_listener::impl {
  int dir = -1, sock = -1, stop = -1;
  std::string name;
  callback on_wake;
  std::unique_ptr<postgres::postgres_listener> postgres;  // for a PostgreSQL journal, instead of the socket
  std::thread thread;

  void listen() {
    std::array<char, max_wakeup_bytes + 1> buffer;
    for (;;) {
      std::array<pollfd, 2> fds{pollfd{sock, POLLIN, 0}, pollfd{stop, POLLIN, 0}};
      if (::poll(fds.data(), fds.size(), -1) < 0 && errno != EINTR) return;
      if (fds[1].revents) return;
      for (;;) {
        // MSG_TRUNC: the datagram's real length, so an oversized one is seen as such.
        const ssize_t n = ::recv(sock, buffer.data(), buffer.size(), MSG_TRUNC);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) break;
        if (static_cast<std::size_t>(n) > max_wakeup_bytes) continue;
        if (auto hint = parse_wakeup(std::string_view(buffer.data(), static_cast<std::size_t>(n))))
          on_wake(hint->first, hint->second);
      }
    }
  }

  ~impl() {
    if (dir >= 0 && !name.empty()) ::unlinkat(dir, name.c_str(), 0);
    for (int fd : {dir, sock, stop})
      if (fd >= 0) ::close(fd);
  }
};

wake_listener::wake_listener(const std::filesystem::path& db, callback on_wake) : impl_(std::make_unique<impl>()) {
  if (is_postgres_url(db.string())) {
    impl_->postgres = std::make_unique<postgres::postgres_listener>(db.string());
    impl_->stop = ::eventfd(0, EFD_CLOEXEC);
    if (impl_->stop < 0)
      throw storage_error(errc::io, fmt::format("cannot listen for wake-ups: eventfd: {}", std::strerror(errno)));
    impl_->on_wake = std::move(on_wake);
    impl_->thread = std::thread([this] { impl_->postgres->listen(impl_->stop, impl_->on_wake); });
    return;
  }
  const auto folder = folder_of(db);
  auto fail = [&](const std::string& what) {
    return storage_error(errc::io, fmt::format("cannot listen for wake-ups in {}: {}: {}", folder.string(), what,
                                               std::strerror(errno)));
  };
  if (::mkdir(folder.c_str(), 0700) != 0 && errno != EEXIST) throw fail("mkdir");
  impl_->dir = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (impl_->dir < 0) throw fail("open (it must be a folder, not a link)");
  struct stat st {};
  if (::fstat(impl_->dir, &st) != 0) throw fail("fstat");
  if (st.st_uid != ::geteuid() || (st.st_mode & 077) != 0)
    throw storage_error(errc::io, fmt::format("cannot listen for wake-ups in {}: it must be this user's own with "
                                              "mode 0700 (uid {}, mode {:o}); remove it and it is made again",
                                              folder.string(), st.st_uid, st.st_mode & 07777));
  impl_->sock = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (impl_->sock < 0) throw fail("socket");
  static std::atomic<unsigned> listeners{0};
  const std::string name = fmt::format("{}-{}{}", ::getpid(), listeners++, socket_suffix);
  // A socket of a dead process that had this pid.
  ::unlinkat(impl_->dir, name.c_str(), 0);
  const auto address = address_in(impl_->dir, name);
  if (!address || ::bind(impl_->sock, reinterpret_cast<const sockaddr*>(&*address), sizeof *address) != 0)
    throw fail("bind " + name);
  impl_->name = name;
  impl_->stop = ::eventfd(0, EFD_CLOEXEC);
  if (impl_->stop < 0) throw fail("eventfd");
  impl_->on_wake = std::move(on_wake);
  impl_->thread = std::thread([this] { impl_->listen(); });
}

wake_listener::~wake_listener() {
  const std::uint64_t one = 1;
  if (::write(impl_->stop, &one, sizeof one) < 0) {
    // An eventfd write fails only on overflow, which one write cannot reach.
  }
  impl_->thread.join();
}

}  // namespace cairn::storage
