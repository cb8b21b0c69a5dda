#include "runtime/output_log.hpp"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <string>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "runtime/log_reader.hpp"
#include "runtime/sandbox.hpp"

namespace cairn::runtime {
namespace {

constexpr std::size_t buffer_bytes = 64 << 10;
// Per turn of the pump: a writer that never pauses still lets tail() in.
constexpr int reads_per_turn = 16;
// A kept part starts after its first newline when one comes this early.
constexpr std::size_t line_search_bytes = 4096;

[[noreturn]] void failed(const std::string& what) {
  throw sandbox_error(sandbox_errc::spawn_failed, fmt::format("{}: {}", what, std::strerror(errno)));
}

std::string read_at(int fd, std::size_t size, off_t offset) {
  std::string data(size, '\0');
  std::size_t got = 0;
  while (got < size) {
    ssize_t n = ::pread(fd, data.data() + got, size - got, offset + static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  data.resize(got);
  return data;
}

bool write_all(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

}  // namespace

// The one thread that copies the output of every live agent of this process:
// it waits on all their pipes at once, so a live run costs no thread. Never
// destroyed (an agent may write until the process ends); a forked child,
// which has none of its parent's threads, makes its own.
class output_pump {
 public:
  static output_pump& get() {
    static std::mutex mutex;
    static output_pump* pump = nullptr;
    static pid_t made_by = 0;
    std::lock_guard lock(mutex);
    if (!pump || made_by != ::getpid()) {
      pump = new output_pump;
      made_by = ::getpid();
    }
    return *pump;
  }

  // Watches `log`'s pipe from now on; its key for remove().
  std::uint64_t add(output_log& log) {
    std::lock_guard lock(mutex_);
    const std::uint64_t key = next_key_++;
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.u64 = key;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, log.reader_.get(), &e) < 0) failed("watching the agent's output");
    logs_.emplace(key, &log);
    return key;
  }

  // Stops watching; once it returns, the pump no longer touches the log.
  void remove(std::uint64_t key) {
    std::lock_guard lock(mutex_);
    forget(key);
  }

 private:
  output_pump() : epoll_(::epoll_create1(EPOLL_CLOEXEC)) {
    if (!epoll_) failed("epoll for the agents' output");
    std::thread([this] { run(); }).detach();
  }

  void run() {
    std::array<epoll_event, 64> ready;
    for (;;) {
      const int n = ::epoll_wait(epoll_.get(), ready.data(), static_cast<int>(ready.size()), -1);
      if (n < 0 && errno != EINTR) return;
      std::lock_guard lock(mutex_);
      for (int i = 0; i < n; ++i) {
        // A log removed since epoll_wait returned is gone from the map. The key
        // is copied out first: epoll_event is packed, its u64 misaligned for
        // the reference find() takes.
        const std::uint64_t key = ready[static_cast<std::size_t>(i)].data.u64;
        auto it = logs_.find(key);
        if (it != logs_.end() && !it->second->copy_available()) forget(it->first);
      }
    }
  }

  // Under mutex_.
  void forget(std::uint64_t key) {
    auto it = logs_.find(key);
    if (it == logs_.end()) return;
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, it->second->reader_.get(), nullptr);
    logs_.erase(it);
  }

