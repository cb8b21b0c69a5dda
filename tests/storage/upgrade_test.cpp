// Upgrades (issue 45, item 6): a journal written by every earlier cairn
// (tests/storage/journals: real journals, each made by the cairn of its
// schema version; README.md there says how) opens in this one with every
// row it held, and its unfinished run resumes under the current `cairn`
// without redoing a journaled step; a journal newer than this cairn is
// refused, saying so; a migration that fails or is killed midway leaves the
// journal as it was, and the next open migrates it whole.
#include <catch2/catch.hpp>

#include <libpq-fe.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <map>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "storage/journal.hpp"
#include "storage/postgres/postgres_journal.hpp"
#include "storage/sqlite/sqlite_journal.hpp"
#include "tests/cairn_cli.hpp"
#include "tests/support/pg_cluster.hpp"
#include "tests/temp_dir.hpp"

using namespace cairn;
using json = nlohmann::json;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

// One journal of tests/storage/journals. Before schema 3 a run could not
// wait: those journals hold a run interrupted midway instead (its host
// SIGKILLed with steps 0 and 1 journaled), which `cairn resume` continues.
struct fixture {
  const char* file;
  const char* backend;  // "sqlite" or "postgresql"
  int version;
  bool waits;
};
constexpr fixture fixtures[] = {
    {"sqlite_v1.db", "sqlite", 1, false},        {"sqlite_v2.db", "sqlite", 2, false},
    {"sqlite_v3.db", "sqlite", 3, true},         {"sqlite_v4.db", "sqlite", 4, true},
    {"sqlite_v5.db", "sqlite", 5, true},         {"sqlite_v6.db", "sqlite", 6, true},
    {"postgres_v6.sql", "postgresql", 6, true}, {"postgres_v7.sql", "postgresql", 7, true},
    {"sqlite_v7.db", "sqlite", 7, true},         {"postgres_v8.sql", "postgresql", 8, true},
    {"sqlite_v8.db", "sqlite", 8, true},         {"postgres_v9.sql", "postgresql", 9, true},
};

fs::path fixture_path(const fixture& f) { return fs::path(JOURNALS) / f.file; }

bool on_postgres(const fixture& f) { return std::string(f.backend) == "postgresql"; }

int latest(const fixture& f) {
  return on_postgres(f) ? storage::postgres::schema_version() : storage::sqlite::schema_version();
}

using table_columns = std::map<std::string, std::vector<std::string>>;

// A connection of its own to the journal's database, beside cairn's, to see
// and change what no journal call does. Every value is read as text; NULL as
// "NULL". A query gives the first column of each row (the libpq that storage
// loads has no PQnfields).
class raw_db {
 public:
  virtual ~raw_db() = default;
  virtual std::vector<std::string> query(const std::string& sql) = 0;
  void exec(const std::string& sql) { query(sql); }
  std::string value(const std::string& sql) {
    auto r = query(sql);
    return r.empty() ? "" : r[0];
  }
  virtual int schema_version() = 0;
  // Each table of the journal and its columns, in order.
  virtual table_columns tables() = 0;
  // The journal's schema objects (tables, indexes, triggers, functions) as text.
  virtual std::vector<std::string> schema() = 0;
  // Each row of `table` (those `where` picks), its `columns` quoted and joined, sorted.
  virtual std::vector<std::string> rows_of(const std::string& table, const std::vector<std::string>& columns,
                                           const std::string& where = "true") = 0;
};

