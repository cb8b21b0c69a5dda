// The Python and JavaScript agent SDKs that a sandbox is given, so a script
// agent imports `cairn` without the user copying anything. Internal to runtime/.
#pragma once

#include <sys/types.h>

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
// PREFIX/bin/cairn), else this program's build's: the Python SDK with its
// bytecode in the build tree (sdk/CMakeLists.txt), the JS SDK's sources.
const agent_sdks& find_agent_sdks();

// The SDKs as the sandbox uid can read them: where they are, or, when it
// may not pass through a folder above them (a checkout under /root), a copy
// of their files (not their tests or node_modules) made once per content in
// /var/cache/cairn/sdk, a folder only root writes. For root only. Throws
// sandbox_error(bad_spec) when that folder is another user's.
agent_sdks readable_agent_sdks(const agent_sdks& found, uid_t uid, gid_t gid);

}  // namespace cairn::runtime
