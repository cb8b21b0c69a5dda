// Where a test's journal is, so one test runs against both backends: a SQLite
// file in a fresh folder, or a fresh database of this process's PostgreSQL
// cluster (tests/support/pg_cluster.hpp: without PostgreSQL such a test
// fails, saying what to install).
#pragma once

#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "tests/support/pg_cluster.hpp"
#include "tests/temp_dir.hpp"

namespace cairn::testing {

class journal_location {
 public:
  explicit journal_location(const std::string& backend)
      : path_(backend == "sqlite" ? folder_ / "cairn.db" : std::filesystem::path(shared_pg_cluster().fresh_database())) {}
  const std::filesystem::path& path() const { return path_; }
  const std::filesystem::path& folder() const { return folder_.path(); }

 private:
  temp_dir folder_;
  std::filesystem::path path_;
};

// For tests that start cairn processes: the PostgreSQL database named by
// CAIRN_TEST_DB_URL when it is set (catch_main gives the whole test process
// one fresh database when CAIRN_TEST_ON_POSTGRES=1; tests/CMakeLists.txt
// registers such runs), else a SQLite file in `dir`. On PostgreSQL the tests
// of a process share that database and keep apart by their ids.
inline std::string test_db(const std::filesystem::path& dir) {
  if (const char* url = std::getenv("CAIRN_TEST_DB_URL"); url && *url) return url;
  return (dir / "cairn.db").string();
}

// "t<pid>-<n>-": prefix the ids a test creates with it.
inline std::string test_prefix() {
  static std::atomic<int> counter{0};
  return "t" + std::to_string(getpid()) + "-" + std::to_string(counter++) + "-";
}

}  // namespace cairn::testing

// Runs the test case once per backend, with `where` the journal's location.
#define ON_EACH_BACKEND(where)                                                             \
  const std::string where##_backend = GENERATE(as<std::string>{}, "sqlite", "postgresql"); \
  INFO("backend: " << where##_backend);                                                    \
  ::cairn::testing::journal_location where(where##_backend)
