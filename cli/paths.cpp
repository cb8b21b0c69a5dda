#include "cli/paths.hpp"

#include <cstdlib>

namespace cairn::cli {

paths resolve_paths(const std::string& db_flag) {
  paths p;
  const char* home = std::getenv("CAIRN_HOME");
  p.home = std::filesystem::absolute(home && *home ? home : ".cairn").lexically_normal();
  p.db = db_flag.empty() ? p.home / "cairn.db" : std::filesystem::absolute(db_flag).lexically_normal();
  if (!db_flag.empty() && !(home && *home)) p.home = p.db.parent_path();
  p.workspaces = p.home / "workspaces";
  p.logs = p.home / "logs";
  return p;
}

}  // namespace cairn::cli
