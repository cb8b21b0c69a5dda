// Where cairn keeps things: $CAIRN_HOME (default ./.cairn) holds cairn.db,
// workspaces/RUN_ID and logs/RUN_ID.log.
#pragma once

#include <filesystem>
#include <string>

namespace cairn::cli {

struct paths {
  std::filesystem::path home;
  std::filesystem::path db;
  std::filesystem::path workspaces;
  std::filesystem::path logs;
};

// `db_flag` is --db when given; the other folders then sit beside it.
paths resolve_paths(const std::string& db_flag);

}  // namespace cairn::cli
