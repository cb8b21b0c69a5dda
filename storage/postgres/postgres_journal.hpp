// The PostgreSQL implementation of storage::journal (journal.hpp): one
// database shared by many workers. Callers open it through
// storage::open_journal; this header is for storage/ (wake-ups) and the
// tests of PostgreSQL's own format.
//
// One journal object is one libpq connection. A call that finds the
// connection lost (a server restart) fails with storage_error(io) and the
// next call reconnects. Wake-ups (wakeup.hpp) are NOTIFYs on channel
// cairn_wake sent inside the transactions that cause them, so they are
// delivered at commit.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "storage/journal.hpp"
#include "storage/wakeup.hpp"

struct pg_conn;  // libpq's PGconn

namespace cairn::storage::postgres {

std::unique_ptr<journal> open_journal(const std::filesystem::path& url, const journal_options& options);
// The schema version this cairn writes on PostgreSQL.
int schema_version();

// The channel of wake-ups on PostgreSQL; the payload is "WHAT RUN_ID" (wakeup.hpp).
inline constexpr const char* wake_channel = "cairn_wake";

// A connection LISTENing on wake_channel for wake_listener (wakeup.hpp).
// Throws storage_error(io) when the server cannot be reached.
class postgres_listener {
 public:
  explicit postgres_listener(const std::string& url);
  ~postgres_listener();
  postgres_listener(const postgres_listener&) = delete;
  postgres_listener& operator=(const postgres_listener&) = delete;

  // Hands each wake-up heard to `on_wake` until `stop_fd` is readable. When
  // the connection is lost it tries again every second, and once back calls
  // on_wake with an empty run id: hints may have been missed meanwhile.
  void listen(int stop_fd, const std::function<void(const std::string& run_id, change what)>& on_wake);

 private:
  bool connect();
  std::string url_;
  ::pg_conn* conn_ = nullptr;
};

}  // namespace cairn::storage::postgres
