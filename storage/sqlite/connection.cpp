#include "storage/sqlite/connection.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "storage/records.hpp"
#include "storage/sqlite/schema.hpp"

namespace cairn::storage::sqlite {
namespace fs = std::filesystem;

namespace {

// Byte offsets of the WAL write, checkpoint and recovery locks in the -shm file
// (SQLite's os_unix.c: UNIX_SHM_BASE 120, one byte each).
constexpr long shm_first_exclusive_lock = 120;
constexpr long shm_last_exclusive_lock = 122;

constexpr int incremental_vacuum = 2;  // PRAGMA auto_vacuum's value for INCREMENTAL

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

}  // namespace

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
namespace {

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
  // Before the first table: a new file is made incremental from the start.
  if (fresh) db.exec("PRAGMA auto_vacuum = INCREMENTAL");
  const std::string mode = retrying_busy([&] { return db.execAndGet("PRAGMA journal_mode = WAL").getString(); });
  if (mode != "wal")
    throw storage_error(errc::io, fmt::format("journal {} cannot use WAL mode (SQLite kept '{}')", path.string(), mode));
  db.exec(sync_pragma(options));
  retrying_busy([&] { migrate(db, path); });
  retrying_busy([&] { note_writer(db); });
  // A journal made before schema 8 switches once (schema.cpp, migration 8):
  // the mode takes effect only through a VACUUM, which rewrites the file.
  retrying_busy([&] {
    if (db.execAndGet("PRAGMA auto_vacuum").getInt() == incremental_vacuum) return;
    db.exec("PRAGMA auto_vacuum = INCREMENTAL");
    db.exec("VACUUM");
  });
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
  if (version < latest_version())
    throw storage_error(errc::io, fmt::format("journal {} has schema version {}, older than this cairn's ({}); "
                                              "any writing command (`cairn run`, `cairn resume`) upgrades it",
                                              path.string(), version, latest_version()));
  return db;
}

}  // namespace

connection::connection(const fs::path& path, const journal_options& options)
    : path_(path),
      options_(options),
      db_(guard({}, [&] { return options.read_only ? open_read_only(path, options) : open_writable(path, options); })),
      busy_{options.busy_timeout, {}} {
  sqlite3_busy_handler(db_.getHandle(), &busy_wait::on_busy, &busy_);
  if (!options.read_only) sqlite3_wal_hook(db_.getHandle(), &connection::after_commit, this);
}

int connection::after_commit(void* self, sqlite3* db, const char* name, int wal_pages) {
  if (!static_cast<connection*>(self)->syncing_later_ && wal_pages >= auto_checkpoint_pages)
    sqlite3_wal_checkpoint_v2(db, name, SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr);
  return SQLITE_OK;
}

void connection::sync_later() {
  syncing_later_ = true;
  // Compiled each time: a PRAGMA takes effect when it is prepared, not
  // when a cached statement runs again.
  guard({}, [&] { db_.exec("PRAGMA synchronous = OFF"); });
}

void connection::sync_as_asked() {
  syncing_later_ = false;
  db_.exec(sync_pragma(options_));
}

}  // namespace cairn::storage::sqlite
