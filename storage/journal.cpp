#include "storage/journal.hpp"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <utility>

#include <SQLiteCpp/SQLiteCpp.h>
#include <fmt/format.h>

#include "protocol/bounded_json.hpp"
#include "storage/payloads.hpp"
#include "storage/postgres_journal.hpp"
#include "storage/records.hpp"

namespace cairn::storage {
namespace fs = std::filesystem;
using namespace detail;

namespace {

// The journal's format. `PRAGMA user_version` is the schema version: migration
// i brings version i to i + 1, all of them in one IMMEDIATE transaction. JSON
// columns hold json::dump() text. Times are milliseconds since the Unix epoch.
constexpr const char* migrations[] = {
    R"sql(
CREATE TABLE runs (
  id             TEXT PRIMARY KEY,
  agent          TEXT NOT NULL,
  input          TEXT NOT NULL,
  status         TEXT NOT NULL CHECK (status IN ('pending', 'running', 'completed', 'failed')),
  output         TEXT,                      -- when completed
  error_message  TEXT,                      -- when failed
  error_type     TEXT,
  attempts       INTEGER NOT NULL DEFAULT 0,
  max_attempts   INTEGER NOT NULL,
  owner          TEXT NOT NULL DEFAULT '',  -- engine/owner.hpp; '' when no process has it
  sandbox        TEXT NOT NULL,
  workspace      TEXT NOT NULL,
  created_at_ms  INTEGER NOT NULL,
  updated_at_ms  INTEGER NOT NULL,
  finished_at_ms INTEGER
);

CREATE TABLE steps (
  run_id         TEXT NOT NULL REFERENCES runs (id),
  seq            INTEGER NOT NULL,
  name           TEXT NOT NULL,
  kind           TEXT NOT NULL,             -- protocol step_kind
  status         TEXT NOT NULL CHECK (status IN ('ok', 'error')),
  output         TEXT,                      -- when ok
  error_message  TEXT,                      -- when error
  error_type     TEXT,
  attempt        INTEGER NOT NULL,
  duration_us    INTEGER NOT NULL,
  started_at_ms  INTEGER NOT NULL,
  finished_at_ms INTEGER NOT NULL,
  PRIMARY KEY (run_id, seq)
);

-- Steps are write-once, enforced by the database for every client. The INSERT
-- trigger closes INSERT OR REPLACE, which deletes without firing DELETE triggers.
CREATE TRIGGER steps_insert_once BEFORE INSERT ON steps
  WHEN EXISTS (SELECT 1 FROM steps WHERE run_id = NEW.run_id AND seq = NEW.seq)
  BEGIN SELECT RAISE(ABORT, 'steps are write-once: this step is already journaled'); END;
CREATE TRIGGER steps_no_update BEFORE UPDATE ON steps
  BEGIN SELECT RAISE(ABORT, 'steps are write-once: a journaled step cannot be updated'); END;
CREATE TRIGGER steps_no_delete BEFORE DELETE ON steps
  BEGIN SELECT RAISE(ABORT, 'steps are write-once: a journaled step cannot be deleted'); END;

CREATE TABLE events (
  id     INTEGER PRIMARY KEY AUTOINCREMENT,
  run_id TEXT NOT NULL REFERENCES runs (id),
  seq    INTEGER,
  kind   TEXT NOT NULL,
  data   TEXT NOT NULL,
  at_ms  INTEGER NOT NULL
);
CREATE INDEX events_by_run ON events (run_id, id);
)sql",
    // 2: the policy a run is held to, and the in_doubt status (an at-most-once
    // tool call was started but its outcome is unknown). SQLite cannot change
    // a CHECK constraint in place, so runs is rebuilt (migrate() turns foreign
    // keys off around it). waiting and cancelled are accepted for the daemon.
    R"sql(
CREATE TABLE runs_v2 (
  id             TEXT PRIMARY KEY,
  agent          TEXT NOT NULL,
  input          TEXT NOT NULL,
  status         TEXT NOT NULL CHECK (status IN ('pending', 'running', 'waiting', 'completed', 'failed',
                                                 'cancelled', 'in_doubt')),
  output         TEXT,                      -- when completed
  error_message  TEXT,                      -- when failed or in_doubt
  error_type     TEXT,
  attempts       INTEGER NOT NULL DEFAULT 0,
  max_attempts   INTEGER NOT NULL,
  owner          TEXT NOT NULL DEFAULT '',  -- engine/owner.hpp; '' when no process has it
  sandbox        TEXT NOT NULL,
  workspace      TEXT NOT NULL,
  created_at_ms  INTEGER NOT NULL,
  updated_at_ms  INTEGER NOT NULL,
  finished_at_ms INTEGER,
  policy         TEXT NOT NULL DEFAULT '{}' -- engine/policy.hpp, normalized
);
INSERT INTO runs_v2 (id, agent, input, status, output, error_message, error_type, attempts, max_attempts, owner,
                     sandbox, workspace, created_at_ms, updated_at_ms, finished_at_ms)
  SELECT id, agent, input, status, output, error_message, error_type, attempts, max_attempts, owner,
         sandbox, workspace, created_at_ms, updated_at_ms, finished_at_ms FROM runs;
DROP TABLE runs;
ALTER TABLE runs_v2 RENAME TO runs;
CREATE INDEX events_by_seq ON events (run_id, seq);
)sql",
    // 3: long-running runs. A run waits (status 'waiting', no owner) on a timer,
    // a signal or a child run; the wait columns say on what and are NULL
    // otherwise. Signals are queued here and each is delivered into exactly one
    // step (delivered_seq).
    R"sql(
ALTER TABLE runs ADD COLUMN parent_id TEXT;               -- the run that started this one; NULL for top-level
ALTER TABLE runs ADD COLUMN wait_kind TEXT CHECK (wait_kind IN ('timer', 'signal', 'child'));
ALTER TABLE runs ADD COLUMN wait_key TEXT;                -- signal name, or child run id
ALTER TABLE runs ADD COLUMN wait_seq INTEGER;             -- the step the run waits at
ALTER TABLE runs ADD COLUMN wake_at_ms INTEGER;           -- timer fires / wait times out; NULL = never
ALTER TABLE runs ADD COLUMN cancel_requested_at_ms INTEGER;
ALTER TABLE runs ADD COLUMN deadline_ms INTEGER;          -- the run's overall timeout; NULL = none
CREATE INDEX runs_by_parent ON runs (parent_id);
CREATE INDEX runs_by_wake ON runs (status, wake_at_ms);
-- The waiting runs with every column the scheduler's test reads: it scans
-- them without touching the (wide) run rows.
CREATE INDEX runs_waiting ON runs (wait_kind, wait_key, id, wake_at_ms, deadline_ms, cancel_requested_at_ms)
  WHERE status = 'waiting';

CREATE TABLE signals (
  id              INTEGER PRIMARY KEY AUTOINCREMENT,
  run_id          TEXT NOT NULL REFERENCES runs (id),
  name            TEXT NOT NULL,
  payload         TEXT NOT NULL,
  sent_at_ms      INTEGER NOT NULL,
  delivered_seq   INTEGER,                  -- the step it was delivered into; NULL while queued
  delivered_at_ms INTEGER
);
CREATE INDEX signals_undelivered ON signals (run_id, name, id) WHERE delivered_seq IS NULL;
CREATE INDEX signals_by_run ON signals (run_id, id);  -- a run's signals, delivered or not
)sql",
    // 4: fencing. Each claim of a run counts one more epoch; a process writes
    // for a run it claimed only while (owner, epoch) is still what its claim
    // set, so one that lost the run (judged dead, taken over) cannot write.
    R"sql(
