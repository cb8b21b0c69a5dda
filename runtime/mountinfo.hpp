// The mounts this process sees, from /proc/self/mountinfo. Internal to runtime/.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace cairn::runtime {

// One line: "36 25 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory"
struct mount_entry {
  std::string root;                   // the part of the filesystem mounted, "/" for all of it
  std::filesystem::path mount_point;  // unescaped
  std::string fstype;                 // "cgroup", "ext4"
  std::string source;                 // "/dev/loop0"
  std::string super_options;          // "rw,memory"
};

std::vector<mount_entry> read_mountinfo();

}  // namespace cairn::runtime
