// The Python and JavaScript agent SDKs that a sandbox is given, so a script
// agent imports `cairn` without the user copying anything. Internal to runtime/.
#pragma once

#include <filesystem>

namespace cairn::runtime {

// Where the sandbox finds them: PYTHONPATH holds the first, and a script
// agent in /run/cairn/app resolves the npm package "cairn" to the second
// (Node looks in the node_modules folders above the importing file).
inline constexpr const char* sandbox_python_sdk = "/run/cairn/python";
inline constexpr const char* sandbox_js_sdk = "/run/cairn/node_modules/cairn";
// A script agent's folder, bound read-only, so it imports its own modules.
inline constexpr const char* sandbox_app_folder = "/run/cairn/app";

struct agent_sdks {
  std::filesystem::path python;  // the folder holding the package folder "cairn"; empty: none found
  std::filesystem::path js;      // the npm package's folder; empty: none found
};

// Installed beside this program (PREFIX/share/cairn/sdk/{python,js}, for
// PREFIX/bin/cairn), else in the source tree this program was built from.
const agent_sdks& find_agent_sdks();

}  // namespace cairn::runtime