ALTER TABLE runs ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;
)sql",
    // 5: payloads stored by content (payloads.hpp): the long strings of a
    // run's events, each once per run, referenced from the events' data.
    R"sql(
CREATE TABLE payloads (
  run_id TEXT NOT NULL REFERENCES runs (id),
  digest TEXT NOT NULL,
  body   TEXT NOT NULL,
  PRIMARY KEY (run_id, digest)
) WITHOUT ROWID;
)sql",
    // 6: many workers on one journal. Each `cairn serve` holds a row here
    // while its lease is current (storage/journal.hpp worker_record); a run
    // records the machine whose disk holds its workspace ('' = shared storage).
    R"sql(
ALTER TABLE runs ADD COLUMN workspace_host TEXT NOT NULL DEFAULT '';
CREATE TABLE workers (
  id                  TEXT PRIMARY KEY,         -- its owner string, engine/owner.hpp
  host                TEXT NOT NULL,
  workspace_root      TEXT NOT NULL DEFAULT '',
  started_at_ms       INTEGER NOT NULL,
  renewed_at_ms       INTEGER NOT NULL,
  lease_expires_at_ms INTEGER NOT NULL,
  fenced_writes       INTEGER NOT NULL DEFAULT 0
);
-- The runs each worker owns, without reading the finished ones.
CREATE INDEX runs_by_owner ON runs (owner) WHERE owner <> '';
)sql",
};
constexpr int latest_version = static_cast<int>(std::size(migrations));

// Byte offsets of the WAL write, checkpoint and recovery locks in the -shm file
// (SQLite's os_unix.c: UNIX_SHM_BASE 120, one byte each).
constexpr long shm_first_exclusive_lock = 120;
constexpr long shm_last_exclusive_lock = 122;

// A row of a SQLite statement, as records.hpp reads rows.
struct sqlite_row {
  SQLite::Statement& s;
  bool null(int i) const { return s.getColumn(i).isNull(); }
  std::string text(int i) const { return s.getColumn(i).getString(); }
  std::int64_t int64(int i) const { return s.getColumn(i).getInt64(); }
};

void bind_one(SQLite::Statement& s, int i, std::string_view v) { s.bind(i, std::string(v)); }
void bind_one(SQLite::Statement& s, int i, std::int64_t v) { s.bind(i, v); }
void bind_one(SQLite::Statement& s, int i, int v) { s.bind(i, v); }
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

int user_version(SQLite::Database& db) { return db.execAndGet("PRAGMA user_version").getInt(); }

bool folder_writable(const fs::path& file) {
  auto dir = file.parent_path();
  return access(dir.empty() ? "." : dir.c_str(), W_OK) == 0;
}

// The process holding the journal's write lock, read from /proc/locks. Not
// fcntl(F_GETLK): that needs a descriptor of our own on the file, and closing it
// would drop every POSIX lock this process holds there, SQLite's included.
std::optional<pid_t> lock_holder(const fs::path& db) {
  struct target {
    std::string dev_ino;
    bool shm;
  };
  std::vector<target> targets;
  for (auto [file, shm] : {std::pair{db, false}, std::pair{fs::path(db.string() + "-shm"), true}}) {
    struct stat st {};
    if (::stat(file.c_str(), &st) == 0)
      targets.push_back({fmt::format("{:02x}:{:02x}:{}", major(st.st_dev), minor(st.st_dev), st.st_ino), shm});
  }
  std::ifstream in("/proc/locks");
  std::optional<pid_t> this_process;
  // "1: POSIX  ADVISORY  WRITE 4121 fe:00:10953082 120 120"; waiters show "->".
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string id, type, advisory, mode, dev_ino;
    long pid = 0, start = 0;
    fields >> id >> type;
    if (type == "->") continue;
    if (!(fields >> advisory >> mode >> pid >> dev_ino >> start) || mode != "WRITE" || pid <= 0) continue;
    for (const auto& t : targets) {
      if (t.dev_ino != dev_ino) continue;
      if (t.shm && (start < shm_first_exclusive_lock || start > shm_last_exclusive_lock)) continue;
      if (pid != getpid()) return static_cast<pid_t>(pid);
      this_process = static_cast<pid_t>(pid);
    }
  }
  return this_process;
}

// What a failed SQLite call means for the user, with what to do about it.
storage_error translate(const SQLite::Exception& e, const fs::path& path, std::string_view run_id) {
  const int extended = e.getExtendedErrorCode();
  const std::string file = path.string();
  switch (extended & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED: {
      auto pid = lock_holder(path);
      std::string who = !pid                ? "another process"
                        : *pid == getpid() ? fmt::format("another connection in this process (pid {})", *pid)
                                           : fmt::format("another process (pid {})", *pid);
      return {errc::locked,
              fmt::format("journal {} is locked by {}; wait for it to finish or use another --db", file, who)};
    }
    case SQLITE_READONLY:
    case SQLITE_PERM:
      return {errc::read_only,
              fmt::format("journal {} is read-only ({}); check permissions or pass --db PATH", file, e.what())};
    case SQLITE_CANTOPEN:
      if (!folder_writable(path))
        return {errc::read_only, fmt::format("journal {} is read-only (its folder is not writable); check "
                                             "permissions or pass --db PATH",
                                             file)};
      return {errc::io, fmt::format("cannot open journal {}: {}", file, e.what())};
    case SQLITE_FULL:
      return {errc::disk_full, fmt::format("disk full writing journal {}: nothing of this write was kept; free "
                                           "space and run `cairn resume {}`",
                                           file, run_id.empty() ? "RUN" : run_id)};
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return {errc::corrupt, fmt::format("journal {} is damaged or not a cairn journal ({}); restore it from a "
                                         "backup or pass --db PATH",
                                         file, e.what())};
    case SQLITE_CONSTRAINT:
      if (extended == SQLITE_CONSTRAINT_FOREIGNKEY)
        return {errc::not_found, fmt::format("no run '{}' in journal {}", run_id, file)};
      return {errc::conflict, fmt::format("journal {}: {}", file, e.what())};
    default:
      return {errc::io, fmt::format("journal {}: {}", file, e.what())};
  }
}

void check_not_too_new(int version, const fs::path& path) {
  if (version > latest_version) throw schema_too_new_error(path.string(), version, latest_version);
}

