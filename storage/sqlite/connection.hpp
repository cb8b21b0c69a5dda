// A SQLite journal's connection (internal to storage/sqlite/): opening the
// file as the journal's options ask, its compiled statements, and what a
// failed SQLite call means for the user (translate).
#pragma once

#include <sqlite3.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>

#include <SQLiteCpp/SQLiteCpp.h>
#include <nlohmann/json.hpp>

#include "storage/journal.hpp"

namespace cairn::storage::sqlite {

// A row of a SQLite statement, as records.hpp reads rows.
struct sqlite_row {
  SQLite::Statement& s;
  bool null(int i) const { return s.getColumn(i).isNull(); }
  std::string text(int i) const { return s.getColumn(i).getString(); }
  std::int64_t int64(int i) const { return s.getColumn(i).getInt64(); }
};

inline void bind_one(SQLite::Statement& s, int i, std::string_view v) { s.bind(i, std::string(v)); }
inline void bind_one(SQLite::Statement& s, int i, std::int64_t v) { s.bind(i, v); }
inline void bind_one(SQLite::Statement& s, int i, int v) { s.bind(i, v); }
// Bytes bound as a BLOB (a compressed payload is not text).
struct blob {
  std::string_view bytes;
};
inline void bind_one(SQLite::Statement& s, int i, blob v) {
  s.bind(i, v.bytes.data(), static_cast<int>(v.bytes.size()));
}
template <class T>
void bind_one(SQLite::Statement& s, int i, const std::optional<T>& v) {
  if (v) bind_one(s, i, *v);
  else s.bind(i);
}

// A connection's compiled statements, by their SQL, lent one use at a time.
// Compiling cost more than running: a run's way to its first step compiled
// 14 statements, 0.54 ms of its 7 (bench/sandbox_start, warm, 2026-12-05).
// One thread's at a time, as its journal object is (journal.hpp); the
// ledger hands its journal from thread to thread under its own mutex.
class statement_cache {
  struct slot {
    std::unique_ptr<SQLite::Statement> statement;
    bool lent = false;
  };

 public:
  // One use of a statement: when it goes, the statement is reset (its read
  // transaction, if any, ends there) and its bindings cleared.
  class lent {
   public:
    explicit lent(std::unique_ptr<SQLite::Statement> own) : own_(std::move(own)), s_(own_.get()) {}
    lent(SQLite::Statement& s, slot* from) : s_(&s), from_(from) {}
    lent(lent&& other) noexcept
        : own_(std::move(other.own_)),
          s_(std::exchange(other.s_, nullptr)),
          from_(std::exchange(other.from_, nullptr)) {}
    lent& operator=(lent&&) = delete;
    ~lent() {
      if (!s_) return;
      s_->tryReset();  // a failure was thrown already, where it happened
      try {
        s_->clearBindings();
      } catch (const SQLite::Exception&) {
        // sqlite3_clear_bindings cannot fail; the next use binds anew anyway
      }
      if (from_) from_->lent = false;
    }
    operator SQLite::Statement&() const { return *s_; }
    bool executeStep() { return s_->executeStep(); }
    int exec() { return s_->exec(); }
    SQLite::Column getColumn(int i) const { return s_->getColumn(i); }

   private:
    std::unique_ptr<SQLite::Statement> own_;
    SQLite::Statement* s_;
    slot* from_ = nullptr;
  };

  // The cached statement, or, while that one is lent (a query inside
  // another's loop), one compiled for this use alone.
  lent take(SQLite::Database& db, const char* sql) {
    slot& s = slots_[sql];  // references into an unordered_map survive its growth
    if (s.lent) return lent(std::make_unique<SQLite::Statement>(db, sql));
    if (!s.statement) s.statement = std::make_unique<SQLite::Statement>(db, sql);
    s.lent = true;
    return lent(*s.statement, &s);
  }

 private:
  std::unordered_map<std::string, slot> slots_;
};
// SQLite's own busy handler sleeps 1, 2, 5, ... 100 ms between tries. With a
// writer per run (cairn serve) commits then queue behind those sleeps, one
// run starving while another commits at once. Trying again every 0.1-2 ms
// keeps the lock handed on as soon as it is free, up to busy_timeout.
struct busy_wait {
  std::chrono::milliseconds timeout;
  std::chrono::steady_clock::time_point since;

  static int on_busy(void* self, int tries) {
    auto* w = static_cast<busy_wait*>(self);
    const auto now = std::chrono::steady_clock::now();
    if (tries == 0) w->since = now;
    if (now - w->since >= w->timeout) return 0;
    std::this_thread::sleep_for(std::chrono::microseconds(std::min(100 * (tries + 1), 2000)));
    return 1;
  }
};

// What a failed SQLite call means for the user, with what to do about it.
storage_error translate(const SQLite::Exception& e, const std::filesystem::path& path, std::string_view run_id);

// One connection to the journal file, opened (and, when writable, created
// and migrated) as `options` ask. One thread's at a time.
class connection {
 public:
  connection(const std::filesystem::path& path, const journal_options& options);
  connection(const connection&) = delete;
  connection& operator=(const connection&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const journal_options& options() const { return options_; }
  SQLite::Database& db() { return db_; }

  // Runs `body`, turning SQLite's failures into storage_error. A transaction
  // inside `body` has rolled back by the time the error leaves.
  template <class F>
  auto guard(std::string_view run_id, F&& body) -> decltype(body()) {
    try {
      return body();
    } catch (const SQLite::Exception& e) {
      throw translate(e, path_, run_id);
    } catch (const nlohmann::json::exception& e) {
      throw storage_error(errc::corrupt, "journal " + path_.string() + " holds invalid JSON (" + e.what() + ")");
    }
  }

  // A statement for one use, from the connection's cache, with these bindings.
  template <class... Args>
  statement_cache::lent statement(const char* sql, const Args&... args) {
    auto s = statements_.take(db_, sql);
    int i = 0;
    (bind_one(s, ++i, args), ...);
    return s;
  }
  // Runs a statement without results: the rows it changed.
  template <class... Args>
  int changed(const char* sql, const Args&... args) {
    return statement(sql, args...).exec();
  }
  // One statement without results (a transaction's BEGIN, SAVEPOINT, ...),
  // compiled once. Reset at once, failed or not (statement() does): a
  // statement left pending after SQLITE_BUSY would hold back the commit of
  // the next autocommit write.
  void run(const char* sql) { changed(sql); }

  // Commits skip their sync until sync_as_asked() (write_together's
  // sync_later), and no checkpoint runs meanwhile.
  void sync_later();
  void sync_as_asked();

 private:
  // A commit that skips its sync must not checkpoint: a checkpoint under
  // synchronous=OFF copies frames into the database file without syncing
  // it, and once the WAL starts over, a power cut could take earlier,
  // acknowledged commits with it. So this hook stands in for SQLite's
  // automatic checkpoint (same threshold, PASSIVE) and skips it then; the
  // next synced commit checkpoints.
  static int after_commit(void* self, sqlite3* db, const char* name, int wal_pages);
  static constexpr int auto_checkpoint_pages = 1000;  // SQLite's default

  std::filesystem::path path_;
  journal_options options_;
  SQLite::Database db_;
  busy_wait busy_;
  statement_cache statements_;
  bool syncing_later_ = false;
};

}  // namespace cairn::storage::sqlite
