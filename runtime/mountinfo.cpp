#include "runtime/mountinfo.hpp"

#include <cstdlib>
#include <sstream>

#include "runtime/small_file.hpp"

namespace cairn::runtime {
namespace {

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string unescape(const std::string& field) {
  std::string out;
  for (std::size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size()) {
      out.push_back(static_cast<char>(std::strtol(field.substr(i + 1, 3).c_str(), nullptr, 8)));
      i += 3;
    } else {
      out.push_back(field[i]);
    }
  }
  return out;
}

}  // namespace

std::vector<mount_entry> read_mountinfo() {
  std::vector<mount_entry> mounts;
  std::istringstream lines(read_small_file("/proc/self/mountinfo").value_or(""));
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    std::string id, parent, device, root, mount_point, word;
    fields >> id >> parent >> device >> root >> mount_point;
    while (fields >> word && word != "-") {  // the optional fields end at "-"
    }
    mount_entry m;
    fields >> m.fstype >> m.source >> m.super_options;
    m.root = unescape(root);
    m.mount_point = unescape(mount_point);
    m.source = unescape(m.source);
    mounts.push_back(std::move(m));
  }
  return mounts;
}

}  // namespace cairn::runtime
