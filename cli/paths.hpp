// Where cairn keeps things: $CAIRN_HOME (default ./.cairn) holds cairn.db,
// workspaces/RUN_ID, images/RUN_ID.img and logs/RUN_ID.log (engine/run_paths.hpp).
#pragma once

#include <filesystem>
#include <string>

#include "engine/engine.hpp"

namespace cairn::cli {

struct paths {
  std::filesystem::path home;
  std::filesystem::path db;  // a SQLite file, or a PostgreSQL URL as given (storage::is_postgres_url)
  // `cairn --allow`: what this host executes of a shared journal's rows (engine::host_allows).
  engine::host_allows allow;
};

// `db_flag` is --db when given; for a file, the other folders then sit
// beside it. Both paths come back absolute, with the links in them resolved.
// A PostgreSQL URL is kept as it is, and CAIRN_HOME (default ./.cairn) still
// holds the workspaces and logs.
paths resolve_paths(const std::string& db_flag);

// The journal as messages name it: its path, or its URL without the password
// ("postgresql://cairn:***@db:5432/cairn").
std::string shown_db(const paths& p);

}  // namespace cairn::cli