// Runs with foreign keys off (a rebuilt table is briefly missing, as SQLite's
// ALTER TABLE guide prescribes) and checks them before the commit.
void migrate(SQLite::Database& db, const fs::path& path) {
  check_not_too_new(user_version(db), path);
  if (user_version(db) == latest_version) return;
  db.exec("PRAGMA foreign_keys = OFF");
  SQLite::Transaction tx(db, SQLite::TransactionBehavior::IMMEDIATE);
  // Read again under the write lock: another process may have migrated meanwhile.
  const int version = user_version(db);
  check_not_too_new(version, path);
  for (int v = version; v < latest_version; ++v) db.exec(migrations[v]);
  SQLite::Statement broken(db, "PRAGMA foreign_key_check");
  if (broken.executeStep())
    throw storage_error(errc::corrupt, fmt::format("journal {}: migrating to schema {} left a row in {} without its "
                                                   "run; restore the journal from a backup",
                                                   path.string(), latest_version, broken.getColumn(0).getString()));
  db.exec(fmt::format("PRAGMA user_version = {}", latest_version));
  tx.commit();
}

void sync_folder_of(const fs::path& file) {
  const fs::path folder = file.has_parent_path() ? file.parent_path() : fs::path(".");
  int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) < 0) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    throw storage_error(errc::io, fmt::format("cannot sync the folder of journal {}: {}", file.string(),
                                              std::strerror(err)));
  }
  ::close(fd);
}

// How the journal's commits are synced, as its options ask.
const char* sync_pragma(const journal_options& options) {
#ifdef CAIRN_TEST_UNSAFE_NO_SYNC  // cairn_unsafe_no_sync, with which power_loss_test must fail
  (void)options;
  return "PRAGMA synchronous = OFF";
#else
  return options.sync == sync_mode::full ? "PRAGMA synchronous = FULL" : "PRAGMA synchronous = NORMAL";
#endif
}

SQLite::Database open_writable(const fs::path& path, const journal_options& options) {
  std::error_code ec;
  if (path.has_parent_path()) fs::create_directories(path.parent_path(), ec);
  if (ec == std::errc::permission_denied || ec == std::errc::read_only_file_system)
    throw storage_error(errc::read_only, fmt::format("journal {} is read-only (cannot create its folder: {}); check "
                                                     "permissions or pass --db PATH",
                                                     path.string(), ec.message()));
  if (ec)
    throw storage_error(errc::io, fmt::format("cannot create the folder of journal {}: {}; pass --db PATH",
                                              path.string(), ec.message()));
  const bool fresh = !fs::exists(path, ec);
  SQLite::Database db(path, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE,
                      static_cast<int>(options.busy_timeout.count()));
  // SQLite quietly opens an unwritable file read-only; say so now, not at the first step.
  if (sqlite3_db_readonly(db.getHandle(), "main") == 1)
    throw storage_error(errc::read_only, fmt::format("journal {} is read-only (the file is not writable by this "
                                                     "user); check permissions or pass --db PATH",
                                                     path.string()));
  // Two processes opening a new journal at once (two workers, a submit and
  // a serve) meet while it is still in rollback mode, where SQLite answers a
  // would-be deadlock with SQLITE_BUSY at once, without its busy handler:
  // try again within the busy timeout.
  const auto give_up = std::chrono::steady_clock::now() + options.busy_timeout;
  auto retrying_busy = [&](auto&& f) {
    for (int tries = 1;; ++tries) {
      try {
        return f();
      } catch (const SQLite::Exception& e) {
        const int code = e.getErrorCode() & 0xff;
        if ((code != SQLITE_BUSY && code != SQLITE_LOCKED) || std::chrono::steady_clock::now() > give_up) throw;
        std::this_thread::sleep_for(std::chrono::milliseconds(std::min(tries, 20)));
      }
    }
  };
  const std::string mode = retrying_busy([&] { return db.execAndGet("PRAGMA journal_mode = WAL").getString(); });
  if (mode != "wal")
    throw storage_error(errc::io, fmt::format("journal {} cannot use WAL mode (SQLite kept '{}')", path.string(), mode));
  db.exec(sync_pragma(options));
  retrying_busy([&] { migrate(db, path); });
  db.exec("PRAGMA foreign_keys = ON");
  // SQLite syncs the file it creates but not the folder that names it: after
  // a power cut the new journal, and every step in it, could be gone.
  if (fresh) sync_folder_of(path);
  return db;
}

// "file:" URI for sqlite3_open_v2, percent-encoding what URIs reserve.
std::string file_uri(const fs::path& path) {
  std::string uri = "file:";
  for (unsigned char c : path.string()) {
    if (std::isalnum(c) || std::string_view("/-._~").find(static_cast<char>(c)) != std::string_view::npos)
      uri += static_cast<char>(c);
    else
      uri += fmt::format("%{:02X}", c);
  }
  return uri;
}

SQLite::Database open_read_only(const fs::path& path, const journal_options& options) {
  const int busy_ms = static_cast<int>(options.busy_timeout.count());
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw storage_error(errc::not_found, fmt::format("no journal at {} (nothing has run yet?)", path.string()));
  SQLite::Database db(path, SQLite::OPEN_READONLY, busy_ms);
  int version = 0;
  try {
    version = user_version(db);
  } catch (const SQLite::Exception& e) {
    // A WAL reader needs PATH-shm, which it cannot create in a folder it cannot
    // write. Without a PATH-wal no process has the journal open and the file
    // alone is complete, so read it as immutable (no locks, no side files).
    if (e.getExtendedErrorCode() != SQLITE_READONLY_DIRECTORY || fs::exists(path.string() + "-wal", ec)) throw;
    db = SQLite::Database(file_uri(path) + "?immutable=1", SQLite::OPEN_READONLY | SQLite::OPEN_URI, busy_ms);
    version = user_version(db);
  }
  check_not_too_new(version, path);
  if (version == 0)
    throw storage_error(errc::not_found, fmt::format("no journal at {} (the file is empty; nothing has run yet?)",
                                                     path.string()));
  if (version < latest_version)
    throw storage_error(errc::io, fmt::format("journal {} has schema version {}, older than this cairn's ({}); "
                                              "any writing command (`cairn run`, `cairn resume`) upgrades it",
                                              path.string(), version, latest_version));
  return db;
}

const std::string run_select = fmt::format("SELECT {} FROM runs ", run_columns);
const std::string step_select = fmt::format("SELECT {} FROM steps ", step_columns);
const std::string signal_select = fmt::format("SELECT {} FROM signals ", signal_columns);
const std::string event_select = fmt::format("SELECT {} FROM events ", event_columns);

using payload_lookup = std::function<std::optional<std::string>(const std::string& digest)>;
std::vector<event_record> read_events(SQLite::Statement& s, std::string_view run_id, const payload_lookup& payload);

}  // namespace

std::string_view to_string(run_status s) {
  switch (s) {
    case run_status::pending: return "pending";
    case run_status::running: return "running";
    case run_status::waiting: return "waiting";
    case run_status::completed: return "completed";
    case run_status::failed: return "failed";
    case run_status::cancelled: return "cancelled";
    case run_status::in_doubt: return "in_doubt";
  }
  return "unknown";
}

std::optional<run_status> parse_run_status(std::string_view s) {
  using enum run_status;
  for (auto st : {pending, running, waiting, completed, failed, cancelled, in_doubt})
    if (to_string(st) == s) return st;
  return std::nullopt;
}

std::int64_t now_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

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

struct journal::impl {
  fs::path path;
  journal_options options;
  SQLite::Database db;
  busy_wait busy;

