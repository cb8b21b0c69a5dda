// Reading and writing the small files of /proc, /sys and cgroupfs with plain
// read(2)/write(2): such files may vanish mid-read (iostreams would throw)
// and must be written in one call. Internal to runtime/.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "runtime/unique_fd.hpp"

namespace cairn::runtime {

// The whole file open at `fd` (at most 64 KiB), read from its start with
// pread(2), so a descriptor kept open reads the file anew each time (cgroupfs
// and /proc make it again at offset 0); nullopt when it cannot be read.
inline std::optional<std::string> read_small_fd(int fd) {
  if (fd < 0) return std::nullopt;
  std::string content;
  char buffer[4096];
  for (;;) {
    ssize_t n = ::pread(fd, buffer, sizeof buffer, static_cast<off_t>(content.size()));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return std::nullopt;
    if (n == 0 || content.size() > 65536) return content;
    content.append(buffer, static_cast<std::size_t>(n));
  }
}

// The whole file (at most 64 KiB); nullopt when it cannot be opened or read.
inline std::optional<std::string> read_small_file(const std::string& path) {
  unique_fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  return read_small_fd(fd.get());
}

// Writes `value` in one write(2); false with errno set when that fails.
inline bool write_small_file(const std::string& path, std::string_view value) {
  unique_fd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (!fd) return false;
  ssize_t n;
  do {
    n = ::write(fd.get(), value.data(), value.size());
  } while (n < 0 && errno == EINTR);
  return n == static_cast<ssize_t>(value.size());
}

// The number after `key` and a space in a "key value" per line file
// (memory.events, pids.events, cpu.stat); nullopt when the key is absent.
inline std::optional<std::uint64_t> keyed_value(std::string_view text, std::string_view key) {
  for (std::size_t at = 0; at < text.size();) {
    std::size_t end = text.find('\n', at);
    std::string_view line = text.substr(at, end == std::string_view::npos ? std::string_view::npos : end - at);
    if (line.size() > key.size() && line.substr(0, key.size()) == key && line[key.size()] == ' ')
      return std::strtoull(std::string(line.substr(key.size() + 1)).c_str(), nullptr, 10);
    if (end == std::string_view::npos) break;
    at = end + 1;
  }
  return std::nullopt;
}

}  // namespace cairn::runtime
