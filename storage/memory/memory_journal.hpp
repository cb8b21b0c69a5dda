// The in-memory implementation of storage::journal (journal.hpp), for the
// engine's tests and the simulator (tests/sim): never linked into cairn.
// It keeps the journal's whole contract (the storage suite in tests/storage
// runs on it as on SQLite and PostgreSQL) and models what a machine keeps:
// a commit is durable only once synced. A commit with sync_mode::full
// syncs itself and every commit before it (as a synced SQLite WAL write
// does); one made with write_together's sync_later or sync_mode::normal is
// seen at once by everyone but lost by lose_power() until a later synced
// commit. A process crash loses nothing committed: drop its journal objects.
//
// Every journal object opened on one database sees the others' commits. A
// write transaction holds the database for its duration (SQLite's write
// lock); a reader waits for it. Thread-safe as SQLite is: one journal object
// per thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "storage/journal.hpp"

namespace cairn::storage::memory {

// Where a fault may be injected: as a write transaction begins, or as it
// commits (nothing of it is kept when the hook throws there).
enum class fault_point { begin, commit };

class database {
 public:
  // `name` is what path() of its journals shows; `clock` gives the times
  // the journal records and compares leases with (milliseconds since the
  // Unix epoch).
  explicit database(std::string name = "memory", std::function<std::int64_t()> clock = now_ms);
  ~database();
  database(const database&) = delete;
  database& operator=(const database&) = delete;

  // A journal object on this database (a connection). The database outlives
  // it by sharing: a journal may be kept after the database object is gone.
  std::unique_ptr<journal> open(journal_options options = {}) const;

  // A power cut: forgets every commit made since the last synced one.
  // Journal objects opened before are stale afterwards (a host that lost
  // power is gone): drop them and open new ones.
  void lose_power();

  // Called at each fault point of every write transaction; may throw
  // storage_error (locked, io, disk_full) to fail it. Empty: no faults.
  void inject_faults(std::function<void(fault_point)> hook);

  // Test-only unsafe switch: no commit ever syncs (lose_power forgets all
  // but what the database held when the switch was set).
  void never_sync(bool on);

  // How many commits lose_power() would forget now.
  std::size_t unsynced_commits() const;

  struct state;  // what its journal objects share (memory_journal.cpp)

 private:
  std::shared_ptr<state> state_;
};

}  // namespace cairn::storage::memory
