// What `cairn workspace` shows: the files of a run's workspace, read from the
// host whatever the run is doing (running, suspended, ended), without waking
// it, without writing a byte, and without following any link its agent made.
#pragma once

#include <cstdint>
#include <climits>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/unique_fd.hpp"
#include "storage/journal.hpp"

namespace cairn::engine {

struct workspace_entry {
  std::string path;        // relative to /workspace
  char type = '?';         // 'd' folder, 'f' file, 'l' link, '?' anything else
  std::uint64_t size = 0;  // of a file
  std::string target;      // of a link: what it names (never followed)
};

class workspace_files {
 public:
  // Opens the workspace of `run`: its folder, unless its files are in its
  // quota image and no sandbox has that mounted (a suspended run); then the
  // image is mounted read-only where only this process sees it (so call it
  // from a process that runs no other thread). Throws engine_error:
  // not_found (no workspace yet), bad_request (the image cannot be mounted
  // here: not root).
  workspace_files(const std::filesystem::path& home, const storage::run_record& run);
  ~workspace_files();

  // "its folder" or "its quota image, mounted read-only".
  const std::string& source() const { return source_; }
  // `path` (relative, or under /workspace) and, for a folder, everything
  // under it, folders before their contents. Throws engine_error(not_found)
  // when a component is missing or a link, or for a ".." component.
  std::vector<workspace_entry> list(const std::string& path) const;
  // Whether `path` is a regular file (no component a link).
  bool is_file(const std::string& path) const;
  // Its bytes (the first `max_bytes`), handed to `take` as they are read.
  // Never blocks on what is not a regular file (an agent may swap a fifo in
  // after is_file()): throws engine_error(not_found) for it instead.
  void read(const std::string& path, std::uint64_t max_bytes,
            const std::function<void(const char*, std::size_t)>& take) const;

 private:
  runtime::unique_fd open(const std::string& path, int flags) const;

  // Not root: a suspended run's image mounted read-only through FUSE, in a
  // folder of its own (removed with it), while root_ reads it.
  struct fuse_view;
  std::unique_ptr<fuse_view> fuse_;
  runtime::unique_fd root_;  // closed before fuse_ unmounts
  std::string source_;
};

}  // namespace cairn::engine