class sqlite_db : public raw_db {
 public:
  explicit sqlite_db(const fs::path& file) {
    if (sqlite3_open_v2(file.c_str(), &db_, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK)
      throw std::runtime_error("cannot open " + file.string());
    sqlite3_busy_timeout(db_, 60'000);
  }
  ~sqlite_db() override { sqlite3_close_v2(db_); }
  sqlite_db(const sqlite_db&) = delete;
  sqlite_db& operator=(const sqlite_db&) = delete;

  std::vector<std::string> query(const std::string& sql) override {
    std::vector<std::string> out;
    char* error = nullptr;
    auto add = [](void* to, int, char** values, char**) {
      static_cast<std::vector<std::string>*>(to)->emplace_back(values[0] ? values[0] : "NULL");
      return 0;
    };
    if (sqlite3_exec(db_, sql.c_str(), add, &out, &error) != SQLITE_OK) {
      std::string why = error ? error : "?";
      sqlite3_free(error);
      throw std::runtime_error(sql + ": " + why);
    }
    return out;
  }
  int schema_version() override { return std::stoi(value("PRAGMA user_version")); }
  table_columns tables() override {
    table_columns out;
    for (auto& t : query("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"))
      out[t] = query("SELECT name FROM pragma_table_info('" + t + "') ORDER BY cid");
    return out;
  }
  std::vector<std::string> schema() override {
    return query("SELECT type || ' ' || name || ': ' || coalesce(sql, '') FROM sqlite_master ORDER BY 1");
  }
  std::vector<std::string> rows_of(const std::string& table, const std::vector<std::string>& columns,
                                   const std::string& where) override {
    std::string select;
    for (const auto& c : columns) select += (select.empty() ? "" : " || ',' || ") + ("quote(" + c + ")");
    auto out = query("SELECT " + select + " FROM " + table + " WHERE " + where);
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  sqlite3* db_ = nullptr;
};

class postgres_db : public raw_db {
 public:
  explicit postgres_db(const std::string& url) : conn_(PQconnectdb(url.c_str())) {
    if (PQstatus(conn_) != CONNECTION_OK) throw std::runtime_error(PQerrorMessage(conn_));
  }
  ~postgres_db() override { PQfinish(conn_); }
  postgres_db(const postgres_db&) = delete;
  postgres_db& operator=(const postgres_db&) = delete;

  std::vector<std::string> query(const std::string& sql) override {
    std::unique_ptr<PGresult, decltype(&PQclear)> r(PQexec(conn_, sql.c_str()), &PQclear);
    const auto status = PQresultStatus(r.get());
    if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK)
      throw std::runtime_error(sql.substr(0, 200) + ": " + PQresultErrorMessage(r.get()));
    std::vector<std::string> out;
    for (int i = 0; i < PQntuples(r.get()); ++i) out.emplace_back(PQgetisnull(r.get(), i, 0) ? "NULL" : PQgetvalue(r.get(), i, 0));
    return out;
  }
  int schema_version() override { return std::stoi(value("SELECT max(version) FROM public.cairn_schema")); }
  table_columns tables() override {
    table_columns out;
    for (auto& t : query("SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"))
      out[t] = query("SELECT column_name FROM information_schema.columns WHERE table_schema = 'public' AND table_name = '" +
                     t + "' ORDER BY ordinal_position");
    return out;
  }
  std::vector<std::string> schema() override {
    std::vector<std::string> out;
    for (auto* sql : {"SELECT 'table ' || table_name || '.' || column_name || ' ' || data_type || ' ' || "
                      "coalesce(column_default, '') FROM information_schema.columns WHERE table_schema = 'public'",
                      "SELECT 'index ' || indexdef FROM pg_indexes WHERE schemaname = 'public'",
                      "SELECT 'constraint ' || conname || ' ' || pg_get_constraintdef(oid) FROM pg_constraint "
                      "WHERE connamespace = 'public'::regnamespace",
                      "SELECT 'trigger ' || tgname || ' ' || pg_get_triggerdef(oid) FROM pg_trigger WHERE NOT tgisinternal",
                      "SELECT 'function ' || p.proname || ' ' || md5(p.prosrc) FROM pg_proc p "
                      "WHERE p.pronamespace = 'public'::regnamespace"})
      for (auto& r : query(sql)) out.push_back(std::move(r));
    std::sort(out.begin(), out.end());
    return out;
  }
  std::vector<std::string> rows_of(const std::string& table, const std::vector<std::string>& columns,
                                   const std::string& where) override {
    std::string select;
    for (const auto& c : columns) select += (select.empty() ? "" : ", ") + c;
    auto out = query("SELECT ROW(" + select + ")::text FROM public." + table + " WHERE " + where);
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  PGconn* conn_;
};

// What a journal holds: its version, its schema and its rows, table by table.
struct contents {
  int version = 0;
  std::vector<std::string> schema;
  std::map<std::string, std::vector<std::string>> tables;
  bool operator==(const contents&) const = default;
};

// With `columns`, each row of those tables and columns only (a migrated
// journal's rows as they were before it), else every column of every table.
contents contents_of(raw_db& db, const table_columns* columns = nullptr) {
  contents c;
  c.version = db.schema_version();
  c.schema = db.schema();
  for (const auto& [table, cols] : columns ? *columns : db.tables()) c.tables[table] = db.rows_of(table, cols);
  return c;
}

// A journal restored from a fixture: a copy of the SQLite file in a folder
// of its own (as HOME/cairn.db, for the `cairn` runs), or the dump loaded
// into a fresh database of this process's private PostgreSQL cluster.
class restored {
 public:
  explicit restored(const fixture& f) : postgres_(on_postgres(f)) {
    fs::create_directories(home());
    if (postgres_) {
      journal_ = testing::shared_pg_cluster().fresh_database();
      postgres_db(journal_).exec(testing::slurp(fixture_path(f)));
    } else {
      journal_ = (home() / "cairn.db").string();
      fs::copy_file(fixture_path(f), journal_);
    }
  }
  const std::string& journal() const { return journal_; }
  fs::path home() const { return dir_ / "home"; }
  const fs::path& dir() const { return dir_.path(); }
  std::unique_ptr<raw_db> raw() const {
    if (postgres_) return std::make_unique<postgres_db>(journal_);
    return std::make_unique<sqlite_db>(journal_);
  }
  testing::cli_result cairn(std::vector<std::string> args) const {
    testing::cli_options o;
    o.cwd = dir_.path();
    o.env = {{"CAIRN_HOME", home().string()}, {"CAIRN_DB", journal_}, {"CAIRN_ALLOW", "sandbox-none"}};
    o.unset = {"CAIRN_CRASH_POINT"};
    return testing::run_program(CAIRN_BIN, std::move(args), dir_.path(), o);
  }

 private:
  testing::temp_dir dir_;
  bool postgres_;
  std::string journal_;
};

std::string hostname() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return name;
}

std::vector<std::string> lines_of(const fs::path& file) {
  std::vector<std::string> out;
  std::istringstream in(testing::slurp(file));
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// Each row the fixture held is still there, unchanged: every column it had
// then has the value it had then (but PostgreSQL's schema version, a row of cairn_schema).
void check_rows_kept(const contents& before, const contents& after) {
  REQUIRE(after.tables.size() == before.tables.size());
  for (const auto& [table, rows] : before.tables) {
    INFO("table " << table);
    if (table != "cairn_schema") CHECK(after.tables.at(table) == rows);
  }
}

}  // namespace

TEST_CASE("a journal of every earlier schema migrates with every row and resumes its unfinished run") {
  const auto& f = GENERATE(from_range(std::begin(fixtures), std::end(fixtures)));
  INFO("fixture " << f.file);
  restored db(f);
  auto raw = db.raw();
  REQUIRE(raw->schema_version() == f.version);
  const auto columns = raw->tables();
  const auto before = contents_of(*raw, &columns);
  const auto before_finished = raw->rows_of("runs", columns.at("runs"), "id IN ('completed', 'failed')");
  REQUIRE(before_finished.size() == 2);
  // The fixture holds what its README says, so the checks below check something.
  CHECK(before.tables.at("runs").size() == 3);
  CHECK(before.tables.at("steps").size() >= 5);
  CHECK(before.tables.at("events").size() >= 3);

  auto journal = storage::open_journal(db.journal());
  CHECK(journal->schema_version() == latest(f));
  CHECK(raw->schema_version() == latest(f));
  check_rows_kept(before, contents_of(*raw, &columns));

  // The runs, read through the journal as cairn reads them.
  const auto completed = journal->find_run("completed");
  REQUIRE(completed);
  CHECK(completed->status == storage::run_status::completed);
  const auto completed_steps = journal->steps("completed");
  REQUIRE(completed_steps.size() == 3);
  for (std::size_t i = 0; i < completed_steps.size(); ++i) {
    CHECK(completed_steps[i].result.name == "step " + std::to_string(i));
    CHECK(completed_steps[i].result.ok);
  }
  CHECK_FALSE(journal->events("completed").empty());
  const auto failed = journal->find_run("failed");
  REQUIRE(failed);
  CHECK(failed->status == storage::run_status::failed);
  REQUIRE(failed->error);
  CHECK_THAT(failed->error->message, Catch::Contains("step 1 cannot succeed"));
  const auto failed_steps = journal->steps("failed");
  REQUIRE(failed_steps.size() == 2);
  CHECK(failed_steps[0].result.ok);
  CHECK_FALSE(failed_steps[1].result.ok);
  CHECK(failed_steps[1].result.error.message == "step 1 cannot succeed");
  CHECK_FALSE(journal->events("failed").empty());
  // From SQLite's schema 7 and PostgreSQL's 8 on, a journal says which cairn made it.
  const bool says_who = f.version >= (on_postgres(f) ? 8 : 7);
  CHECK(journal->versions().created_by ==
        (says_who ? std::string("cairn/0.1.0") : fmt::format("a cairn before 0.1.0 (schema {})", f.version)));

  const std::string unfinished = f.waits ? "waiting" : "interrupted";
  const auto run = journal->find_run(unfinished);
  REQUIRE(run);
  const auto old_steps = journal->steps(unfinished);
  if (f.waits) {
    CHECK(run->status == storage::run_status::waiting);
    REQUIRE(run->wait);
    CHECK(run->wait->kind == "signal");
    CHECK(run->wait->key == "go");
    REQUIRE(old_steps.size() == 1);
    CHECK(old_steps[0].result.name == "a");
  } else {
    CHECK(run->status == storage::run_status::running);
    REQUIRE(old_steps.size() == 2);
  }
  journal.reset();

  // The journal moved to this machine with its workspaces: its unfinished
  // run's agent is the same test agent built now (the old build is gone),
  // its workspace a folder here (empty: the fixtures keep no files), and
  // (schemas 1 and 2) the host process that owned it, dead, is named as one
  // of this host (HOST:BOOT_ID:PID:START_TICKS: another boot, or the pid
  // gone), as `cairn resume` would find it on the machine where it died.
  const std::string agent = f.waits ? WAIT_AGENT : STEP_AGENT;
  const auto workspace = db.home() / "workspaces" / unfinished;
  fs::create_directories(workspace);
  raw->exec(fmt::format("UPDATE runs SET agent = '{}', workspace = '{}' WHERE id = '{}'", agent, workspace.string(),
                        unfinished));
  if (run->workspace_host != "")
    raw->exec(fmt::format("UPDATE runs SET workspace_host = '{}' WHERE id = '{}'", hostname(), unfinished));
  if (!f.waits) {
    const auto colon = run->owner.find(':');
    REQUIRE(colon != std::string::npos);
    raw->exec(fmt::format("UPDATE runs SET owner = '{}{}' WHERE id = '{}'", hostname(), run->owner.substr(colon),
                          unfinished));
  }

  if (f.waits) {
    auto signalled = db.cairn({"signal", unfinished, "go", "--data", R"({"ok":true})"});
    INFO(signalled.out << signalled.err);
    REQUIRE(signalled.code == 0);
  }
  auto resumed = db.cairn({"resume", unfinished});
  INFO(resumed.out << resumed.err);
  REQUIRE(resumed.code == 0);

  journal = storage::open_journal(db.journal());
  const auto done = journal->find_run(unfinished);
  REQUIRE(done);
  CHECK(done->status == storage::run_status::completed);
  const auto steps = journal->steps(unfinished);
  // The journaled steps were replayed, not run again: exec.log has the new ones only.
  const auto executed = lines_of(workspace / "exec.log");
  if (f.waits) {
    REQUIRE(steps.size() == 3);
    CHECK(steps[1].result.output.value("payload", json()) == json{{"ok", true}});
    CHECK(steps[2].result.name == "b");
    CHECK(done->output == json::array({"a", json{{"signal", json{{"ok", true}}}}, "b"}));
    CHECK(executed == std::vector<std::string>{"step b"});
  } else {
    REQUIRE(steps.size() == 4);
    REQUIRE(executed.size() == 2);
    CHECK(executed[0].rfind("2 ", 0) == 0);
    CHECK(executed[1].rfind("3 ", 0) == 0);
  }
  for (std::size_t i = 0; i < old_steps.size(); ++i) {
    CHECK(steps[i].result.name == old_steps[i].result.name);
    CHECK(steps[i].result.output == old_steps[i].result.output);
    CHECK(steps[i].finished_at_ms == old_steps[i].finished_at_ms);
  }
  // And the rest of the journal is as it was: every row of the append-only
  // tables still there, the finished runs' rows unchanged.
  const auto after = contents_of(*raw, &columns);
  for (const auto& [table, rows] : before.tables) {
    INFO("table " << table);
    // The resumed run changed (its row and its kept state); leases come and go; the schema version was checked.
    if (table == "runs" || table == "run_states" || table == "workers" || table == "cairn_schema") continue;
    const auto& now = after.tables.at(table);
    for (const auto& row : rows) CHECK(std::find(now.begin(), now.end(), row) != now.end());
  }
  CHECK(raw->rows_of("runs", columns.at("runs"), "id IN ('completed', 'failed')") == before_finished);
}

TEST_CASE("a journal newer than this cairn is refused, naming both versions and the fix, and left as it was") {
  const auto& f = GENERATE(fixtures[5], fixtures[7]);  // the last earlier schema of each backend
  INFO("fixture " << f.file);
  restored db(f);
  storage::open_journal(db.journal());
  auto raw = db.raw();
  const int newer = latest(f) + 1;
  raw->exec(on_postgres(f) ? fmt::format("UPDATE cairn_schema SET version = {}", newer)
                           : fmt::format("PRAGMA user_version = {}", newer));
  const auto before = contents_of(*raw);
  const auto message = fmt::format("journal {} has schema version {}, newer than this cairn knows ({}); upgrade cairn "
                                   "to open it",
                                   db.journal(), newer, latest(f));
  try {
    storage::open_journal(db.journal());
    FAIL("a journal of schema " << newer << " was opened");
  } catch (const storage::storage_error& e) {
    CHECK(e.code() == storage::errc::schema_too_new);
    CHECK(std::string(e.what()) == message);
  }
  // The CLI, reading and writing, says the same and stops.
  for (std::vector<std::string> args : {std::vector<std::string>{"ls"}, {"resume", "--all"}}) {
    auto r = db.cairn(args);
    INFO("cairn " << args[0] << ": " << r.out << r.err);
    CHECK(r.code != 0);
    CHECK_THAT(r.err, Catch::Contains(message));
  }
  CHECK(contents_of(*raw) == before);
}

namespace {

// Test seams for a child process that is to die in the middle of a
// migration: SIGKILL (as an OOM kill or a power cut stops it) at the n-th
// SQL statement any SQLite connection of the process starts, or at its n-th
// write to any file (the WAL frames of the commit).
int kill_at_statement = 0, kill_at_write = 0;
int statements = 0, writes = 0;

int count_statement(unsigned, void*, void*, void*) {
  if (++statements == kill_at_statement) raise(SIGKILL);
  return 0;
}

int trace_statements(sqlite3* db, char**, const sqlite3_api_routines*) {
  sqlite3_trace_v2(db, SQLITE_TRACE_STMT, count_statement, nullptr);
  return SQLITE_OK;
}

sqlite3_vfs* real_vfs = nullptr;
sqlite3_vfs killing_vfs;
// The unix VFS's method tables (one per locking style) and ours, the same but for xWrite.
struct method_tables {
  const sqlite3_io_methods* real;
  sqlite3_io_methods counted;
};
std::array<method_tables, 8> tables;
std::size_t table_count = 0;

int counted_write(sqlite3_file* file, const void* data, int n, sqlite3_int64 offset) {
  if (++writes == kill_at_write) raise(SIGKILL);
  for (std::size_t i = 0; i < table_count; ++i)
    if (file->pMethods == &tables[i].counted) return tables[i].real->xWrite(file, data, n, offset);
  abort();
}

// The default VFS's files, with their writes counted: each file is the real
// one, only its method table is ours.
int open_counted(sqlite3_vfs*, const char* name, sqlite3_file* file, int flags, int* out_flags) {
  const int rc = real_vfs->xOpen(real_vfs, name, file, flags, out_flags);
  if (rc != SQLITE_OK || !file->pMethods) return rc;
  std::size_t i = 0;
  while (i < table_count && tables[i].real != file->pMethods) ++i;
  if (i == table_count) {
    if (table_count == tables.size()) abort();
    tables[table_count++] = {file->pMethods, *file->pMethods};
    tables[i].counted.xWrite = counted_write;
  }
  file->pMethods = &tables[i].counted;
  return rc;
}

// How the child ended: true when the seam killed it, false when it opened
// the journal and exited. Fails the test on any other end.
bool open_and_die_at(const std::string& journal, int statement, int write) {
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    kill_at_statement = statement;
    kill_at_write = write;
    sqlite3_auto_extension(reinterpret_cast<void (*)()>(trace_statements));
    real_vfs = sqlite3_vfs_find(nullptr);
    killing_vfs = *real_vfs;
    killing_vfs.zName = "killing";
    killing_vfs.xOpen = open_counted;
    sqlite3_vfs_register(&killing_vfs, 1);
    try {
      storage::open_journal(journal);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
      _exit(1);
    }
    _exit(0);
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) return true;
  REQUIRE((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  return false;
}

}  // namespace

TEST_CASE("sqlite: a migration killed at any statement or write leaves the old journal or the migrated one, whole") {
  const auto& f = GENERATE(fixtures[0], fixtures[5]);  // the longest migration and the last
  const auto& mode = GENERATE(as<std::string>{}, "statement", "write");
  INFO("fixture " << f.file << ", killed at each " << mode);
  restored reference(f);
  const auto old = contents_of(*reference.raw());
  storage::open_journal(reference.journal());
  const auto migrated = contents_of(*reference.raw());
  REQUIRE(migrated.version == latest(f));
  // Migrated, killed before the open's next transaction noted this cairn as the last writer.
  auto unnoted = migrated;
  auto& info = unnoted.tables.at("journal_info");
  REQUIRE(std::erase_if(info, [](const std::string& row) { return row.find("'last_written_by'") == 0; }) == 1);

  int killed_old = 0, killed_migrated = 0;
  for (int n = 1;; ++n) {
    INFO("killed at " << mode << " " << n);
    REQUIRE(n < 10'000);
    restored db(f);
    const bool killed = open_and_die_at(db.journal(), mode == "statement" ? n : 0, mode == "write" ? n : 0);
    const auto now = contents_of(*db.raw());
    if (now.version == f.version) {
      CHECK(now == old);
      REQUIRE(killed);
      ++killed_old;
    } else {
      CHECK((now == migrated || now == unnoted));
    }
    if (!killed) break;
    if (now.version != f.version) ++killed_migrated;
    // Opened again, it migrates whole.
    storage::open_journal(db.journal());
    CHECK(contents_of(*db.raw()) == migrated);
  }
  // The seam did kill it in the middle: at every statement of the migration's
  // transaction, or at every write of its commit.
  CHECK(killed_old >= (mode == "statement" ? 3 * (latest(f) - f.version) : 2));
  UNSCOPED_INFO("killed " << killed_old << " times before the commit, " << killed_migrated << " after");
}

TEST_CASE("a migration whose statement fails midway leaves the journal as it was; the next open migrates it") {
  // A table the last migration creates is there already (a stray one): the
  // earlier migrations of the chain ran in the transaction before it failed.
  const auto& f = GENERATE(fixtures[0], fixtures[4], fixtures[6]);
  INFO("fixture " << f.file);
  restored db(f);
  auto raw = db.raw();
  raw->exec("CREATE TABLE run_states (stray INTEGER)");
  const auto before = contents_of(*raw);
  try {
    storage::open_journal(db.journal());
    FAIL("a migration that could not create run_states succeeded");
  } catch (const storage::storage_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("run_states") && Catch::Contains("already exists"));
  }
  CHECK(contents_of(*raw) == before);
  raw->exec("DROP TABLE run_states");
  auto j = storage::open_journal(db.journal());
  CHECK(raw->schema_version() == latest(f));
  CHECK(j->list_runs().size() == 3);
}

TEST_CASE("postgres: a migration whose process is killed midway leaves the journal as it was") {
  const auto& f = GENERATE(fixtures[6], fixtures[7]);
  INFO("fixture " << f.file);
  restored db(f);
  auto raw = db.raw();
  const auto before = contents_of(*raw);
  // The last migration reads payloads to count each run's bytes; held here,
  // it waits there, in the middle of its transaction, until this lets go.
  postgres_db holder(db.journal());
  holder.exec("BEGIN; LOCK TABLE payloads IN ACCESS EXCLUSIVE MODE");
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    try {
      storage::open_journal(db.journal());
    } catch (...) {
      _exit(1);
    }
    _exit(0);
  }
  std::string backend;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (backend.empty() && std::chrono::steady_clock::now() < deadline) {
    backend = raw->value("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                         "AND wait_event_type = 'Lock' AND query LIKE '%CREATE TABLE run_states%'");
    if (backend.empty()) std::this_thread::sleep_for(10ms);
  }
  REQUIRE_FALSE(backend.empty());
  kill(child, SIGKILL);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  holder.exec("COMMIT");
  // The server ends the dead client's session once its statement can go on.
  const auto gone = std::chrono::steady_clock::now() + 60s;
  while (raw->value("SELECT count(*) FROM pg_stat_activity WHERE pid = " + backend) != "0") {
    REQUIRE(std::chrono::steady_clock::now() < gone);
    std::this_thread::sleep_for(10ms);
  }
  CHECK(contents_of(*raw) == before);
  auto j = storage::open_journal(db.journal());
  CHECK(raw->schema_version() == latest(f));
  CHECK(j->list_runs().size() == 3);
}
