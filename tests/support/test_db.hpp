// Where a test's journal is, so one test runs against every implementation:
// a SQLite file in a fresh folder, a fresh database of this process's
// PostgreSQL cluster (tests/support/pg_cluster.hpp: without PostgreSQL such
// a test fails, saying what to install), or a fresh in-memory database
// (storage/memory/memory_journal.hpp).
#pragma once

#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "storage/journal.hpp"
#include "storage/memory/memory_journal.hpp"
#include "tests/support/pg_cluster.hpp"
#include "tests/temp_dir.hpp"

namespace cairn::testing {

class journal_location {
 public:
  explicit journal_location(const std::string& backend)
      : path_(backend == "sqlite"   ? folder_ / "cairn.db"
              : backend == "memory" ? std::filesystem::path("memory:test")
                                    : std::filesystem::path(shared_pg_cluster().fresh_database())),
        memory_(backend == "memory" ? std::make_unique<storage::memory::database>("test") : nullptr) {}
  // What the journal's path() is: a SQLite file, a PostgreSQL URL, or
  // "memory:test" (which only open() opens).
  const std::filesystem::path& path() const { return path_; }
  const std::filesystem::path& folder() const { return folder_.path(); }
  // A journal object (a connection) on it.
  std::unique_ptr<storage::journal> open(storage::journal_options options = {}) const {
    return memory_ ? memory_->open(options) : storage::open_journal(path_, options);
  }
  // The in-memory database, or null on the other backends.
  storage::memory::database* memory() const { return memory_.get(); }

 private:
  temp_dir folder_;
  std::filesystem::path path_;
  std::unique_ptr<storage::memory::database> memory_;
};

// For tests that start cairn processes: with CAIRN_TEST_ON_POSTGRES=1
// (tests/CMakeLists.txt registers such runs) a fresh database of this
// process's PostgreSQL cluster at each call, or the one CAIRN_TEST_DB_URL
// names when it is set; otherwise a SQLite file in `dir`.
inline std::string test_db(const std::filesystem::path& dir) {
  if (const char* url = std::getenv("CAIRN_TEST_DB_URL"); url && *url) return url;
  if (const char* on = std::getenv("CAIRN_TEST_ON_POSTGRES"); on && std::string(on) == "1")
    return shared_pg_cluster().fresh_database();
  return (dir / "cairn.db").string();
}

// The journal of a test's CAIRN_HOME: HOME/cairn.db, or with
// CAIRN_TEST_ON_POSTGRES=1 a fresh PostgreSQL database, made at the first
// call for that home and named in HOME/test_db_url for the later ones. Give
// the cairn processes of the test CAIRN_DB=journal_of(HOME).
inline std::string journal_of(const std::filesystem::path& home) {
  const char* on = std::getenv("CAIRN_TEST_ON_POSTGRES");
  if (!on || std::string(on) != "1") return (home / "cairn.db").string();
  const auto named = home / "test_db_url";
  std::string url;
  if (std::ifstream(named) >> url) return url;
  url = shared_pg_cluster().fresh_database();
  std::ofstream(named) << url;
  return url;
}

// "t<pid>-<n>-": prefix the ids a test creates with it.
inline std::string test_prefix() {
  static std::atomic<int> counter{0};
  return "t" + std::to_string(getpid()) + "-" + std::to_string(counter++) + "-";
}

}  // namespace cairn::testing

// Runs the test case once per implementation of the journal, with `where`
// the journal's location.
#define ON_EACH_BACKEND(where)                                                                       \
  const std::string where##_backend = GENERATE(as<std::string>{}, "sqlite", "postgresql", "memory"); \
  INFO("backend: " << where##_backend);                                                              \
  ::cairn::testing::journal_location where(where##_backend)
