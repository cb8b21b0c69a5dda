#include "protocol/version.hpp"

#ifndef CAIRN_VERSION
#error "CAIRN_VERSION comes from the CMake project's version (protocol/CMakeLists.txt)"
#endif

namespace cairn::protocol {

std::string_view cairn_version() { return CAIRN_VERSION; }

}  // namespace cairn::protocol