  unique_fd epoll_;
  std::mutex mutex_;
  std::unordered_map<std::uint64_t, output_log*> logs_;
  std::uint64_t next_key_ = 1;
};

output_log::output_log(unique_fd file, std::filesystem::path path, std::uint64_t max_bytes)
    : path_(std::move(path)), max_bytes_(std::max<std::uint64_t>(max_bytes, 2 * buffer_bytes)), file_(std::move(file)) {
  int ends[2];
  if (::pipe2(ends, O_CLOEXEC) < 0) failed("pipe for the agent's output");
  reader_.reset(ends[0]);
  writer_.reset(ends[1]);
  if (::fcntl(reader_.get(), F_SETFL, O_NONBLOCK) < 0) failed("pipe for the agent's output");
  pumped_as_ = output_pump::get().add(*this);
}

output_log::output_log(unique_fd file, std::filesystem::path path, std::uint64_t max_bytes, unique_fd reader)
    : path_(std::move(path)),
      max_bytes_(std::max<std::uint64_t>(max_bytes, 2 * buffer_bytes)),
      file_(std::move(file)),
      reader_(std::move(reader)) {
  if (::fcntl(reader_.get(), F_SETFL, O_NONBLOCK) < 0) failed("pipe for the agent's output");
  pumped_as_ = output_pump::get().add(*this);
}

output_log::~output_log() {
  output_pump::get().remove(pumped_as_);
  copy_available();
}

bool output_log::copy_available() {
  std::lock_guard lock(mutex_);
  if (at_end_) return false;
  std::string buffer(buffer_bytes, '\0');
  for (int i = 0; i < reads_per_turn; ++i) {
    ssize_t n = ::read(reader_.get(), buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return true;  // EAGAIN: nothing more for now
    if (n == 0) {
      at_end_ = true;
      return false;
    }
    append(buffer.data(), static_cast<std::size_t>(n));
  }
  return true;
}

// Errors of the log file are not the agent's to see: its output is dropped
// rather than left in the pipe, where it would stall the agent.
void output_log::append(const char* data, std::size_t size) {
  struct stat st {};
  if (!file_ || ::fstat(file_.get(), &st) < 0) return;
  if (static_cast<std::uint64_t>(st.st_size) + size > max_bytes_) rotate();
  if (file_ && write_all(file_.get(), data, size)) appended_ += size;
}

void output_log::rotate() {
  unique_fd old(::open(path_.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  struct stat st {}, ours {};
  if (!old || ::fstat(old.get(), &st) < 0 || ::fstat(file_.get(), &ours) < 0 || st.st_ino != ours.st_ino ||
      st.st_dev != ours.st_dev)
    return;
  auto [dropped, marker_bytes] = read_log_marker(old.get());
  const auto size = static_cast<std::uint64_t>(st.st_size);
  std::uint64_t keep_from = std::max<std::uint64_t>(size - max_bytes_ / 2, marker_bytes);
  std::string first = read_at(old.get(), line_search_bytes, static_cast<off_t>(keep_from));
  if (auto newline = first.find('\n'); newline != std::string::npos) keep_from += newline + 1;
  dropped += keep_from - marker_bytes;

  std::filesystem::path fresh = path_.string() + ".new";
  ::unlink(fresh.c_str());
  unique_fd next(::open(fresh.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!next) return;
  ::fchown(next.get(), st.st_uid, st.st_gid);
  ::fchmod(next.get(), st.st_mode & 0777);
  std::string marker = log_marker_line(dropped);
  bool ok = write_all(next.get(), marker.data(), marker.size());
  for (std::uint64_t at = keep_from; ok && at < size;) {
    std::string chunk = read_at(old.get(), std::min<std::uint64_t>(buffer_bytes, size - at), static_cast<off_t>(at));
    if (chunk.empty()) break;
    ok = write_all(next.get(), chunk.data(), chunk.size());
    at += chunk.size();
  }
  if (!ok || ::rename(fresh.c_str(), path_.c_str()) < 0) {
    ::unlink(fresh.c_str());
    return;
  }
  file_ = std::move(next);
}

std::string output_log::tail(std::size_t max_bytes) {
  copy_available();
  std::uint64_t ours = 0;
  {
    std::lock_guard lock(mutex_);
    ours = appended_;
  }
  unique_fd fd(::open(path_.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  struct stat st {};
  if (!fd || ::fstat(fd.get(), &st) < 0) return {};
  auto size = static_cast<std::size_t>(st.st_size);
  // Only what this log wrote: an earlier attempt's output is not this one's.
  const auto n = static_cast<std::size_t>(std::min<std::uint64_t>({size, max_bytes, ours}));
  return read_at(fd.get(), n, static_cast<off_t>(size - n));
}

}  // namespace cairn::runtime