  impl(const fs::path& p, const journal_options& options)
      : path(p),
        options(options),
        db(guard({}, [&] { return options.read_only ? open_read_only(p, options) : open_writable(p, options); })),
        busy{options.busy_timeout, {}} {
    sqlite3_busy_handler(db.getHandle(), &busy_wait::on_busy, &busy);
    if (!options.read_only) sqlite3_wal_hook(db.getHandle(), &impl::after_commit, this);
  }

  // A commit that skips its sync (write_together's sync_later) must not
  // checkpoint: a checkpoint under synchronous=OFF copies frames into the
  // database file without syncing it, and once the WAL starts over, a power
  // cut could take earlier, acknowledged commits with it. So this hook
  // stands in for SQLite's automatic checkpoint (same threshold, PASSIVE)
  // and skips it then; the next synced commit checkpoints.
  bool syncing_later = false;
  static int after_commit(void* self, sqlite3* db, const char* name, int wal_pages) {
    if (!static_cast<impl*>(self)->syncing_later && wal_pages >= auto_checkpoint_pages)
      sqlite3_wal_checkpoint_v2(db, name, SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr);
    return SQLITE_OK;
  }
  static constexpr int auto_checkpoint_pages = 1000;  // SQLite's default

  // Runs `body`, turning SQLite's failures into storage_error. A transaction
  // inside `body` has rolled back by the time the error leaves.
  template <class F>
  auto guard(std::string_view run_id, F&& body) -> decltype(body()) {
    try {
      return body();
    } catch (const SQLite::Exception& e) {
      throw translate(e, path, run_id);
    } catch (const json::exception& e) {
      throw storage_error(errc::corrupt, fmt::format("journal {} holds invalid JSON ({})", path.string(), e.what()));
    }
  }

  void event(std::string_view run_id, std::string_view kind, const json& data, std::optional<std::int64_t> seq) {
    auto split = split_payloads(data);
    for (const auto& piece : split.pieces)
      changed("INSERT OR IGNORE INTO payloads (run_id, digest, body) VALUES (?, ?, ?)", run_id, piece.digest,
              piece.body);
    changed("INSERT INTO events (run_id, seq, kind, data, at_ms) VALUES (?, ?, ?, ?, ?)", run_id, seq, kind,
            dump(split.manifest), now_ms());
  }

  // A statement for one use, from the connection's cache, with these bindings.
  template <class... Args>
  statement_cache::lent statement(const char* sql, const Args&... args) {
    auto s = statements.take(db, sql);
    int i = 0;
    (bind_one(s, ++i, args), ...);
    return s;
  }
  statement_cache statements;
  // Runs a statement without results: the rows it changed.
  template <class... Args>
  int changed(const char* sql, const Args&... args) {
    return statement(sql, args...).exec();
  }

  // The bodies of a run's events' payloads, by digest.
  payload_lookup payloads_of(std::string_view run_id) {
    return [this, run_id](const std::string& digest) -> std::optional<std::string> {
      auto body = statement("SELECT body FROM payloads WHERE run_id = ? AND digest = ?", run_id, digest);
      if (!body.executeStep()) return std::nullopt;
      return body.getColumn(0).getString();
    };
  }

  // One statement without results (a transaction's BEGIN, SAVEPOINT, ...),
  // compiled once. Reset at once, failed or not (statement() does): a
  // statement left pending after SQLITE_BUSY would hold back the commit of
  // the next autocommit write.
  void run(const char* sql) { changed(sql); }

  void require_run(int changed, std::string_view run_id) {
    if (changed == 0) throw no_run_error(run_id, path.string());
  }

  // The run's status; storage_error(not_found) if there is no such run.
  run_status status_of(std::string_view run_id) {
    auto s = statement("SELECT status FROM runs WHERE id = ?", run_id);
    require_run(s.executeStep() ? 1 : 0, run_id);
    auto status = parse_run_status(s.getColumn(0).getString());
    if (!status) throw storage_error(errc::corrupt, fmt::format("run {} has an unknown status", run_id));
    return *status;
  }

  // The runs this object claimed; in a group commit (`grouped`) what a
  // write changes of them waits for the commit.
  holds held;
  bool grouped = false;

  // Inside a write transaction: refuses the write if this object claimed the
  // run and someone has claimed it since. The claim stays, so every later
  // write is refused too.
  void fence(std::string_view run_id) {
    const holds::claim* h = held.find(run_id);
    if (!h) return;
    std::string owner;
    std::int64_t epoch = 0;
    bool found = false;
    {
      auto s = statement("SELECT owner, epoch FROM runs WHERE id = ?", run_id);
      found = s.executeStep();
      if (found) {
        owner = s.getColumn(0).getString();
        epoch = s.getColumn(1).getInt64();
      }
    }
    require_run(found ? 1 : 0, run_id);
#ifdef CAIRN_TEST_UNSAFE_NO_EPOCH_FENCE  // cairn_unsafe_no_epoch_fence, with which storage_test must fail
    if (owner == h->owner) return;
#endif
    if (owner == h->owner && epoch == h->epoch) return;
    throw fenced_error(run_id, owner, epoch, h->epoch);
  }

  static constexpr const char* begin_statement = "BEGIN IMMEDIATE";
  using write_txn = write_transaction<impl, SQLite::Exception>;

  // `write` under the fence: in one transaction with the check when this
  // object holds the run, else as it is (a single statement commits alone).
  template <class F>
  void fenced(std::string_view run_id, F&& write) {
    if (!held.find(run_id)) return write();
    write_txn tx(*this);
    fence(run_id);
    write();
    tx.commit();
  }

  // Why an update guarded by "not finished" changed nothing.
  [[noreturn]] void throw_finished_or_missing(std::string_view run_id, std::string_view doing) {
    throw finished_error(run_id, status_of(run_id), doing);
  }

  // Inserts the step row; a (run, seq) already journaled is storage_error(conflict).
  void insert_step(const step_record& step) {
    const auto& r = step.result;
    auto [out, message, type] = outcome_columns(r.ok, r.output, r.error);
    try {
      changed("INSERT INTO steps (run_id, seq, name, kind, status, output, error_message, error_type, attempt, "
              "duration_us, started_at_ms, finished_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
              step.run_id, static_cast<std::int64_t>(r.seq), r.name, protocol::to_string(r.kind),
              std::string_view(r.ok ? "ok" : "error"), out, message, type, r.attempt, r.duration_us,
              step.started_at_ms, step.finished_at_ms);
    } catch (const SQLite::Exception& e) {
      if ((e.getExtendedErrorCode() & 0xff) != SQLITE_CONSTRAINT ||
          e.getExtendedErrorCode() == SQLITE_CONSTRAINT_FOREIGNKEY)
        throw;
      throw step_conflict_error(step.run_id, r.seq, path.string());
    }
  }
};

