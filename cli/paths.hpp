// Where cairn keeps things: $CAIRN_HOME (default ./.cairn) holds cairn.db,
// workspaces/RUN_ID, images/RUN_ID.img and logs/RUN_ID.log (engine/run_paths.hpp).
#pragma once

#include <filesystem>
#include <string>

namespace cairn::cli {

struct paths {
  std::filesystem::path home;
  std::filesystem::path db;
};

// `db_flag` is --db when given; the other folders then sit beside it. Both
// paths come back absolute, with the links in them resolved.
paths resolve_paths(const std::string& db_flag);

}  // namespace cairn::cli
