// The PostgreSQL journal's format (internal to storage/postgres/): SQLite's
// latest schema with the types PostgreSQL spells. Table cairn_schema holds
// the version; migration {v, sql} brings the version before it to v, all in
// one transaction under an advisory lock, so workers starting at once
// migrate once.
#pragma once

#include <span>

namespace cairn::storage::postgres {

struct migration {
  int version;
  const char* sql;
};
std::span<const migration> migrations();
// The schema version this cairn writes.
int latest_version();

// pg_advisory_xact_lock's key for migrations: "cairn" in ASCII.
inline constexpr const char* migration_lock = "SELECT pg_advisory_xact_lock(426248516206)";

}  // namespace cairn::storage::postgres
