#include "cli/paths.hpp"

#include <cstdlib>

#include "storage/journal.hpp"

namespace cairn::cli {

namespace {

// Links resolved once, here: every later open under HOME refuses to follow one.
std::filesystem::path real_path(const std::filesystem::path& given) {
  auto path = std::filesystem::weakly_canonical(std::filesystem::absolute(given)).lexically_normal();
  return path.has_filename() ? path : path.parent_path();
}

}  // namespace

paths resolve_paths(const std::string& db_flag) {
  paths p;
  const char* home = std::getenv("CAIRN_HOME");
  p.home = real_path(home && *home ? home : ".cairn");
  if (storage::is_postgres_url(db_flag)) {
    p.db = db_flag;
    return p;
  }
  p.db = db_flag.empty() ? p.home / "cairn.db" : real_path(db_flag);
  if (!db_flag.empty() && !(home && *home)) p.home = p.db.parent_path();
  return p;
}

std::string shown_db(const paths& p) { return storage::without_password(p.db.string()); }

}  // namespace cairn::cli