std::vector<std::exception_ptr> journal::write_together(std::span<const std::function<void(journal&)>> writes,
                                                        bool sync_later) {
  if (pg_) return pg_->write_together(*this, writes);
  auto& j = *impl_;
  auto run = [&j](const char* sql) { j.guard({}, [&] { j.run(sql); }); };
  // Whatever happens, the connection syncs again afterwards (one that
  // cannot must not write on: the exception ends the process).
  struct sync_again {
    impl* j;
    ~sync_again() {
      if (!j) return;
      j->syncing_later = false;
      j->db.exec(sync_pragma(j->options));
    }
  } restore{sync_later ? &j : nullptr};
  if (sync_later) {
    j.syncing_later = true;
    // Compiled each time: a PRAGMA takes effect when it is prepared, not
    // when a cached statement runs again.
    j.guard({}, [&] { j.db.exec("PRAGMA synchronous = OFF"); });
  }
  return group_commit(*this, writes,
                      {.run = run,
                       .in_transaction = [&j] { return sqlite3_get_autocommit(j.db.getHandle()) == 0; },
                       .begin = impl::begin_statement,
                       .grouped = j.grouped,
                       .held = j.held});
}

journal::journal(const fs::path& path, journal_options options) {
  if (is_postgres_url(path.string())) pg_ = std::make_unique<postgres_journal>(path, options);
  else impl_ = std::make_unique<impl>(path, options);
}

journal::~journal() = default;

const fs::path& journal::path() const { return pg_ ? pg_->path() : impl_->path; }

const journal_options& journal::options() const { return pg_ ? pg_->options() : impl_->options; }

int journal::schema_version() { return latest_version; }

int journal::backend_schema_version() const { return pg_ ? postgres_journal::schema_version() : latest_version; }

std::pair<run_record, bool> journal::create_run(const new_run& run) {
  if (pg_) return pg_->create_run(run);
  return impl_->guard(run.id, [&] {
    const auto now = now_ms();
    int inserted = 0;
    // A child is created for its parent's attempt: fenced by the parent's claim.
    impl_->fenced(run.parent_id, [&] {
      inserted = impl_->changed(
          "INSERT INTO runs (id, agent, input, status, max_attempts, sandbox, workspace, "
          "created_at_ms, updated_at_ms, policy, parent_id, owner, deadline_ms, workspace_host) "
          "VALUES (?, ?, ?, 'pending', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
          run.id, run.agent, dump(run.input), run.max_attempts, run.sandbox, run.workspace, now, now, dump(run.policy),
          null_if_empty(run.parent_id), run.owner, run.deadline_ms, run.workspace_host);
    });
    auto record = find_run(run.id);
    if (!record) throw storage_error(errc::io, "run " + run.id + " vanished right after it was created");
    return std::pair{std::move(*record), inserted == 1};
  });
}

std::optional<run_record> journal::find_run(std::string_view id) {
  if (pg_) return pg_->find_run(id);
  return impl_->guard(id, [&]() -> std::optional<run_record> {
    auto s = impl_->statement((run_select + "WHERE id = ?").c_str(), id);
    if (!s.executeStep()) return std::nullopt;
    return read_run(sqlite_row{s});
  });
}

std::vector<run_record> journal::children(std::string_view parent_id) {
  if (pg_) return pg_->children(parent_id);
  return impl_->guard(parent_id, [&] {
    auto s = impl_->statement((run_select + "WHERE parent_id = ? ORDER BY created_at_ms, rowid").c_str(), parent_id);
    std::vector<run_record> runs;
    while (s.executeStep()) runs.push_back(read_run(sqlite_row{s}));
    return runs;
  });
}

std::vector<run_record> journal::runs_with_workspace_near(const std::string& folder) {
  if (pg_) return pg_->runs_with_workspace_near(folder);
  return impl_->guard({}, [&] {
    auto s = impl_->statement((run_select + "WHERE " + detail::workspace_near_sql("?1")).c_str(), folder);
    std::vector<run_record> runs;
    while (s.executeStep()) runs.push_back(read_run(sqlite_row{s}));
    return runs;
  });
}

std::vector<run_record> journal::list_runs() {
  if (pg_) return pg_->list_runs();
  return impl_->guard({}, [&] {
    // rowid breaks ties within a millisecond in insertion order.
    auto s = impl_->statement((run_select + "ORDER BY created_at_ms DESC, rowid DESC").c_str());
    std::vector<run_record> runs;
    while (s.executeStep()) runs.push_back(read_run(sqlite_row{s}));
    return runs;
  });
}

bool journal::claim_run(std::string_view id, std::string_view expected_owner, std::string_view new_owner) {
  if (pg_) return pg_->claim_run(id, expected_owner, new_owner);
  return impl_->guard(id, [&] {
    impl::write_txn tx(*impl_);
    if (impl_->changed("UPDATE runs SET status = 'running', owner = ?, epoch = epoch + 1, updated_at_ms = ?, "
                       "wait_kind = NULL, wait_key = NULL, wait_seq = NULL, wake_at_ms = NULL "
                       "WHERE id = ? AND owner = ? AND status NOT IN ('completed', 'cancelled')",
                       new_owner, now_ms(), id, expected_owner) != 1)
      return false;
    auto s = impl_->statement("SELECT epoch FROM runs WHERE id = ?", id);
    s.executeStep();
    const std::int64_t epoch = s.getColumn(0).getInt64();
    tx.commit();
    impl_->held.take(id, {std::string(new_owner), epoch});
    return true;
  });
}

void journal::confirm_held(std::string_view id) {
  if (pg_) return pg_->confirm_held(id);
  impl_->guard(id, [&] { impl_->fence(id); });
}

int journal::begin_attempt(std::string_view id) {
  if (pg_) return pg_->begin_attempt(id);
  return impl_->guard(id, [&] {
    impl::write_txn tx(*impl_);
    impl_->fence(id);
    impl_->require_run(
        impl_->changed("UPDATE runs SET attempts = attempts + 1, updated_at_ms = ? WHERE id = ?", now_ms(), id), id);
    auto s = impl_->statement("SELECT attempts FROM runs WHERE id = ?", id);
    s.executeStep();
    const int attempt = s.getColumn(0).getInt();
    impl_->event(id, "attempt_started", {{"attempt", attempt}}, std::nullopt);
    tx.commit();
    return attempt;
  });
}

void journal::finish_run(std::string_view id, run_status status, const json& output,
                         const std::optional<protocol::error_info>& error) {
  if (pg_) return pg_->finish_run(id, status, output, error);
  check_finish(status, error);
  impl_->guard(id, [&] {
    const bool ok = status == run_status::completed;
    const auto now = now_ms();
    impl::write_txn tx(*impl_);
    impl_->fence(id);
    auto [out, message, type] = outcome_columns(ok, output, ok ? protocol::error_info{} : *error);
    impl_->require_run(
        impl_->changed("UPDATE runs SET status = ?, output = ?, error_message = ?, error_type = ?, "
                       "owner = '', finished_at_ms = ?, updated_at_ms = ?, wait_kind = NULL, "
                       "wait_key = NULL, wait_seq = NULL, wake_at_ms = NULL WHERE id = ?",
                       to_string(status), out, message, type,
                       status == run_status::in_doubt ? std::optional<std::int64_t>() : std::optional(now), now, id),
        id);
    impl_->event(id, finish_event_kind(status), ok ? json::object() : error_data(*message, *type), std::nullopt);
    tx.commit();
    impl_->held.end(id);
  });
}

