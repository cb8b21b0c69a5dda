// Where a test's journal lives, so one test runs against either backend: the
// PostgreSQL database named by CAIRN_TEST_DB_URL when it is set (the harness
// gives each test process a fresh database from tests/support/pg_cluster.hpp),
// else a SQLite file in the test's own folder. On PostgreSQL every test of a
// process shares that database: tests keep apart by the ids they use, which
// test_prefix() makes unique.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace cairn::testing {

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
