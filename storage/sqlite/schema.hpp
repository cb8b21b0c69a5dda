// The SQLite journal's format (internal to storage/sqlite/): `PRAGMA
// user_version` is the schema version; migration i brings version i to i + 1.
#pragma once

#include <filesystem>

#include <SQLiteCpp/SQLiteCpp.h>

#include "storage/journal.hpp"

namespace cairn::storage::sqlite {

// The schema version this cairn writes.
int latest_version();
int user_version(SQLite::Database& db);
// storage_error(schema_too_new) when `version` is newer than this cairn's.
void check_not_too_new(int version, const std::filesystem::path& path);
// Brings the journal to latest_version(), all migrations in one IMMEDIATE
// transaction; a journal migrated meanwhile by another process is left alone.
// Records created_by (which cairn made the journal, or that an older one did).
void migrate(SQLite::Database& db, const std::filesystem::path& path);
// Records this cairn as the journal's last writer (a write only when another was).
void note_writer(SQLite::Database& db);

}  // namespace cairn::storage::sqlite