void journal::reset_attempts(std::string_view id) {
  if (pg_) return pg_->reset_attempts(id);
  impl_->guard(id, [&] {
    impl::write_txn tx(*impl_);
    impl_->fence(id);
    auto before = impl_->statement("SELECT status, attempts FROM runs WHERE id = ?", id);
    impl_->require_run(before.executeStep() ? 1 : 0, id);
    json data = {{"status", before.getColumn(0).getString()}, {"attempts", before.getColumn(1).getInt()}};
    impl_->changed(
        "UPDATE runs SET status = 'pending', attempts = 0, output = NULL, error_message = NULL, "
        "error_type = NULL, finished_at_ms = NULL, owner = '', wait_kind = NULL, wait_key = NULL, "
        "wait_seq = NULL, wake_at_ms = NULL, cancel_requested_at_ms = NULL, updated_at_ms = ? WHERE id = ?",
        now_ms(), id);
    impl_->event(id, "run_reset", data, std::nullopt);
    tx.commit();
    impl_->held.end(id);
  });
}

void journal::suspend_run(std::string_view id, const wait_spec& w) {
  if (pg_) return pg_->suspend_run(id, w);
  check_wait(w);
  const auto seq = static_cast<std::int64_t>(w.seq);
  impl_->guard(id, [&] {
    impl::write_txn tx(*impl_);
    impl_->fence(id);
    if (impl_->changed(
            "UPDATE runs SET status = 'waiting', owner = '', wait_kind = ?, wait_key = ?, wait_seq = ?, "
            "wake_at_ms = ?, updated_at_ms = ? WHERE id = ? AND status NOT IN ('completed', 'failed', 'cancelled')",
            w.kind, w.key, seq, w.wake_at_ms, now_ms(), id) == 0)
      impl_->throw_finished_or_missing(id, "make it wait");
    impl_->event(id, "run_waiting", wait_event_data(w), seq);
    tx.commit();
    impl_->held.end(id);
  });
}

void journal::release_run(std::string_view id, std::string_view reason) {
  if (pg_) return pg_->release_run(id, reason);
  impl_->guard(id, [&] {
    impl::write_txn tx(*impl_);
    impl_->fence(id);
    if (impl_->changed("UPDATE runs SET status = 'pending', owner = '', updated_at_ms = ?, wait_kind = NULL, "
                       "wait_key = NULL, wait_seq = NULL, wake_at_ms = NULL "
                       "WHERE id = ? AND status NOT IN ('completed', 'failed', 'cancelled')",
                       now_ms(), id) == 0)
      impl_->throw_finished_or_missing(id, "release it");
    impl_->event(id, "run_released", {{"reason", reason}}, std::nullopt);
    tx.commit();
    impl_->held.end(id);
  });
}

bool journal::request_cancel(std::string_view id, std::string_view reason) {
  if (pg_) return pg_->request_cancel(id, reason);
  return impl_->guard(id, [&] {
    impl::write_txn tx(*impl_);
    if (is_finished(impl_->status_of(id))) return false;
    const auto now = now_ms();
    if (impl_->changed("UPDATE runs SET cancel_requested_at_ms = ?, updated_at_ms = ? "
                       "WHERE id = ? AND cancel_requested_at_ms IS NULL",
                       now, now, id) == 1) {
      impl_->event(id, "cancel_requested", {{"reason", reason}}, std::nullopt);
      tx.commit();
    }
    return true;
  });
}

bool journal::cancel_idle_run(std::string_view id, const std::string& message) {
  if (pg_) return pg_->cancel_idle_run(id, message);
  return impl_->guard(id, [&] {
    impl::write_txn tx(*impl_);
    const auto now = now_ms();
    if (impl_->changed("UPDATE runs SET status = 'cancelled', error_message = ?, error_type = 'cancelled', "
                       "finished_at_ms = ?, updated_at_ms = ?, wait_kind = NULL, wait_key = NULL, wait_seq = NULL, "
                       "wake_at_ms = NULL WHERE id = ? AND status IN ('pending', 'waiting') AND owner = ''",
                       message, now, now, id) == 0) {
      impl_->status_of(id);  // not_found if there is no such run
      return false;
    }
    impl_->event(id, "run_cancelled", error_data(message, "cancelled"), std::nullopt);
    tx.commit();
    return true;
  });
}

std::vector<run_brief> journal::schedulable(std::int64_t now) {
  if (pg_) return pg_->schedulable(now);
  return impl_->guard({}, [&] {
    // Finished runs cost nothing. Each waiting run costs one entry of the
    // runs_waiting index, plus one probe of signals_undelivered or of the runs
    // key if it waits for a signal or a child (about 1 ms per 1,000 of those).
    // INDEXED BY pins the plan: after an ANALYZE, SQLite would otherwise scan
    // every run, since most runs share a few finished statuses.
    auto s = impl_->statement(
        "SELECT id, status, owner, parent_id, workspace_host, created_at_ms, rowid AS row FROM runs "
        "  INDEXED BY runs_by_wake WHERE status IN ('pending', 'running') "
        "UNION ALL "
        "SELECT id, status, owner, parent_id, workspace_host, created_at_ms, rowid FROM runs AS r "
        "  INDEXED BY runs_waiting WHERE status = 'waiting' AND ("
        "  wake_at_ms <= ?1 OR deadline_ms <= ?1 OR cancel_requested_at_ms IS NOT NULL "
        "  OR (wait_kind = 'signal' AND EXISTS (SELECT 1 FROM signals AS s WHERE s.run_id = r.id "
        "      AND s.name = r.wait_key AND s.delivered_seq IS NULL)) "
        "  OR (wait_kind = 'child' AND EXISTS (SELECT 1 FROM runs AS c WHERE c.id = r.wait_key "
        "      AND c.status IN ('completed', 'failed', 'cancelled')))) "
        "ORDER BY created_at_ms, row",
        now);
    std::vector<run_brief> runs;
    while (s.executeStep()) {
      run_brief b;
      b.id = s.getColumn(0).getString();
      b.status = *parse_run_status(s.getColumn(1).getString());  // one of the three above
      b.owner = s.getColumn(2).getString();
      if (!s.getColumn(3).isNull()) b.parent_id = s.getColumn(3).getString();
      b.workspace_host = s.getColumn(4).getString();
      runs.push_back(std::move(b));
    }
    return runs;
  });
}

std::optional<std::int64_t> journal::next_due_ms(std::int64_t after) {
  if (pg_) return pg_->next_due_ms(after);
  return impl_->guard({}, [&]() -> std::optional<std::int64_t> {
    // The first is a seek in runs_by_wake; the second scans runs_waiting,
    // which holds only the waiting runs and is covering.
    auto s = impl_->statement(
        "SELECT min(t) FROM ("
        "  SELECT min(wake_at_ms) AS t FROM runs INDEXED BY runs_by_wake "
        "    WHERE status = 'waiting' AND wake_at_ms > ?1 "
        "  UNION ALL "
        "  SELECT min(deadline_ms) FROM runs INDEXED BY runs_waiting "
        "    WHERE status = 'waiting' AND deadline_ms > ?1)",
        after);
    if (!s.executeStep() || s.getColumn(0).isNull()) return std::nullopt;
    return s.getColumn(0).getInt64();
  });
}

