// The version of cairn this was built as: the one number the CMake project
// declares (project(cairn VERSION ...)), for `cairn --version`, the
// journal's record of who wrote it, the protocol handshake and the SDK's
// name. Major.minor.patch; before 1.0 a new minor version may break
// compatibility (the CMake package says SameMinorVersion).
#pragma once

#include <string_view>

namespace cairn::protocol {

std::string_view cairn_version();

}  // namespace cairn::protocol
