// The raw operation under a durable step on PostgreSQL: one row shaped like
// the journal's steps, INSERTed and committed alone (one round trip, one
// commit) over a plain libpq connection, with nothing of cairn around it.
// pg_step_latency and scale_out time it beside the journal.
#pragma once

#include <libpq-fe.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace bench {

class raw_pg_steps {
 public:
  // Connects to `url` and makes the table raw_steps (if missing) and the
  // prepared insert; throws std::runtime_error with the server's message.
  explicit raw_pg_steps(const std::string& url) : conn_(PQconnectdb(url.c_str())) {
    if (PQstatus(conn_) != CONNECTION_OK) fail();
    PQsetNoticeProcessor(conn_, [](void*, const char*) {}, nullptr);  // "raw_steps already exists"
    check(PQexec(conn_, "CREATE TABLE IF NOT EXISTS raw_steps (run_id TEXT, seq BIGINT, name TEXT, kind TEXT, "
                        "status TEXT, output TEXT, error_message TEXT, error_type TEXT, attempt INTEGER, "
                        "duration_us BIGINT, started_at_ms BIGINT, finished_at_ms BIGINT, PRIMARY KEY (run_id, seq))"));
    check(PQprepare(conn_, "raw_insert",
                    "INSERT INTO raw_steps VALUES ('bench', $1::bigint, 'step', 'step', 'ok', '{\"n\":1}', NULL, NULL, "
                    "1, 10, 0, 0)",
                    1, nullptr));
  }
  ~raw_pg_steps() { PQfinish(conn_); }
  raw_pg_steps(const raw_pg_steps&) = delete;
  raw_pg_steps& operator=(const raw_pg_steps&) = delete;

  // Inserts and commits step `seq` (each seq once).
  void insert(std::int64_t seq) {
    const std::string text = std::to_string(seq);
    const char* values[] = {text.c_str()};
    check(PQexecPrepared(conn_, "raw_insert", 1, values, nullptr, nullptr, 0));
  }

 private:
  void check(PGresult* r) {
    const auto s = PQresultStatus(r);
    PQclear(r);
    if (s != PGRES_COMMAND_OK && s != PGRES_TUPLES_OK) fail();
  }
  [[noreturn]] void fail() { throw std::runtime_error(std::string("raw PostgreSQL: ") + PQerrorMessage(conn_)); }

  PGconn* conn_;
};

}  // namespace bench