std::map<run_status, int> journal::count_by_status() {
  if (pg_) return pg_->count_by_status();
  return impl_->guard({}, [&] {
    std::map<run_status, int> counts;
    using enum run_status;
    for (auto st : {pending, running, waiting, completed, failed, cancelled, in_doubt}) counts[st] = 0;
    auto s = impl_->statement("SELECT status, count(*) FROM runs GROUP BY status");
    while (s.executeStep()) {
      auto status = parse_run_status(s.getColumn(0).getString());
      if (!status)
        throw storage_error(errc::corrupt, fmt::format("journal {} has a run with an unknown status '{}'",
                                                       impl_->path.string(), s.getColumn(0).getString()));
      counts[*status] = s.getColumn(1).getInt();
    }
    return counts;
  });
}

signal_record journal::enqueue_signal(std::string_view run_id, std::string_view name, const json& payload,
                                     std::uint64_t max_signals) {
  if (pg_) return pg_->enqueue_signal(run_id, name, payload, max_signals);
  return impl_->guard(run_id, [&] {
    impl::write_txn tx(*impl_);
    const auto status = impl_->status_of(run_id);
    if (is_finished(status))
      throw storage_error(errc::finished, fmt::format("run {} already finished ({}); nobody will read signal '{}'",
                                                      run_id, to_string(status), name));
    // Counted under the write lock: concurrent senders cannot overshoot.
    auto held = impl_->statement("SELECT count(*) FROM signals WHERE run_id = ?", run_id);
    held.executeStep();
    if (static_cast<std::uint64_t>(held.getColumn(0).getInt64()) >= max_signals)
      throw signal_limit_error(run_id, held.getColumn(0).getInt64(), name);
    signal_record r{0, std::string(run_id), std::string(name), payload, now_ms(), std::nullopt, std::nullopt};
    impl_->changed("INSERT INTO signals (run_id, name, payload, sent_at_ms) VALUES (?, ?, ?, ?)", run_id, name,
                   dump(payload), r.sent_at_ms);
    r.id = impl_->db.getLastInsertRowid();
    impl_->event(run_id, "signal_queued", {{"name", name}, {"signal_id", r.id}}, std::nullopt);
    tx.commit();
    return r;
  });
}

bool journal::has_pending_signal(std::string_view run_id, std::string_view name) {
  if (pg_) return pg_->has_pending_signal(run_id, name);
  return impl_->guard(run_id, [&] {
    auto s = impl_->statement("SELECT 1 FROM signals WHERE run_id = ? AND name = ? AND delivered_seq IS NULL LIMIT 1",
                              run_id, name);
    return s.executeStep();
  });
}

std::optional<signal_record> journal::pending_signal(std::string_view run_id, std::string_view name) {
  if (pg_) return pg_->pending_signal(run_id, name);
  return impl_->guard(run_id, [&]() -> std::optional<signal_record> {
    auto s = impl_->statement(
        (signal_select + "WHERE run_id = ? AND name = ? AND delivered_seq IS NULL ORDER BY id LIMIT 1").c_str(), run_id,
        name);
    if (!s.executeStep()) return std::nullopt;
    return read_signal(sqlite_row{s});
  });
}

void journal::deliver_signal(std::int64_t signal_id, const step_record& step) {
  if (pg_) return pg_->deliver_signal(signal_id, step);
  const auto seq = static_cast<std::int64_t>(step.result.seq);
  impl_->guard(step.run_id, [&] {
    // The check and both writes share one write transaction: two hosts racing
    // to deliver the same signal cannot both succeed.
    impl::write_txn tx(*impl_);
    impl_->fence(step.run_id);
    std::string name;
    {
      auto s = impl_->statement("SELECT run_id, name, delivered_seq FROM signals WHERE id = ?", signal_id);
      if (!s.executeStep())
        throw storage_error(errc::not_found,
                            fmt::format("no signal {} in journal {}", signal_id, impl_->path.string()));
      if (s.getColumn(0).getString() != step.run_id)
        throw std::invalid_argument(fmt::format("deliver_signal: signal {} belongs to run {}, not {}", signal_id,
                                                s.getColumn(0).getString(), step.run_id));
      name = s.getColumn(1).getString();
      if (!s.getColumn(2).isNull())
        throw signal_delivered_error(signal_id, name, step.run_id, s.getColumn(2).getInt64());
    }
    impl_->changed("UPDATE signals SET delivered_seq = ?, delivered_at_ms = ? WHERE id = ?", seq, now_ms(), signal_id);
    impl_->insert_step(step);
    impl_->event(step.run_id, "signal_delivered", {{"name", name}, {"signal_id", signal_id}}, seq);
    tx.commit();
  });
}

std::vector<signal_record> journal::signals(std::string_view run_id) {
  if (pg_) return pg_->signals(run_id);
  return impl_->guard(run_id, [&] {
    auto s = impl_->statement((signal_select + "WHERE run_id = ? ORDER BY id").c_str(), run_id);
    std::vector<signal_record> out;
    while (s.executeStep()) out.push_back(read_signal(sqlite_row{s}));
    return out;
  });
}

void journal::append_step(const step_record& step) {
  if (pg_) return pg_->append_step(step);
  // Durable when it returns.
  impl_->guard(step.run_id, [&] { impl_->fenced(step.run_id, [&] { impl_->insert_step(step); }); });
}

std::vector<step_record> journal::steps(std::string_view run_id) {
  if (pg_) return pg_->steps(run_id);
  return impl_->guard(run_id, [&] {
    auto s = impl_->statement((step_select + "WHERE run_id = ? ORDER BY seq").c_str(), run_id);
    std::vector<step_record> steps;
    while (s.executeStep()) steps.push_back(read_step(sqlite_row{s}, run_id));
    return steps;
  });
}

std::vector<step_record> journal::steps_from(std::string_view run_id, std::uint64_t from_seq, std::uint64_t end_seq,
                                             std::uint64_t max_bytes) {
  if (pg_) return pg_->steps_from(run_id, from_seq, end_seq, max_bytes);
  return impl_->guard(run_id, [&] {
    auto s = impl_->statement((step_select + "WHERE run_id = ? AND seq >= ? AND seq < ? ORDER BY seq").c_str(), run_id,
                              static_cast<std::int64_t>(std::min<std::uint64_t>(from_seq, INT64_MAX)),
                              static_cast<std::int64_t>(std::min<std::uint64_t>(end_seq, INT64_MAX)));
    std::vector<step_record> steps;
    std::uint64_t bytes = 0;
    while (s.executeStep()) {
      // The stored text's size, before parsing: a step that would overrun the budget is not loaded.
      bytes += static_cast<std::uint64_t>(s.getColumn(1).getBytes() + s.getColumn(4).getBytes() +
                                          s.getColumn(5).getBytes() + s.getColumn(6).getBytes());
      if (!steps.empty() && bytes > max_bytes) break;
      steps.push_back(read_step(sqlite_row{s}, run_id));
    }
    return steps;
  });
}

void journal::append_event(std::string_view run_id, std::string_view kind, const json& data,
                           std::optional<std::uint64_t> seq) {
  if (pg_) return pg_->append_event(run_id, kind, data, seq);
  std::optional<std::int64_t> s;
  if (seq) s = static_cast<std::int64_t>(*seq);
  impl_->guard(run_id, [&] { impl_->fenced(run_id, [&] { impl_->event(run_id, kind, data, s); }); });
}

