// Reading a run's log (HOME/logs/ID.log, written by output_log) while it
// may still grow and be rewritten, for `cairn logs`.
//
// The log is one stream of the agent's output over all attempts, of which
// the file keeps the newest part: once rewritten it begins with the line
// "[cairn: N bytes of older output dropped]\n" (log_marker), and its byte at
// offset M + k (M the marker's length) is byte N + k of the stream. A reader
// keeps its place in the stream, so a rewrite (a new file renamed over the
// old) neither repeats nor skips output it could still read.
//
// The file is opened without following a link at any component (the path
// comes from CAIRN_HOME and a validated run id; nothing an agent wrote is
// followed) and only when it is a regular file; no read returns more than
// it was asked for, so a log of any size is read in bounded memory.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "runtime/unique_fd.hpp"

namespace cairn::runtime {

// The first line of a rewritten log: how many bytes of the stream came
// before the file's content, and the line's length (both 0 for a log that
// has none).
struct log_marker {
  std::uint64_t dropped = 0;
  std::size_t bytes = 0;
};
log_marker read_log_marker(int fd);
std::string log_marker_line(std::uint64_t dropped);

class log_reader {
 public:
  explicit log_reader(std::filesystem::path log) : path_(std::move(log)) {}

  // What read() found of the file at its last look.
  enum class state { missing, readable, refused };
  state last_state() const { return state_; }
  // Why the file was refused (a link, not a regular file), for messages.
  const std::string& refusal() const { return refusal_; }

  // Places the reader at the start of the last `lines` lines of the file
  // as it is now (scanning back from its end a block at a time).
  void seek_last_lines(std::uint64_t lines);

  // At most `max_bytes` of the stream after what was read before (empty
  // when there is nothing new, or no file), and how many bytes the log
  // dropped before this reader could read them.
  struct chunk {
    std::string data;
    std::uint64_t skipped = 0;
  };
  chunk read(std::size_t max_bytes);

 private:
  // Opens the file again when it was replaced or is not open; false when it is missing or refused.
  bool reopen_if_replaced();

  std::filesystem::path path_;
  unique_fd file_;
  std::uint64_t inode_ = 0;
  log_marker marker_;
  std::uint64_t position_ = 0;  // in the stream
  state state_ = state::missing;
  std::string refusal_;
};

}  // namespace cairn::runtime
