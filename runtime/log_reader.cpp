#include "runtime/log_reader.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string_view>

#include <fmt/format.h>

#include "runtime/no_follow.hpp"
#include "runtime/sandbox.hpp"

namespace cairn::runtime {
namespace {

constexpr std::string_view marker_start = "[cairn: ";
constexpr std::string_view marker_end = " bytes of older output dropped]\n";
constexpr std::uint64_t scan_block = 64 << 10;

std::string read_at(int fd, std::size_t size, std::uint64_t offset) {
  std::string data(size, '\0');
  std::size_t got = 0;
  while (got < size) {
    ssize_t n = ::pread(fd, data.data() + got, size - got, static_cast<off_t>(offset + got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  data.resize(got);
  return data;
}

std::uint64_t size_of(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 ? static_cast<std::uint64_t>(st.st_size) : 0;
}

}  // namespace

log_marker read_log_marker(int fd) {
  std::string head = read_at(fd, 80, 0);
  if (!head.starts_with(marker_start)) return {};
  auto end = head.find(marker_end);
  if (end == std::string::npos) return {};
  std::uint64_t n = 0;
  for (char c : head.substr(marker_start.size(), end - marker_start.size())) {
    if (c < '0' || c > '9') return {};
    n = n * 10 + static_cast<std::uint64_t>(c - '0');
  }
  return {n, end + marker_end.size()};
}

std::string log_marker_line(std::uint64_t dropped) { return fmt::format("{}{}{}", marker_start, dropped, marker_end); }

bool log_reader::reopen_if_replaced() {
  const auto path = std::filesystem::absolute(path_).lexically_normal();
  unique_fd folder;
  try {
    folder = open_folder_no_follow(path.parent_path());
  } catch (const sandbox_error& e) {
    // A missing folder is a log not written yet; a link on the way is refused.
    if (std::filesystem::exists(path.parent_path()) || std::filesystem::is_symlink(path.parent_path())) {
      state_ = state::refused;
      refusal_ = e.what();
    } else {
      state_ = state::missing;
    }
    file_.reset();
    return false;
  }
  struct stat st {};
  if (::fstatat(folder.get(), path.filename().c_str(), &st, AT_SYMLINK_NOFOLLOW) < 0) {
    state_ = state::missing;  // removed (cairn rm) or not made yet; a rewrite renames, never unlinks
    file_.reset();
    return false;
  }
  if (!S_ISREG(st.st_mode)) {
    state_ = state::refused;
    refusal_ = fmt::format("{} is not a regular file (a link or another kind): not read", path.string());
    file_.reset();
    return false;
  }
  if (file_ && st.st_ino == inode_) return true;
  // O_NONBLOCK: were it swapped for a FIFO after the check, opening it must not hang.
  unique_fd fresh(::openat(folder.get(), path.filename().c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  struct stat opened {};
  if (!fresh || ::fstat(fresh.get(), &opened) < 0 || !S_ISREG(opened.st_mode)) {
    state_ = fresh || errno != ELOOP ? state::missing : state::refused;
    if (state_ == state::refused) refusal_ = fmt::format("{} is a symbolic link: not followed", path.string());
    file_.reset();
    return false;
  }
  file_ = std::move(fresh);
  inode_ = opened.st_ino;
  marker_ = read_log_marker(file_.get());
  state_ = state::readable;
  return true;
}

void log_reader::seek_last_lines(std::uint64_t lines) {
  if (!reopen_if_replaced()) return;
  std::uint64_t end = size_of(file_.get());
  const std::uint64_t start = lines == 0 ? end : [&] {
    // The last byte ends the last line when it is a newline, and starts none.
    if (end > marker_.bytes && read_at(file_.get(), 1, end - 1) == "\n") --end;
    std::uint64_t seen = 0;
    for (std::uint64_t block_end = end; block_end > marker_.bytes;) {
      const std::uint64_t block_start = std::max<std::uint64_t>(marker_.bytes, block_end - std::min(scan_block, block_end));
      const std::string block = read_at(file_.get(), block_end - block_start, block_start);
      for (std::size_t at = block.size(); at > 0;) {
        const auto nl = block.rfind('\n', at - 1);
        if (nl == std::string::npos) break;
        if (++seen == lines) return block_start + nl + 1;
        at = nl;
      }
      block_end = block_start;
    }
    return std::uint64_t{marker_.bytes};
  }();
  position_ = marker_.dropped + (start - marker_.bytes);
}

log_reader::chunk log_reader::read(std::size_t max_bytes) {
  chunk out;
  if (!reopen_if_replaced()) return out;
  if (position_ < marker_.dropped) {
    out.skipped = marker_.dropped - position_;
    position_ = marker_.dropped;
  }
  const std::uint64_t offset = marker_.bytes + (position_ - marker_.dropped);
  const std::uint64_t size = size_of(file_.get());
  if (offset >= size) return out;
  out.data = read_at(file_.get(), static_cast<std::size_t>(std::min<std::uint64_t>(max_bytes, size - offset)), offset);
  position_ += out.data.size();
  return out;
}

}  // namespace cairn::runtime