std::vector<event_record> journal::events(std::string_view run_id) {
  if (pg_) return pg_->events(run_id);
  return impl_->guard(run_id, [&] {
    auto s = impl_->statement((event_select + "WHERE run_id = ? ORDER BY id").c_str(), run_id);
    return read_events(s, run_id, impl_->payloads_of(run_id));
  });
}

std::vector<event_record> journal::events_at(std::string_view run_id, std::uint64_t seq) {
  if (pg_) return pg_->events_at(run_id, seq);
  return impl_->guard(run_id, [&] {
    auto s = impl_->statement((event_select + "WHERE run_id = ? AND seq = ? ORDER BY id").c_str(), run_id,
                              static_cast<std::int64_t>(seq));
    return read_events(s, run_id, impl_->payloads_of(run_id));
  });
}

std::uint64_t journal::step_count(std::string_view run_id) {
  if (pg_) return pg_->step_count(run_id);
  return impl_->guard(run_id, [&] {
    auto s = impl_->statement("SELECT count(*) FROM steps WHERE run_id = ?", run_id);
    s.executeStep();
    return static_cast<std::uint64_t>(s.getColumn(0).getInt64());
  });
}

std::uint64_t journal::bytes_of_run(std::string_view run_id) {
  if (pg_) return pg_->bytes_of_run(run_id);
  return impl_->guard(run_id, [&] {
    // CAST AS BLOB: length() of a text counts characters, the budget counts bytes.
    auto s = impl_->statement(
        "SELECT (SELECT coalesce(sum(length(CAST(name AS BLOB)) + coalesce(length(CAST(output AS BLOB)), 0) "
        "  + coalesce(length(CAST(error_message AS BLOB)), 0) + coalesce(length(CAST(error_type AS BLOB)), 0)), 0) "
        "  FROM steps WHERE run_id = ?1) + "
        "(SELECT coalesce(sum(length(CAST(kind AS BLOB)) + length(CAST(data AS BLOB))), 0) "
        "  FROM events WHERE run_id = ?1) + "
        "(SELECT coalesce(sum(length(digest) + length(CAST(body AS BLOB))), 0) "
        "  FROM payloads WHERE run_id = ?1)",
        run_id);
    s.executeStep();
    return static_cast<std::uint64_t>(s.getColumn(0).getInt64());
  });
}

// --- Workspaces assigned at first execution, workers and their leases (schema 6) ---

void journal::assign_workspace(std::string_view id, const std::string& workspace, const std::string& workspace_host) {
  if (pg_) return pg_->assign_workspace(id, workspace, workspace_host);
  impl_->guard(id, [&] {
    impl::write_txn tx(*impl_);
    impl_->fence(id);
    if (impl_->changed(
            "UPDATE runs SET workspace = ?, workspace_host = ?, updated_at_ms = ? WHERE id = ? AND workspace = ''",
            workspace, workspace_host, now_ms(), id) == 0) {
      impl_->status_of(id);  // not_found if there is no such run
      throw workspace_set_error(id, impl_->path.string());
    }
    tx.commit();
  });
}

namespace {

// The columns read_worker reads; `runs` counts the runs the worker owns.
constexpr const char* worker_columns =
    "SELECT w.id, w.host, w.workspace_root, w.started_at_ms, w.renewed_at_ms, w.lease_expires_at_ms, "
    "w.fenced_writes, (SELECT count(*) FROM runs WHERE owner = w.id AND owner <> '') FROM workers AS w ";

worker_record read_worker(SQLite::Statement& s) {
  worker_record w;
  w.id = s.getColumn(0).getString();
  w.host = s.getColumn(1).getString();
  w.workspace_root = s.getColumn(2).getString();
  w.started_at_ms = s.getColumn(3).getInt64();
  w.renewed_at_ms = s.getColumn(4).getInt64();
  w.lease_expires_at_ms = s.getColumn(5).getInt64();
  w.fenced_writes = s.getColumn(6).getInt64();
  w.runs = s.getColumn(7).getInt();
  return w;
}

}  // namespace

void journal::register_worker(const worker_record& w) {
  if (pg_) return pg_->register_worker(w);
  impl_->guard({}, [&] {
    impl::write_txn tx(*impl_);
    impl_->changed(
        "INSERT OR REPLACE INTO workers (id, host, workspace_root, started_at_ms, renewed_at_ms, "
        "lease_expires_at_ms, fenced_writes) VALUES (?, ?, ?, ?, ?, ?, ?)",
        w.id, w.host, w.workspace_root, w.started_at_ms, w.renewed_at_ms, w.lease_expires_at_ms, w.fenced_writes);
    impl_->changed(detail::forget_workers_sql, now_ms() - forgotten_worker_ms);
    tx.commit();
  });
}

bool journal::renew_lease(std::string_view worker_id, std::int64_t lease_expires_at_ms, std::int64_t fenced_writes) {
  if (pg_) return pg_->renew_lease(worker_id, lease_expires_at_ms, fenced_writes);
  return impl_->guard({}, [&] {
    // One statement: the check of the old expiry and the renewal are atomic,
    // so a lease another worker already saw expired is never revived.
    const auto now = now_ms();
    return impl_->changed(
               "UPDATE workers SET lease_expires_at_ms = ?, renewed_at_ms = ?, fenced_writes = ? "
               "WHERE id = ? AND lease_expires_at_ms > ?",
               lease_expires_at_ms, now, fenced_writes, worker_id, now) == 1;
  });
}

void journal::remove_worker(std::string_view worker_id) {
  if (pg_) return pg_->remove_worker(worker_id);
  impl_->guard({}, [&] { impl_->changed("DELETE FROM workers WHERE id = ?", worker_id); });
}

std::vector<worker_record> journal::workers() {
  if (pg_) return pg_->workers();
  return impl_->guard({}, [&] {
    auto s = impl_->statement((std::string(worker_columns) + "ORDER BY w.started_at_ms, w.id").c_str());
    std::vector<worker_record> out;
    while (s.executeStep()) out.push_back(read_worker(s));
    return out;
  });
}

std::optional<worker_record> journal::find_worker(std::string_view worker_id) {
  if (pg_) return pg_->find_worker(worker_id);
  return impl_->guard({}, [&]() -> std::optional<worker_record> {
    auto s = impl_->statement((std::string(worker_columns) + "WHERE w.id = ?").c_str(), worker_id);
    if (!s.executeStep()) return std::nullopt;
    return read_worker(s);
  });
}

std::string_view journal::backend() const { return pg_ ? "postgresql" : "sqlite"; }

std::string journal::server_version() {
  if (pg_) return pg_->server_version();
  return fmt::format("SQLite {}", sqlite3_libversion());
}

bool is_postgres_url(std::string_view db) { return db.starts_with("postgresql://") || db.starts_with("postgres://"); }

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

// --- end of schema 6 ---

namespace {

std::vector<event_record> read_events(SQLite::Statement& s, std::string_view run_id, const payload_lookup& payload) {
  std::vector<event_record> events;
  while (s.executeStep()) events.push_back(read_event(sqlite_row{s}, run_id, payload));
  return events;
}

}  // namespace

}  // namespace cairn::storage
