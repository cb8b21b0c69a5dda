#include "runtime/agent_sdks.hpp"

#include <system_error>

namespace cairn::runtime {

namespace fs = std::filesystem;

namespace {

fs::path existing(const fs::path& folder, const fs::path& marker) {
  std::error_code ec;
  return fs::exists(folder / marker, ec) ? folder : fs::path();
}

agent_sdks locate() {
  std::error_code ec;
  const fs::path installed = fs::read_symlink("/proc/self/exe", ec).parent_path().parent_path() / "share/cairn/sdk";
  agent_sdks found{existing(installed / "python", "cairn/__init__.py"), existing(installed / "js", "package.json")};
  if (found.python.empty()) found.python = existing(CAIRN_SOURCE_PYTHON_SDK, "cairn/__init__.py");
  if (found.js.empty()) found.js = existing(CAIRN_SOURCE_JS_SDK, "package.json");
  return found;
}

}  // namespace

const agent_sdks& find_agent_sdks() {
  static const agent_sdks sdks = locate();
  return sdks;
}

}  // namespace cairn::runtime
