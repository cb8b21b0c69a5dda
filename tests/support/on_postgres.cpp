// CAIRN_TEST_ON_POSTGRES=1: the whole test process runs against one fresh
// database of a private PostgreSQL cluster, named to the tests (and the cairn
// processes they start) by CAIRN_TEST_DB_URL; tests/support/test_db.hpp reads
// it. Without PostgreSQL the process fails at once, saying what to install.
#include <cstdlib>
#include <exception>
#include <iostream>

#include "tests/support/pg_cluster.hpp"

namespace {

const bool database_named = [] {
  const char* wanted = std::getenv("CAIRN_TEST_ON_POSTGRES");
  if (!wanted || std::string(wanted) != "1") return false;
  try {
    setenv("CAIRN_TEST_DB_URL", cairn::testing::shared_pg_cluster().fresh_database().c_str(), 1);
  } catch (const std::exception& e) {
    std::cerr << "CAIRN_TEST_ON_POSTGRES=1 but no test cluster: " << e.what() << "\n";
    std::exit(1);
  }
  return true;
}();

}  // namespace
