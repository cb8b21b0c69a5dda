// What changed under a workspace folder, as inotify tells it, so that a
// checkpoint looks at what an agent wrote rather than walking its whole
// tree at every step (engine/workspace_checkpoints.hpp).
//
// Every folder under the root is watched (a new one as it appears); the
// kernel queues an event as a write returns, so whatever the agent wrote
// before it sent its step is in the queue when the host reads it. A folder
// is watched through a descriptor opened without following any link, so a
// link the agent planted never puts a watch on a host folder. What inotify
// does not see (writes through a shared mapping) is seen by the next walk
// of the tree, at the next attempt.
#pragma once

#include <cstddef>
#include <filesystem>
#include <set>
#include <string>
#include <unordered_map>

#include "runtime/unique_fd.hpp"

namespace cairn::runtime {

class workspace_changes {
 public:
  // Watches `root` and every folder under it. Throws
  // sandbox_error(workspace_failed) when inotify cannot be had (the
  // user's instances or watches are used up: the message names the sysctl).
  explicit workspace_changes(const std::filesystem::path& root);
  workspace_changes(const workspace_changes&) = delete;
  workspace_changes& operator=(const workspace_changes&) = delete;

  struct changes {
    // Relative to the root ("a/b.txt"): created, written, changed, moved or
    // removed. A folder among them is to be looked at whole.
    std::set<std::string> paths;
    // The kernel's queue overflowed, or a watch could not be added: any
    // path may have changed, so look at the whole tree.
    bool everything = false;
  };
  // What changed since the last call (since construction, the first time).
  changes take();

  // The root, opened without following a link.
  int root_fd() const { return root_.get(); }

 private:
  void watch_tree(const std::string& path);  // `path` and every folder under it
  void watch(const std::string& path);
  void forget_tree(const std::string& path);

  unique_fd root_;
  unique_fd inotify_;
  std::unordered_map<int, std::string> paths_;  // watch descriptor -> folder ("" the root)
  changes pending_;
};

// Opens `path` (relative, "" for the folder itself) under the folder
// `dir_fd`, never following a link at any component nor leaving the folder
// (openat2 RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS). An empty descriptor and
// errno set when it cannot.
unique_fd open_beneath(int dir_fd, const std::string& path, int flags, unsigned mode = 0);

}  // namespace cairn::runtime
