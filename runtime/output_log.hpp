// The agent's stdout and stderr on their way to the run's log. The agent (and
// bwrap, for its own errors) writes into a pipe; one thread of the host, which
// waits on the pipes of every live agent at once, copies what arrives into the
// log file, so no descriptor of a host file ever enters
// the sandbox: the agent cannot truncate, fallocate or seek the log, only
// write to a pipe the host reads at its own pace.
//
// The log keeps the newest `max_bytes` of output over all attempts of the
// run: once the file reaches that size it is rewritten (a new file renamed
// over it, so a crash leaves the old or the new) holding its newest half,
// after a first line "[cairn: N bytes of older output dropped]" that counts
// every byte dropped so far. Internal to runtime/.
#pragma once

#include <cstdint>
#include <filesystem>
#include <mutex>

#include "runtime/unique_fd.hpp"

namespace cairn::runtime {

class output_pump;

class output_log {
 public:
  // `file`: the log at `path`, opened for appending (open_log). Hands the
  // pipe to the pump. Throws sandbox_error(spawn_failed) when no pipe can be made.
  output_log(unique_fd file, std::filesystem::path path, std::uint64_t max_bytes);
  // The same, for a child started already: `reader` is the read end of the
  // pipe it writes to; writer() is -1.
  output_log(unique_fd file, std::filesystem::path path, std::uint64_t max_bytes, unique_fd reader);
  // Takes the pipe back from the pump, then copies what it holds at this moment.
  ~output_log();
  output_log(const output_log&) = delete;
  output_log& operator=(const output_log&) = delete;

  // The pipe's write end for the child's fds 1 and 2: close it once the
  // child has it (close_writer), or the pipe never reports its end.
  int writer() const { return writer_.get(); }
  void close_writer() { writer_.reset(); }

  // Copies what the pipe holds at this moment into the log, then returns
  // the last `max_bytes` bytes of what this log wrote there (for error
  // messages: this process's output, not an earlier attempt's).
  std::string tail(std::size_t max_bytes);

 private:
  friend class output_pump;
  // Copies what the pipe holds now; false once the pipe is at its end.
  bool copy_available();
  void append(const char* data, std::size_t size);
  void rotate();

  std::filesystem::path path_;
  std::uint64_t max_bytes_;
  std::mutex mutex_;  // guards file_ and the copying; held for one buffer at a time
  unique_fd file_;
  unique_fd reader_, writer_;
  bool at_end_ = false;
  std::uint64_t appended_ = 0;  // bytes this log wrote to the file
  std::uint64_t pumped_as_ = 0;  // this log's key in the pump
};

}  // namespace cairn::runtime
