// The test cluster itself: the PostgreSQL tests depend on it starting as a
// normal user, surviving a restart with its data, and leaving nothing behind.
#include "tests/support/pg_cluster.hpp"

#include <libpq-fe.h>
#include <signal.h>

#include <catch2/catch.hpp>
#include <optional>
#include <string>

namespace {

std::string query_one(const std::string& url, const std::string& sql) {
  PGconn* c = PQconnectdb(url.c_str());
  REQUIRE(PQstatus(c) == CONNECTION_OK);
  PGresult* r = PQexec(c, sql.c_str());
  const auto status = PQresultStatus(r);
  std::string value = status == PGRES_TUPLES_OK && PQntuples(r) > 0 ? PQgetvalue(r, 0, 0) : "";
  const bool ok = status == PGRES_TUPLES_OK || status == PGRES_COMMAND_OK;
  PQclear(r);
  PQfinish(c);
  REQUIRE(ok);
  return value;
}

}  // namespace

TEST_CASE("a test cluster keeps committed rows across a restart and runs as a normal user") {
  std::optional<cairn::testing::pg_cluster> made;
  auto& cluster = made.emplace();
  const std::string db = cluster.fresh_database();
  query_one(db, "CREATE TABLE t (v INT); INSERT INTO t VALUES (7)");
  CHECK(query_one(db, "SELECT current_setting('fsync')") == "on");
  // The server's own user is never root.
  CHECK(query_one(db, "SELECT current_setting('data_directory')").find(cluster.folder().string()) == 0);

  cluster.stop(false);  // at once, as a crash would: recovery replays the WAL
  CHECK_FALSE(cluster.running());
  cluster.start();
  CHECK(query_one(db, "SELECT v FROM t") == "7");

  const pid_t server = cluster.server_pid();
  const auto folder = cluster.folder();
  made.reset();
  CHECK(::kill(server, 0) != 0);
  CHECK_FALSE(std::filesystem::exists(folder));
}
