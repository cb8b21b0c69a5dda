// The raw operation under a durable step: a row shaped like the journal's
// steps, inserted into a plain SQLite database (WAL mode), with nothing of
// cairn around it. step_latency and throughput time it beside the engine.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include <SQLiteCpp/SQLiteCpp.h>

namespace bench {

// Opens (creating) `db` in WAL mode with synchronous=`sync` ("FULL" or
// "NORMAL") and a `steps` table shaped like the journal's.
inline SQLite::Database open_raw_journal(const std::filesystem::path& db, const std::string& sync) {
  SQLite::Database d(db.string(), SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
  d.exec("PRAGMA journal_mode=WAL");
  d.exec("PRAGMA synchronous=" + sync);
  d.exec("CREATE TABLE IF NOT EXISTS steps (run_id TEXT, seq INTEGER, name TEXT, kind TEXT, status TEXT, "
         "output TEXT, attempt INTEGER, duration_us INTEGER, started_at_ms INTEGER, finished_at_ms INTEGER, "
         "PRIMARY KEY (run_id, seq))");
  return d;
}

// Inserts one empty step row; bind run id (1), seq (2) and name (3).
inline constexpr const char* raw_insert_step =
    "INSERT INTO steps VALUES (?, ?, ?, 'step', 'ok', 'null', 1, 0, 0, 0)";

// Inserts step `seq` of run `run_id` with `insert` (a raw_insert_step statement).
inline void insert_raw_step(SQLite::Statement& insert, const std::string& run_id, std::int64_t seq) {
  insert.bind(1, run_id);
  insert.bind(2, seq);
  insert.bind(3, "s" + std::to_string(seq));
  insert.exec();
  insert.reset();
}

}  // namespace bench
