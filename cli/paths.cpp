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

std::string without_password(const std::string& url) {
  // scheme://[user[:password]@]host...: the credentials end at the last '@' before the path.
  const auto start = url.find("://");
  if (start == std::string::npos) return url;
  const auto authority_end = url.find_first_of("/?#", start + 3);
  const auto at = url.rfind('@', authority_end);
  std::string shown = url;
  if (const auto colon = url.find(':', start + 3); at != std::string::npos && at > start + 3 &&
                                                   colon != std::string::npos && colon < at)
    shown = url.substr(0, colon + 1) + "***" + url.substr(at);
  // libpq also takes it as a parameter: ...?password=SECRET&...
  if (auto param = shown.find("password=", shown.find('?')); shown.find('?') != std::string::npos &&
                                                             param != std::string::npos) {
    param += std::string_view("password=").size();
    shown.replace(param, shown.find('&', param) == std::string::npos ? std::string::npos : shown.find('&', param) - param,
                  "***");
  }
  return shown;
}

std::string shown_db(const paths& p) { return without_password(p.db.string()); }

}  // namespace cairn::cli
