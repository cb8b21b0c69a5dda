// The SQLite implementation of storage::journal (journal.hpp): one file in
// WAL mode, many processes. Callers open it through storage::open_journal;
// this header is for storage/ and the tests of SQLite's own format.
#pragma once

#include <filesystem>
#include <memory>

#include "storage/journal.hpp"

namespace cairn::storage::sqlite {

std::unique_ptr<journal> open_journal(const std::filesystem::path& path, const journal_options& options);
// The schema version (PRAGMA user_version) this cairn writes.
int schema_version();

}  // namespace cairn::storage::sqlite
