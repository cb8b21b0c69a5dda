// Where a test's journal is, so one test runs against both backends: a SQLite
// file in a fresh folder, or a fresh database of this process's PostgreSQL
// cluster (tests/support/pg_cluster.hpp: without PostgreSQL such a test
// fails, saying what to install).
#pragma once

#include <catch2/catch.hpp>
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

}  // namespace cairn::testing

// Runs the test case once per backend, with `where` the journal's location.
#define ON_EACH_BACKEND(where)                                                             \
  const std::string where##_backend = GENERATE(as<std::string>{}, "sqlite", "postgresql"); \
  INFO("backend: " << where##_backend);                                                    \
  ::cairn::testing::journal_location where(where##_backend)
