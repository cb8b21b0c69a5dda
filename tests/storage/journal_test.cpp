#include "storage/journal.hpp"
#include "storage/sqlite/sqlite_journal.hpp"
#include "storage/payloads.hpp"

#include <grp.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <random>

#include <SQLiteCpp/SQLiteCpp.h>
#include <catch2/catch.hpp>

#include "tests/capabilities.hpp"
#include "tests/storage/journal_samples.hpp"
#include "tests/support/test_db.hpp"

namespace fs = std::filesystem;
using namespace cairn;
using namespace cairn::storage;
using namespace cairn::storage::samples;
using namespace std::chrono_literals;

namespace Catch {
template <>
struct StringMaker<errc> {
  static std::string convert(errc c) {
    switch (c) {
      case errc::locked: return "locked";
      case errc::read_only: return "read_only";
      case errc::disk_full: return "disk_full";
      case errc::corrupt: return "corrupt";
      case errc::schema_too_new: return "schema_too_new";
      case errc::conflict: return "conflict";
      case errc::not_found: return "not_found";
      case errc::finished: return "finished";
      case errc::fenced: return "fenced";
      case errc::unreadable: return "unreadable";
      case errc::limit_reached: return "limit_reached";
      case errc::io: return "io";
    }
    return "?";
  }
};
}  // namespace Catch

namespace {

// A fresh folder under the system temp dir, removed with everything in it.
class temp_dir {
 public:
  temp_dir() {
    static std::atomic<int> counter{0};
    std::random_device rd;
    path_ = fs::temp_directory_path() /
            ("cairn-journal-test-" + std::to_string(getpid()) + "-" + std::to_string(counter++) + "-" +
             std::to_string(rd()));
    fs::create_directories(path_);
    fs::permissions(path_, fs::perms(0755));
  }
  ~temp_dir() {
    std::error_code ec;
    // Undo chmods so a non-root run can delete what it made read-only.
    for (auto it = fs::recursive_directory_iterator(path_, ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec))
      if (it->is_directory(ec)) fs::permissions(it->path(), fs::perms(0755), ec);
    fs::remove_all(path_, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;

  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& name) const { return path_ / name; }

 private:
  fs::path path_;
};


// A full disk: a tmpfs of `size` at `at`, unmounted at the end. Only root
// mounts one; for anyone else `mounted` is false and the test says so.
struct tiny_disk {
  fs::path at;
  bool mounted = false;
  tiny_disk(fs::path where, const std::string& size) : at(std::move(where)) {
    fs::create_directories(at);
    mounted = cairn::testing::require_capability("root",
                                                 mount("tmpfs", at.c_str(), "tmpfs", 0, ("size=" + size).c_str()) == 0,
                                                 "a full disk is a tiny tmpfs, and only root mounts one");
  }
  ~tiny_disk() {
    if (mounted) umount2(at.c_str(), MNT_DETACH);
  }
  tiny_disk(const tiny_disk&) = delete;
  tiny_disk& operator=(const tiny_disk&) = delete;
};

step_record error_step(const std::string& run, std::uint64_t seq, std::string message, std::string type) {
  step_record s = ok_step(run, seq, nullptr);
  s.result.ok = false;
  s.result.output = nullptr;
  s.result.error = {std::move(message), std::move(type)};
  return s;
}

void check_same_step(const step_record& got, const step_record& want) {
  CHECK(got.run_id == want.run_id);
  CHECK(got.result.seq == want.result.seq);
  CHECK(got.result.name == want.result.name);
  CHECK(got.result.kind == want.result.kind);
  CHECK(got.result.ok == want.result.ok);
  CHECK(got.result.output.dump() == want.result.output.dump());
  CHECK(got.result.error.message == want.result.error.message);
  CHECK(got.result.error.type == want.result.error.type);
  CHECK(got.result.attempt == want.result.attempt);
  CHECK(got.result.duration_us == want.result.duration_us);
  CHECK(got.started_at_ms == want.started_at_ms);
  CHECK(got.finished_at_ms == want.finished_at_ms);
}

std::vector<std::string> ids_of(const std::vector<run_record>& runs) {
  std::vector<std::string> ids;
  for (const auto& r : runs) ids.push_back(r.id);
  return ids;
}

wait_spec wait_for(std::string kind, std::string key, std::uint64_t seq,
                   std::optional<std::int64_t> wake_at_ms = std::nullopt) {
  return {std::move(kind), std::move(key), seq, wake_at_ms};
}

// The number of rows in a table, read past the journal API.
int rows_in(const fs::path& db, const std::string& table) {
  SQLite::Database raw(db.string(), SQLite::OPEN_READONLY);
  return raw.execAndGet("SELECT count(*) FROM " + table).getInt();
}

std::vector<std::string> event_kinds(journal& j, const std::string& run) {
  std::vector<std::string> kinds;
  for (const auto& e : j.events(run)) kinds.push_back(e.kind);
  return kinds;
}

// Runs `checks` in a child process as user nobody; returns what failed ("" when all passed).
std::string run_as_nobody(const std::function<std::string()>& checks) {
  int out[2];
  REQUIRE(pipe(out) == 0);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(out[0]);
    std::string log;
    if (setgroups(0, nullptr) != 0 || setresgid(65534, 65534, 65534) != 0 || setresuid(65534, 65534, 65534) != 0) {
      log = "cannot become nobody: " + std::string(strerror(errno));
    } else {
      try {
        log = checks();
      } catch (const std::exception& e) {
        log = std::string("unexpected exception: ") + e.what();
      }
    }
    (void)!write(out[1], log.data(), log.size());
    _exit(log.empty() ? 0 : 1);
  }
  close(out[1]);
  std::string log;
  char buf[512];
  for (ssize_t n; (n = read(out[0], buf, sizeof buf)) > 0;) log.append(buf, static_cast<std::size_t>(n));
  close(out[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (log.empty() && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) log = "the child died";
  return log;
}


// A child process holding the journal's write lock, with an uncommitted write,
// from construction until destruction; then it rolls back and exits.
class lock_holder_process {
 public:
  explicit lock_holder_process(const fs::path& db) {
    int ready[2];
    REQUIRE(pipe(ready) == 0);
    REQUIRE(pipe(go_) == 0);
    pid_ = fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      close(ready[0]);
      close(go_[1]);  // so the read below ends if the parent dies
      int rc = 1;
      try {
        SQLite::Database holder(db.string(), SQLite::OPEN_READWRITE);
        holder.exec("BEGIN EXCLUSIVE");
        holder.exec("INSERT INTO events (run_id, kind, data, at_ms) VALUES ('r', 'holder', '{}', 0)");
        (void)!write(ready[1], "x", 1);
        char c;
        (void)!read(go_[0], &c, 1);
        holder.exec("ROLLBACK");
        rc = 0;
      } catch (...) {
      }
      _exit(rc);
    }
    close(ready[1]);
    close(go_[0]);
    char c;
    const bool holding = read(ready[0], &c, 1) == 1;
    close(ready[0]);
    if (!holding) release();
    REQUIRE(holding);
  }
  ~lock_holder_process() { release(); }
  lock_holder_process(const lock_holder_process&) = delete;
  lock_holder_process& operator=(const lock_holder_process&) = delete;

  pid_t pid() const { return pid_; }

 private:
  void release() {
    if (go_[1] < 0) return;
    close(go_[1]);
    go_[1] = -1;
    waitpid(pid_, nullptr, 0);
  }

  pid_t pid_ = -1;
  int go_[2] = {-1, -1};
};

}  // namespace

TEST_CASE("run status names round-trip") {
  for (auto s : {run_status::pending, run_status::running, run_status::waiting, run_status::completed,
                 run_status::failed, run_status::cancelled, run_status::in_doubt})
    CHECK(parse_run_status(to_string(s)) == s);
  CHECK(to_string(run_status::waiting) == "waiting");
  CHECK(to_string(run_status::cancelled) == "cancelled");
  CHECK_FALSE(parse_run_status("done"));
}

TEST_CASE("a journal names its backend and the version of its database") {
  ON_EACH_BACKEND(where);
  auto j = where.open();
  CHECK(j->backend() == where_backend);
  const std::map<std::string, std::string> version_of = {
      {"sqlite", "SQLite 3."}, {"postgresql", "PostgreSQL 1"}, {"memory", "in-memory journal"}};
  CHECK_THAT(j->server_version(), Catch::StartsWith(version_of.at(where_backend)));
  CHECK(j->path() == where.path());
  // Made and last written by this cairn; a reader changes neither.
  CHECK(j->versions().created_by == writer_name());
  CHECK(j->versions().last_written_by == writer_name());
  CHECK_THAT(writer_name(), Catch::Matches(R"(cairn/\d+\.\d+\.\d+)"));
}

TEST_CASE("runs_with_workspace_near finds the workspaces a folder would nest with, by whole names") {
  ON_EACH_BACKEND(where);
  auto j = where.open();
  const std::map<std::string, std::string> workspaces = {
      {"same", "/w/a/b"}, {"inside", "/w/a/b/c"}, {"deeper", "/w/a/b/c/d"}, {"holds", "/w/a"},
      {"sibling", "/w/a/bc"}, {"other", "/w/x"}, {"prefix", "/w/a/b-2"}, {"none", ""}};
  for (const auto& [id, ws] : workspaces) {
    auto run = a_run(id);
    run.workspace = ws;
    j->create_run(run);
  }
  std::set<std::string> near;
  for (const auto& r : j->runs_with_workspace_near("/w/a/b")) near.insert(r.id);
  CHECK(near == std::set<std::string>{"same", "inside", "deeper", "holds"});
  near.clear();
  for (const auto& r : j->runs_with_workspace_near("/elsewhere")) near.insert(r.id);
  CHECK(near.empty());
}

TEST_CASE("create_run is idempotent: the id is the key") {
  ON_EACH_BACKEND(where);
  auto j = where.open();

  auto [first, created] = j->create_run(a_run("r1", {{"n", 1}}));
  CHECK(created);
  CHECK(first.id == "r1");
  CHECK(first.status == run_status::pending);
  CHECK(first.input == json{{"n", 1}});
  CHECK(first.attempts == 0);
  CHECK(first.max_attempts == 4);
  CHECK(first.owner.empty());
  CHECK(first.sandbox == "none");
  CHECK(first.workspace == "/tmp/ws-r1");
  CHECK(first.created_at_ms > 0);
  CHECK_FALSE(first.finished_at_ms);

  auto other = a_run("r1", {{"n", 2}});
  other.agent = "/somewhere/else";
  other.max_attempts = 9;
  auto [second, created_again] = j->create_run(other);
  CHECK_FALSE(created_again);
  CHECK(second.input == json{{"n", 1}});
  CHECK(second.agent == first.agent);
  CHECK(second.max_attempts == 4);
  CHECK(second.created_at_ms == first.created_at_ms);
  CHECK(j->list_runs().size() == 1);
  CHECK(j->find_run("r1")->input == json{{"n", 1}});
  CHECK_FALSE(j->find_run("nope"));
}

TEST_CASE("list_runs is newest first") {
  ON_EACH_BACKEND(where);
  auto j = where.open();
  for (auto id : {"b", "c", "a"}) j->create_run(a_run(id));
  std::vector<std::string> ids;
  for (const auto& r : j->list_runs()) ids.push_back(r.id);
  CHECK(ids == std::vector<std::string>{"a", "c", "b"});
}

namespace {
std::int64_t query_clock = 1'700'000'000'000;
std::int64_t read_query_clock() { return query_clock; }
}  // namespace

TEST_CASE("list_runs finds the runs a query selects, newest first, a page at a time") {
  ON_EACH_BACKEND(where);
  auto j = where.open();
  storage::set_now_ms_for_testing(read_query_clock);
  struct made {
    const char* id;
    const char* agent;
    std::int64_t at;
  };
  // Two runs share a millisecond: insertion order breaks the tie.
  for (const made& m : {made{"r1", "/a/count.py", 1000}, made{"r2", "/a/other.py", 2000},
                        made{"r3", "/b/count.py", 2000}, made{"r4", "/a/xcount.py", 3000},
                        made{"r5", "/a/count.py", 4000}}) {
    query_clock = 1'700'000'000'000 + m.at;
    auto run = a_run(m.id);
    run.agent = m.agent;
    j->create_run(run);
  }
  storage::set_now_ms_for_testing(nullptr);
  REQUIRE(j->claim_run("r3", "", "me"));
  j->finish_run("r3", run_status::completed, json(1), std::nullopt);

  const auto ids = [&](const run_query& q) {
    std::vector<std::string> out;
    for (const auto& r : j->list_runs(q)) out.push_back(r.id);
    return out;
  };
  using v = std::vector<std::string>;
  CHECK(ids({}) == v{"r5", "r4", "r3", "r2", "r1"});
  CHECK(ids({.status = run_status::completed}) == v{"r3"});
  CHECK(ids({.status = run_status::pending}) == v{"r5", "r4", "r2", "r1"});
  // By its file's name or trailing path, whole components only: xcount.py is not count.py.
  CHECK(ids({.agent = "count.py"}) == v{"r5", "r3", "r1"});
  CHECK(ids({.agent = "a/count.py"}) == v{"r5", "r1"});
  CHECK(ids({.agent = "/b/count.py"}) == v{"r3"});
  CHECK(ids({.agent = "ount.py"}).empty());
  CHECK(ids({.since_ms = 1'700'000'002'000}) == v{"r5", "r4", "r3", "r2"});
  // Pages: the next starts after the last of the one before, whatever it matched.
  CHECK(ids({.limit = 2}) == v{"r5", "r4"});
  CHECK(ids({.before = "r4", .limit = 2}) == v{"r3", "r2"});
  CHECK(ids({.before = "r3"}) == v{"r2", "r1"});  // a page that starts inside a shared millisecond
  CHECK(ids({.before = "r2", .limit = 2}) == v{"r1"});
  CHECK(ids({.before = "r1"}).empty());
  CHECK(ids({.agent = "count.py", .before = "r4"}) == v{"r3", "r1"});
  CHECK(ids({.limit = 0}).empty());
  CHECK(ids({.before = "nobody"}).empty());
  // Names are data: a pattern character matches only itself.
  CHECK(ids({.agent = "%"}).empty());
  CHECK(ids({.agent = "count_py"}).empty());
}

TEST_CASE("steps round-trip exactly, in seq order") {
  ON_EACH_BACKEND(where);
  auto j = where.open();
  j->create_run(a_run("r"));

  auto s0 = ok_step("r", 0, json::parse(R"({"text":"héllo ✓ \u0000 \"q\"","n":18446744073709551615,
                                          "neg":-9223372036854775808,"f":0.1,"e":1e-300,"list":[1,[2,{}],null,true],
                                          "empty":""})"));
  s0.result.kind = protocol::step_kind::now;
  s0.result.attempt = 3;
  auto s1 = error_step("r", 1, "rate limited: 429\nretry later", "RateLimitError");
  auto s2 = ok_step("r", 2, nullptr);  // a step that returned null is not an error step
  s2.result.kind = protocol::step_kind::random;
  auto s3 = ok_step("r", 3, "plain string");

  // Appended out of order; read back by seq.
  for (const auto* s : {&s2, &s0, &s3, &s1}) j->append_step(*s);
  auto steps = j->steps("r");
  REQUIRE(steps.size() == 4);
  check_same_step(steps[0], s0);
  check_same_step(steps[1], s1);
  check_same_step(steps[2], s2);
  check_same_step(steps[3], s3);
  CHECK(steps[0].result.output.dump() == s0.result.output.dump());
  CHECK(j->steps("other").empty());
}

TEST_CASE("a step of an unknown run is refused") {
  ON_EACH_BACKEND(where);
  auto j = where.open();
  auto err = error_from([&] { j->append_step(ok_step("ghost", 0, 1)); });
  REQUIRE(err);
  CHECK(err->code() == errc::not_found);
  CHECK_THAT(err->what(), Catch::Contains("ghost"));
}

TEST_CASE("steps are write-once") {
  temp_dir dir;
  const auto db = dir / "cairn.db";
  auto j = open_journal(db);
  j->create_run(a_run("r"));
  const auto original = ok_step("r", 0, {{"answer", 42}});
  j->append_step(original);

  SECTION("appending the same seq again is a conflict and keeps the original") {
    auto err = error_from([&] { j->append_step(ok_step("r", 0, {{"answer", 43}})); });
    REQUIRE(err);
    CHECK(err->code() == errc::conflict);
    CHECK_THAT(err->what(), Catch::Contains("r/0") && Catch::Contains("already journaled"));
    auto again = error_from([&] { j->append_step(original); });
    REQUIRE(again);
    CHECK(again->code() == errc::conflict);
  }

  SECTION("the database itself refuses to change a step, whoever asks") {
    SQLite::Database raw(db.string(), SQLite::OPEN_READWRITE);
    CHECK_THROWS_WITH(raw.exec("UPDATE steps SET output = '\"forged\"'"), Catch::Contains("write-once"));
    CHECK_THROWS_WITH(raw.exec("DELETE FROM steps"), Catch::Contains("write-once"));
    CHECK_THROWS_WITH(raw.exec("INSERT OR REPLACE INTO steps (run_id, seq, name, kind, status, output, attempt, "
                               "duration_us, started_at_ms, finished_at_ms) "
                               "VALUES ('r', 0, 'x', 'step', 'ok', '1', 1, 0, 0, 0)"),
                      Catch::Contains("write-once"));
    CHECK_THROWS_WITH(raw.exec("INSERT OR IGNORE INTO steps (run_id, seq, name, kind, status, output, attempt, "
                               "duration_us, started_at_ms, finished_at_ms) "
                               "VALUES ('r', 0, 'x', 'step', 'ok', '1', 1, 0, 0, 0)"),
                      Catch::Contains("write-once"));
  }

  auto steps = j->steps("r");
  REQUIRE(steps.size() == 1);
  check_same_step(steps[0], original);
}

TEST_CASE("claim_run is a compare-and-set of the owner") {
  ON_EACH_BACKEND(where);
  auto j = where.open();
  j->create_run(a_run("r"));

  CHECK_FALSE(j->claim_run("r", "someone-else", "host-a"));
  CHECK(j->find_run("r")->status == run_status::pending);

  CHECK(j->claim_run("r", "", "host-a"));
  auto run = j->find_run("r");
  CHECK(run->status == run_status::running);
  CHECK(run->owner == "host-a");

  CHECK_FALSE(j->claim_run("r", "", "host-b"));  // host-b read a stale owner
  CHECK(j->find_run("r")->owner == "host-a");
  CHECK(j->claim_run("r", "host-a", "host-b"));  // taking over from a dead host-a
  CHECK(j->find_run("r")->owner == "host-b");

  j->finish_run("r", run_status::completed, "done", std::nullopt);
  CHECK_FALSE(j->claim_run("r", "", "host-c"));
  CHECK(j->find_run("r")->status == run_status::completed);
  CHECK_FALSE(j->claim_run("missing", "", "host-c"));
}

TEST_CASE("storage writes no event of its own: the ledger writes them all") {
  ON_EACH_BACKEND(where);
  auto j = where.open();
  j->create_run(a_run("r"));
  REQUIRE(j->claim_run("r", "", "me"));
  j->begin_attempt("r");
  j->suspend_run("r", {"signal", "go", 1, std::nullopt});
  const auto sig = j->enqueue_signal("r", "go", {});
  REQUIRE(j->claim_run("r", "", "me"));
  j->deliver_signal(sig.id, ok_step("r", 1, "delivered"));
  CHECK(j->request_cancel("r", "test") == cancel_mark::marked_now);
  j->release_run("r");
  REQUIRE(j->claim_run("r", "", "me"));
  j->finish_run("r", run_status::failed, nullptr, protocol::error_info{"boom", "error"});
  j->reset_attempts("r");
  j->create_run(a_run("idle"));
  CHECK(j->cancel_idle_run("idle", "stop"));
  CHECK(j->events("r").empty());
  CHECK(j->events("idle").empty());
}

TEST_CASE("begin_attempt counts attempts") {
  ON_EACH_BACKEND(where);
  auto j = where.open();
  j->create_run(a_run("r"));
  CHECK(j->begin_attempt("r") == 1);
  CHECK(j->begin_attempt("r") == 2);
  CHECK(j->begin_attempt("r") == 3);
  CHECK(j->find_run("r")->attempts == 3);

  CHECK(j->events("r").empty());  // the ledger records attempt_started (engine/event_schema.hpp)

  auto err = error_from([&] { j->begin_attempt("missing"); });
  REQUIRE(err);
  CHECK(err->code() == errc::not_found);
}

TEST_CASE("events keep their order, seq and data") {
  ON_EACH_BACKEND(where);
  auto j = where.open();
  j->create_run(a_run("r"));
  j->append_event("r", "step_retry", {{"delay_ms", 250}}, 7);
  j->append_event("r", "note", json::array({1, "two"}));
  auto events = j->events("r");
  REQUIRE(events.size() == 2);
  CHECK(events[0].kind == "step_retry");
  CHECK(events[0].seq == std::optional<std::uint64_t>(7));
  CHECK(events[0].data == json{{"delay_ms", 250}});
  CHECK(events[0].at_ms >= now_ms() - 60'000);
  CHECK(events[1].kind == "note");
  CHECK_FALSE(events[1].seq);
  CHECK(events[1].data == json::array({1, "two"}));
  auto err = error_from([&] { j->append_event("missing", "x", {}); });
  REQUIRE(err);
  CHECK(err->code() == errc::not_found);
}

TEST_CASE("finish_run records the outcome and frees the run") {
  ON_EACH_BACKEND(where);
  auto j = where.open();
  j->create_run(a_run("ok"));
  j->create_run(a_run("bad"));
  j->claim_run("ok", "", "me");
  j->claim_run("bad", "", "me");

  j->finish_run("ok", run_status::completed, {{"summary", "fine"}}, std::nullopt);
  auto ok = *j->find_run("ok");
  CHECK(ok.status == run_status::completed);
  CHECK(ok.output == json{{"summary", "fine"}});
  CHECK_FALSE(ok.error);
  CHECK(ok.owner.empty());
  REQUIRE(ok.finished_at_ms);
  CHECK(*ok.finished_at_ms >= ok.created_at_ms);

  j->finish_run("bad", run_status::failed, nullptr, protocol::error_info{"boom", "ValueError"});
  auto bad = *j->find_run("bad");
  CHECK(bad.status == run_status::failed);
  REQUIRE(bad.error);
  CHECK(bad.error->message == "boom");
  CHECK(bad.error->type == "ValueError");
  CHECK(bad.output.is_null());
  CHECK(bad.owner.empty());
  CHECK(bad.finished_at_ms);
  CHECK(j->events("bad").empty());

  auto err = error_from([&] { j->finish_run("missing", run_status::completed, 1, std::nullopt); });
  REQUIRE(err);
  CHECK(err->code() == errc::not_found);
  CHECK_THROWS_AS(j->finish_run("ok", run_status::running, 1, std::nullopt), std::invalid_argument);
}

TEST_CASE("reset_attempts makes a failed run pending again, keeping its steps") {
  ON_EACH_BACKEND(where);
  auto j = where.open();
  j->create_run(a_run("r"));
  j->claim_run("r", "", "me");
  j->begin_attempt("r");
  j->begin_attempt("r");
  j->append_step(ok_step("r", 0, "kept"));
  j->finish_run("r", run_status::failed, nullptr, protocol::error_info{"boom", "error"});

  j->reset_attempts("r");
  auto run = *j->find_run("r");
  CHECK(run.status == run_status::pending);
  CHECK(run.attempts == 0);
  CHECK_FALSE(run.error);
  CHECK_FALSE(run.finished_at_ms);
  CHECK(run.owner.empty());
  CHECK(j->steps("r").size() == 1);
  CHECK(j->events("r").empty());
  CHECK(j->claim_run("r", "", "me-again"));
  CHECK(j->begin_attempt("r") == 1);

  auto err = error_from([&] { j->reset_attempts("missing"); });
  REQUIRE(err);
  CHECK(err->code() == errc::not_found);
}

TEST_CASE("create_run records the parent, initial owner and deadline; children() lists them oldest first") {
  ON_EACH_BACKEND(where);
  auto j = where.open();
  j->create_run(a_run("parent"));
  auto child = a_run("kid-b");
  child.parent_id = "parent";
  child.owner = "host-a";
  child.deadline_ms = 1'700'000'123'456;
  auto [kid, created] = j->create_run(child);
  CHECK(created);
  CHECK(kid.parent_id == "parent");
  CHECK(kid.owner == "host-a");
  CHECK(kid.status == run_status::pending);
  CHECK(kid.deadline_ms == std::optional<std::int64_t>(1'700'000'123'456));
  CHECK_FALSE(kid.wait);
  CHECK_FALSE(kid.cancel_requested_at_ms);
  auto second = a_run("kid-a");
  second.parent_id = "parent";
  j->create_run(second);
  j->create_run(a_run("unrelated"));

  auto top = *j->find_run("parent");
  CHECK(top.parent_id.empty());
  CHECK(top.owner.empty());
  CHECK_FALSE(top.deadline_ms);
  CHECK(ids_of(j->children("parent")) == std::vector<std::string>{"kid-b", "kid-a"});
  CHECK(j->children("kid-b").empty());
  CHECK(j->children("nobody").empty());
  // The initial owner is an owner like any other: others cannot claim the run.
  CHECK_FALSE(j->claim_run("kid-b", "", "host-b"));
  CHECK(j->claim_run("kid-b", "host-a", "host-a"));
  CHECK(j->find_run("kid-b")->status == run_status::running);
}

TEST_CASE("suspend_run parks the run, ownerless, with what it waits for") {
  ON_EACH_BACKEND(where);
  auto j = where.open();
  j->create_run(a_run("r"));
  REQUIRE(j->claim_run("r", "", "host-a"));

  j->suspend_run("r", wait_for("signal", "approval", 4, 1'700'000'050'000));
  auto run = *j->find_run("r");
  CHECK(run.status == run_status::waiting);
  CHECK(run.owner.empty());
  REQUIRE(run.wait);
  CHECK(run.wait->kind == "signal");
  CHECK(run.wait->key == "approval");
  CHECK(run.wait->seq == 4);
  CHECK(run.wait->wake_at_ms == std::optional<std::int64_t>(1'700'000'050'000));
  CHECK(j->events("r").empty());  // the ledger records run_waiting (engine/event_schema.hpp)

  // Any host may pick a waiting run up; once it runs, it waits for nothing.
  CHECK(j->claim_run("r", "", "host-b"));
  run = *j->find_run("r");
  CHECK(run.status == run_status::running);
  CHECK(run.owner == "host-b");
  CHECK_FALSE(run.wait);

  j->suspend_run("r", wait_for("child", "kid", 5));
  CHECK(j->find_run("r")->wait->kind == "child");
  CHECK_FALSE(j->find_run("r")->wait->wake_at_ms);

  CHECK_THROWS_AS(j->suspend_run("r", wait_for("nap", "", 6, 1)), std::invalid_argument);
  CHECK_THROWS_AS(j->suspend_run("r", wait_for("timer", "", 6)), std::invalid_argument);  // would never wake
  auto missing = error_from([&] { j->suspend_run("missing", wait_for("timer", "", 0, 1)); });
  REQUIRE(missing);
  CHECK(missing->code() == errc::not_found);

  j->claim_run("r", "", "host-b");
  j->finish_run("r", run_status::completed, "done", std::nullopt);
  CHECK_FALSE(j->find_run("r")->wait);
  auto finished = error_from([&] { j->suspend_run("r", wait_for("timer", "", 7, 1)); });
  REQUIRE(finished);
  CHECK(finished->code() == errc::finished);
  CHECK(j->find_run("r")->status == run_status::completed);
}

TEST_CASE("a cancelled run is final: finish_run records it and claim_run refuses it") {
  ON_EACH_BACKEND(where);
  auto j = where.open();
  j->create_run(a_run("r"));
  j->claim_run("r", "", "host-a");
  j->suspend_run("r", wait_for("timer", "", 2, 1'700'000'000'000));
  CHECK_THROWS_AS(j->finish_run("r", run_status::cancelled, nullptr, std::nullopt), std::invalid_argument);

  // Ended while waiting (say its deadline passed): nothing is left to wake it.
  j->finish_run("r", run_status::cancelled, nullptr, protocol::error_info{"stopped by alice", "cancelled"});
  auto run = *j->find_run("r");
  CHECK(run.status == run_status::cancelled);
  CHECK(run.error->message == "stopped by alice");
  CHECK(run.finished_at_ms);
  CHECK(run.owner.empty());
  CHECK_FALSE(run.wait);
  CHECK_FALSE(j->claim_run("r", "", "host-b"));
  CHECK(j->find_run("r")->status == run_status::cancelled);
  CHECK(j->schedulable(2'000'000'000'000).empty());
}

TEST_CASE("release_run hands a run back to be scheduled again") {
  ON_EACH_BACKEND(where);
  auto j = where.open();
  j->create_run(a_run("r"));
  j->claim_run("r", "", "host-a");
  j->release_run("r");
  auto run = *j->find_run("r");
  CHECK(run.status == run_status::pending);
  CHECK(run.owner.empty());
  CHECK(j->claim_run("r", "", "host-b"));
  j->suspend_run("r", wait_for("timer", "", 0, 1));
  j->release_run("r");
  CHECK(j->find_run("r")->status == run_status::pending);
  CHECK_FALSE(j->find_run("r")->wait);
  CHECK(j->claim_run("r", "", "host-b"));

  j->finish_run("r", run_status::completed, 1, std::nullopt);
  auto err = error_from([&] { j->release_run("r"); });
  REQUIRE(err);
  CHECK(err->code() == errc::finished);
  CHECK(j->find_run("r")->status == run_status::completed);
  auto missing = error_from([&] { j->release_run("missing"); });
  REQUIRE(missing);
  CHECK(missing->code() == errc::not_found);
}

TEST_CASE("reset_attempts also forgets the wait and the cancel request") {
  ON_EACH_BACKEND(where);
  auto j = where.open();
  j->create_run(a_run("r"));
  j->claim_run("r", "", "me");
  j->suspend_run("r", wait_for("signal", "go", 1));
  REQUIRE(j->request_cancel("r", "test") == cancel_mark::marked_now);
  j->reset_attempts("r");
  auto run = *j->find_run("r");
  CHECK(run.status == run_status::pending);
  CHECK_FALSE(run.wait);
  CHECK_FALSE(run.cancel_requested_at_ms);
  CHECK(run.cancel_reason.empty());
  auto briefs = j->schedulable(now_ms());
  REQUIRE(briefs.size() == 1);
  CHECK(briefs[0].status == run_status::pending);
}

TEST_CASE("enqueue_signal refuses an unknown or finished run and writes nothing") {
  temp_dir dir;
  const auto db = dir / "cairn.db";
  auto j = open_journal(db);
  for (auto id : {"done", "bad", "stopped"}) j->create_run(a_run(id));
  j->finish_run("done", run_status::completed, 1, std::nullopt);
  j->finish_run("bad", run_status::failed, nullptr, protocol::error_info{"boom", "error"});
  REQUIRE(j->cancel_idle_run("stopped", "no longer needed"));

  auto missing = error_from([&] { j->enqueue_signal("ghost", "approval", {{"ok", true}}); });
  REQUIRE(missing);
  CHECK(missing->code() == errc::not_found);
  CHECK_THAT(missing->what(), Catch::Contains("ghost"));

  for (auto [id, status] : {std::pair{"done", "completed"}, {"bad", "failed"}, {"stopped", "cancelled"}}) {
    const auto events_before = j->events(id).size();
    auto err = error_from([&, id = id] { j->enqueue_signal(id, "approval", {{"ok", true}}); });
    REQUIRE(err);
    CHECK(err->code() == errc::finished);
    CHECK_THAT(err->what(), Catch::Contains(std::string("run ") + id + " already finished (" + status + ")") &&
                                Catch::Contains("signal 'approval'"));
    CHECK(j->signals(id).empty());
    CHECK(j->events(id).size() == events_before);
  }
  CHECK(rows_in(db, "signals") == 0);
}

TEST_CASE("enqueue_signal queues for any unfinished run; pending_signal gives the oldest undelivered of a name") {
  ON_EACH_BACKEND(where);
  auto j = where.open();
  j->create_run(a_run("r"));
  j->create_run(a_run("other"));
  CHECK_FALSE(j->pending_signal("r", "a"));

  const auto a1 = j->enqueue_signal("r", "a", {{"n", 1}}).id;  // while pending
  j->claim_run("r", "", "host");
  const auto b1 = j->enqueue_signal("r", "b", {{"n", 2}}).id;  // while running
  j->suspend_run("r", wait_for("signal", "a", 0));
  const auto a2 = j->enqueue_signal("r", "a", {{"n", 3}}).id;  // while waiting
  j->enqueue_signal("other", "a", {{"n", 4}});
  CHECK(a1 < b1);
  CHECK(b1 < a2);
  CHECK(j->events("r").empty());  // the ledger records signal_queued

  auto first = j->pending_signal("r", "a");
  REQUIRE(first);
  CHECK(first->id == a1);
  CHECK(first->run_id == "r");
  CHECK(first->name == "a");
  CHECK(first->payload == json{{"n", 1}});
  CHECK(first->sent_at_ms > 0);
  CHECK_FALSE(first->delivered_seq);
  CHECK_FALSE(first->delivered_at_ms);

  auto step = ok_step("r", 0, {{"n", 1}});
  step.result.kind = protocol::step_kind::signal;
  j->deliver_signal(a1, step);
  CHECK(j->pending_signal("r", "a")->id == a2);
  CHECK(j->pending_signal("r", "b")->id == b1);
  CHECK_FALSE(j->pending_signal("r", "c"));

  auto all = j->signals("r");
  REQUIRE(all.size() == 3);
  CHECK(all[0].id == a1);
  CHECK(all[0].delivered_seq == std::optional<std::uint64_t>(0));
  CHECK(all[0].delivered_at_ms);
  CHECK(all[1].id == b1);
  CHECK(all[2].id == a2);
  CHECK_FALSE(all[2].delivered_seq);
  CHECK(j->signals("other").size() == 1);
}

TEST_CASE("deliver_signal puts each signal into exactly one step, atomically") {
  ON_EACH_BACKEND(where);
  auto j = where.open();
  j->create_run(a_run("r"));
  j->create_run(a_run("other"));
  const auto go = j->enqueue_signal("r", "go", {{"approved", true}}).id;
  const auto again = j->enqueue_signal("r", "go", {{"approved", false}}).id;

  auto step = ok_step("r", 3, {{"approved", true}});
  step.result.name = "go";
  step.result.kind = protocol::step_kind::signal;
  j->deliver_signal(go, step);
  auto steps = j->steps("r");
  REQUIRE(steps.size() == 1);
  check_same_step(steps[0], step);
  CHECK(j->signals("r")[0].delivered_seq == std::optional<std::uint64_t>(3));
  CHECK(j->events_at("r", 3).empty());  // the ledger records signal_delivered
  const auto events_before = j->events("r").size();

  SECTION("the same signal again, into another step: conflict, no second step") {
    auto later = step;
    later.result.seq = 4;
    auto err = error_from([&] { j->deliver_signal(go, later); });
    REQUIRE(err);
    CHECK(err->code() == errc::conflict);
    CHECK_THAT(err->what(), Catch::Contains("already delivered at step 3"));
    CHECK(j->steps("r").size() == 1);
    CHECK(j->signals("r")[0].delivered_seq == std::optional<std::uint64_t>(3));
  }
  SECTION("another signal into the journaled step: conflict, and that signal stays queued") {
    auto err = error_from([&] { j->deliver_signal(again, step); });
    REQUIRE(err);
    CHECK(err->code() == errc::conflict);
    CHECK_FALSE(j->signals("r")[1].delivered_seq);
    CHECK(j->pending_signal("r", "go")->id == again);
  }
  SECTION("an unknown signal, or one of another run") {
    auto err = error_from([&] { j->deliver_signal(again + 100, ok_step("r", 4, 1)); });
    REQUIRE(err);
    CHECK(err->code() == errc::not_found);
    const auto theirs = j->enqueue_signal("other", "go", 1).id;
    CHECK_THROWS_AS(j->deliver_signal(theirs, ok_step("r", 4, 1)), std::invalid_argument);
    CHECK_FALSE(j->signals("other")[0].delivered_seq);
  }
  CHECK(j->steps("r").size() == 1);
  CHECK(j->events("r").size() == events_before);
}

TEST_CASE("steps of every kind round-trip") {
  ON_EACH_BACKEND(where);
  auto j = where.open();
  j->create_run(a_run("r"));
  using kind = protocol::step_kind;
  const std::vector<kind> kinds{kind::step,  kind::now,    kind::random, kind::tool,
                                kind::sleep, kind::signal, kind::child,  kind::join};
  for (std::size_t i = 0; i < kinds.size(); ++i) {
    auto s = ok_step("r", i, static_cast<int>(i));
    s.result.kind = kinds[i];
    j->append_step(s);
  }
  auto steps = j->steps("r");
  REQUIRE(steps.size() == kinds.size());
  for (std::size_t i = 0; i < kinds.size(); ++i) CHECK(steps[i].result.kind == kinds[i]);
}

TEST_CASE("request_cancel marks an unfinished run once and reports a finished one") {
  ON_EACH_BACKEND(where);
  auto j = where.open();
  j->create_run(a_run("r"));
  j->claim_run("r", "", "host");
  CHECK(j->request_cancel("r", "test") == cancel_mark::marked_now);
  auto marked = j->find_run("r")->cancel_requested_at_ms;
  REQUIRE(marked);
  CHECK(j->find_run("r")->status == run_status::running);  // the engine stops it; this only asks
  CHECK(j->request_cancel("r", "test") == cancel_mark::marked_before);
  CHECK(j->find_run("r")->cancel_requested_at_ms == marked);

  j->create_run(a_run("done"));
  j->finish_run("done", run_status::completed, 1, std::nullopt);
  CHECK(j->request_cancel("done", "test") == cancel_mark::run_finished);
  CHECK_FALSE(j->find_run("done")->cancel_requested_at_ms);

  j->create_run(a_run("doubt"));
  j->finish_run("doubt", run_status::in_doubt, nullptr, protocol::error_info{"maybe sent", "in_doubt"});
  CHECK(j->request_cancel("doubt", "test") == cancel_mark::marked_now);  // in_doubt has not finished

  auto err = error_from([&] { j->request_cancel("missing", "test"); });
  REQUIRE(err);
  CHECK(err->code() == errc::not_found);
}

TEST_CASE("request_cancel keeps the first reason it was given") {
  ON_EACH_BACKEND(where);
  auto j = where.open();
  j->create_run(a_run("r"));
  CHECK(j->find_run("r")->cancel_reason.empty());
  REQUIRE(j->request_cancel("r", "first \x1b[2J reason") == cancel_mark::marked_now);
  REQUIRE(j->request_cancel("r", "second") == cancel_mark::marked_before);
  CHECK(j->find_run("r")->cancel_reason == "first \x1b[2J reason");  // kept as given; printing escapes it
}

TEST_CASE("a run's kept state is one object per run, {} when created, written under the run's claim") {
  ON_EACH_BACKEND(where);
  auto a = where.open();
  a->create_run(a_run("r"));
  a->create_run(a_run("other"));
  CHECK(a->run_state("r") == json::object());
  const json state = {{"seq", 3}, {"step_failures", 2}, {"suspended_at_ms", {1, 2, 3}}};
  a->put_run_state("r", state);
  CHECK(a->run_state("r") == state);
  CHECK(a->run_state("other") == json::object());
  auto missing = error_from([&] { a->run_state("missing"); });
  REQUIRE(missing);
  CHECK(missing->code() == errc::not_found);

  // Fenced like every write of the run's owner.
  auto b = where.open();
  REQUIRE(a->claim_run("r", "", "host-a"));
  a->put_run_state("r", {{"seq", 4}});
  REQUIRE(b->claim_run("r", "host-a", "host-b"));
  auto fenced = error_from([&] { a->put_run_state("r", {{"seq", 5}}); });
  REQUIRE(fenced);
  CHECK(fenced->code() == errc::fenced);
  CHECK(b->run_state("r") == json{{"seq", 4}});
}

TEST_CASE("events_from reads a history in chunks of bounded bytes, each event once, in order") {
  ON_EACH_BACKEND(where);
  auto j = where.open();
  j->create_run(a_run("r"));
  j->create_run(a_run("other"));
  std::vector<json> written;
  for (int i = 0; i < 40; ++i) {
    // Every fifth event carries a long string (stored apart as a payload): chunks count its body.
    json data = {{"i", i}, {"text", std::string(i % 5 == 0 ? 20'000 : 10, 'a' + i % 26)}};
    j->append_event("r", "note", data, static_cast<std::uint64_t>(i));
    j->append_event("other", "note", {{"i", -i}});
    written.push_back(std::move(data));
  }
  std::vector<json> read;
  std::size_t chunks = 0;
  for (std::int64_t after = 0;;) {
    const auto chunk = j->events_from("r", after, 30'000);
    if (chunk.empty()) break;
    ++chunks;
    std::uint64_t bytes = 0;
    for (const auto& e : chunk) {
      read.push_back(e.data);
      bytes += e.kind.size() + e.data.dump().size();
    }
    CHECK((chunk.size() == 1 || bytes <= 30'000));  // at least one, else within the bound
    after = chunk.back().id;
  }
  CHECK(read == written);
  CHECK(chunks >= 8);  // 8 long events of 20 kB: no two fit in one chunk
  CHECK(j->events_from("r", 0, UINT64_MAX).size() == 40);
  CHECK(j->events_from("missing", 0, 1000).empty());
}

TEST_CASE("cancel_idle_run cancels only a pending or waiting run that nobody owns") {
  ON_EACH_BACKEND(where);
  auto j = where.open();
  j->create_run(a_run("running"));
  j->claim_run("running", "", "host");
  auto owned = a_run("owned-pending");
  owned.owner = "host";
  j->create_run(owned);
  j->create_run(a_run("waiting"));
  j->claim_run("waiting", "", "host");
  j->suspend_run("waiting", wait_for("signal", "go", 2));
  j->create_run(a_run("pending"));
  j->create_run(a_run("done"));
  j->finish_run("done", run_status::completed, 1, std::nullopt);

  CHECK_FALSE(j->cancel_idle_run("running", "stop"));
  CHECK(j->find_run("running")->status == run_status::running);
  CHECK_FALSE(j->cancel_idle_run("owned-pending", "stop"));
  CHECK(j->find_run("owned-pending")->status == run_status::pending);
  CHECK_FALSE(j->cancel_idle_run("done", "stop"));
  CHECK(j->find_run("done")->status == run_status::completed);
  CHECK(j->events("running").empty());

  CHECK(j->cancel_idle_run("waiting", "stopped by alice"));
  auto run = *j->find_run("waiting");
  CHECK(run.status == run_status::cancelled);
  REQUIRE(run.error);
  CHECK(run.error->message == "stopped by alice");
  CHECK(run.error->type == "cancelled");
  CHECK(run.finished_at_ms);
  CHECK_FALSE(run.wait);
  CHECK(j->events("waiting").empty());
  CHECK_FALSE(j->claim_run("waiting", "", "host"));

  CHECK(j->cancel_idle_run("pending", "stop"));
  CHECK(j->find_run("pending")->status == run_status::cancelled);
  CHECK_FALSE(j->cancel_idle_run("pending", "stop"));  // once

  auto err = error_from([&] { j->cancel_idle_run("missing", "stop"); });
  REQUIRE(err);
  CHECK(err->code() == errc::not_found);
}

TEST_CASE("schedulable returns the unfinished runs and exactly the waiting runs that can move") {
  ON_EACH_BACKEND(where);
  auto j = where.open();
  const std::int64_t now = 1'000'000;
  std::vector<std::string> expected;  // in creation order
  auto create = [&](const std::string& id, bool schedulable, std::string parent = "",
                    std::optional<std::int64_t> deadline = std::nullopt) {
    auto r = a_run(id);
    r.parent_id = std::move(parent);
    r.deadline_ms = deadline;
    j->create_run(r);
    if (schedulable) expected.push_back(id);
  };
  auto waits = [&](const std::string& id, bool schedulable, wait_spec w) {
    create(id, schedulable);
    j->suspend_run(id, w);
  };

  create("pending", true);
  create("running", true);
  j->claim_run("running", "", "host-a");
  waits("timer-due", true, wait_for("timer", "", 1, now));
  waits("timer-later", false, wait_for("timer", "", 1, now + 1));
  waits("signal-queued", true, wait_for("signal", "go", 1));
  j->enqueue_signal("signal-queued", "go", 1);
  waits("signal-other-name", false, wait_for("signal", "go", 1));
  j->enqueue_signal("signal-other-name", "stop", 1);
  create("signal-used", false);
  j->deliver_signal(j->enqueue_signal("signal-used", "go", 1).id, ok_step("signal-used", 0, 1));
  j->suspend_run("signal-used", wait_for("signal", "go", 1));  // the one "go" was already delivered at step 0
  waits("signal-timed-out", true, wait_for("signal", "go", 1, now - 1));
  waits("signal-not-yet", false, wait_for("signal", "go", 1, now + 1));
  for (auto [kid_status, parent_moves] : {std::pair{run_status::completed, true}, {run_status::failed, true},
                                          {run_status::cancelled, true}, {run_status::running, false},
                                          {run_status::in_doubt, false}}) {
    const std::string parent = "waits-on-" + std::string(to_string(kid_status));
    const std::string kid = "kid-" + std::string(to_string(kid_status));
    create(parent, parent_moves);
    create(kid, kid_status == run_status::running, parent);
    if (kid_status == run_status::running) j->claim_run(kid, "", "host-b");
    else if (kid_status == run_status::cancelled) j->cancel_idle_run(kid, "stop");
    else if (kid_status == run_status::completed) j->finish_run(kid, kid_status, 1, std::nullopt);
    else j->finish_run(kid, kid_status, nullptr, protocol::error_info{"x", "error"});
    j->suspend_run(parent, wait_for("child", kid, 1));
  }
  waits("cancel-requested", true, wait_for("timer", "", 1, now + 1));
  j->request_cancel("cancel-requested", "test");
  create("deadline-passed", true, "", now);
  j->suspend_run("deadline-passed", wait_for("signal", "go", 1));
  create("deadline-later", false, "", now + 1);
  j->suspend_run("deadline-later", wait_for("signal", "go", 1));
  for (auto id : {"completed", "failed", "cancelled", "in-doubt"}) create(id, false);
  j->finish_run("completed", run_status::completed, 1, std::nullopt);
  j->finish_run("failed", run_status::failed, nullptr, protocol::error_info{"x", "error"});
  j->cancel_idle_run("cancelled", "stop");
  j->finish_run("in-doubt", run_status::in_doubt, nullptr, protocol::error_info{"x", "in_doubt"});

  auto briefs = j->schedulable(now);
  std::vector<std::string> ids;
  for (const auto& b : briefs) ids.push_back(b.id);
  CHECK(ids == expected);
  for (const auto& b : briefs) {
    if (b.id == "running") {
      CHECK(b.status == run_status::running);
      CHECK(b.owner == "host-a");
    } else if (b.id == "kid-running") {
      CHECK(b.parent_id == "waits-on-running");
      CHECK(b.owner == "host-b");
    } else if (b.id == "pending") {
      CHECK(b.status == run_status::pending);
    } else {
      CHECK(b.status == run_status::waiting);
      CHECK(b.owner.empty());
    }
  }

  // A millisecond later the later timer, timeout and deadline have come too.
  ids.clear();
  for (const auto& b : j->schedulable(now + 1)) ids.push_back(b.id);
  for (auto id : {"timer-later", "signal-not-yet", "deadline-later"})
    CHECK(std::find(ids.begin(), ids.end(), id) != ids.end());
  CHECK(std::find(ids.begin(), ids.end(), "signal-other-name") == ids.end());
  CHECK(std::find(ids.begin(), ids.end(), "completed") == ids.end());
}

TEST_CASE("count_by_status counts every status, zero included") {
  ON_EACH_BACKEND(where);
  auto j = where.open();
  for (auto id : {"a", "b", "c", "d", "e"}) j->create_run(a_run(id));
  j->claim_run("b", "", "host");
  j->claim_run("c", "", "host");
  j->suspend_run("c", wait_for("timer", "", 0, 1));
  j->finish_run("d", run_status::completed, 1, std::nullopt);
  j->cancel_idle_run("e", "stop");
  auto counts = j->count_by_status();
  CHECK(counts == std::map<run_status, int>{{run_status::pending, 1},  {run_status::running, 1},
                                            {run_status::waiting, 1},  {run_status::completed, 1},
                                            {run_status::failed, 0},   {run_status::cancelled, 1},
                                            {run_status::in_doubt, 0}});
}

TEST_CASE("everything survives closing and reopening") {
  temp_dir dir;
  const auto db = dir / "nested" / "deeper" / "cairn.db";  // parent folders are created
  const auto step = ok_step("r", 0, {{"k", "v"}});
  {
    auto j = open_journal(db, {.sync = sync_mode::normal});
    j->create_run(a_run("r"));
    j->claim_run("r", "", "me");
    j->begin_attempt("r");
    j->append_event("r", "attempt_started", {{"attempt", 1}});
    j->append_step(step);
    j->finish_run("r", run_status::completed, {{"out", true}}, std::nullopt);
  }
  for (bool read_only : {false, true}) {
    auto j = open_journal(db, {.read_only = read_only});
    CHECK(j->path() == db);
    auto run = j->find_run("r");
    REQUIRE(run);
    CHECK(run->status == run_status::completed);
    CHECK(run->output == json{{"out", true}});
    CHECK(run->attempts == 1);
    auto steps = j->steps("r");
    REQUIRE(steps.size() == 1);
    check_same_step(steps[0], step);
    CHECK(event_kinds(*j, "r") == std::vector<std::string>{"attempt_started"});
  }
}

TEST_CASE("the journal is in WAL mode at the current schema version") {
  temp_dir dir;
  const auto db = dir / "cairn.db";
  auto j = open_journal(db);
  SQLite::Database raw(db.string(), SQLite::OPEN_READONLY);
  CHECK(raw.execAndGet("PRAGMA journal_mode").getString() == "wal");
  CHECK(raw.execAndGet("PRAGMA user_version").getInt() == sqlite::schema_version());
  CHECK(sqlite::schema_version() >= 1);
}

TEST_CASE("a journal from a newer cairn is refused, not touched") {
  temp_dir dir;
  const auto db = dir / "cairn.db";
  { auto j = open_journal(db); j->create_run(a_run("r")); }
  const int newer = sqlite::schema_version() + 1;
  { SQLite::Database raw(db.string(), SQLite::OPEN_READWRITE); raw.exec("PRAGMA user_version = " + std::to_string(newer)); }

  for (bool read_only : {false, true}) {
    auto err = error_from([&] { auto j = open_journal(db, {.read_only = read_only}); });
    REQUIRE(err);
    CHECK(err->code() == errc::schema_too_new);
    CHECK_THAT(err->what(), Catch::Contains("newer") && Catch::Contains(db.string()));
  }
  SQLite::Database raw(db.string(), SQLite::OPEN_READONLY);
  CHECK(raw.execAndGet("PRAGMA user_version").getInt() == newer);
}

TEST_CASE("a file that is not a journal is reported as corrupt") {
  temp_dir dir;
  const auto db = dir / "cairn.db";
  std::ofstream(db) << std::string(4096, 'x');
  auto err = error_from([&] { auto j = open_journal(db); });
  REQUIRE(err);
  CHECK(err->code() == errc::corrupt);
  CHECK_THAT(err->what(), Catch::Contains(db.string()));
}

TEST_CASE("read-only mode inspects and never creates or writes") {
  temp_dir dir;
  const auto db = dir / "cairn.db";

  auto missing = error_from([&] { auto j = open_journal(db, {.read_only = true}); });
  REQUIRE(missing);
  CHECK(missing->code() == errc::not_found);
  CHECK_THAT(missing->what(), Catch::Contains("no journal at " + db.string()) &&
                                  Catch::Contains("nothing has run yet"));
  CHECK_FALSE(fs::exists(db));

  { auto j = open_journal(db); j->create_run(a_run("r")); }
  auto reader = open_journal(db, {.read_only = true});
  CHECK(reader->list_runs().size() == 1);
  auto err = error_from([&] { reader->append_event("r", "x", {}); });
  REQUIRE(err);
  CHECK(err->code() == errc::read_only);
  CHECK(reader->events("r").empty());
}

TEST_CASE("a journal this user cannot write gives read_only and stays intact") {
  temp_dir dir;
  // A folder nobody may write, holding a journal nobody may write.
  const auto locked_dir = dir / "locked";
  const auto db = locked_dir / "cairn.db";
  // A writable folder holding a journal file that is not writable.
  const auto open_dir = dir / "open";
  const auto ro_file = open_dir / "cairn.db";
  const auto step = ok_step("r", 0, {{"precious", true}});
  for (const auto& p : {db, ro_file}) {
    auto j = open_journal(p);
    j->create_run(a_run("r"));
    j->append_step(step);
  }
  fs::permissions(db, fs::perms(0444));
  fs::permissions(ro_file, fs::perms(0444));
  fs::permissions(locked_dir, fs::perms(0555));
  fs::permissions(open_dir, fs::perms(0777));

  auto checks = [&]() -> std::string {
    std::string failures;
    auto expect_read_only = [&](const fs::path& p, const char* what) {
      // Opening alone must fail: `cairn doctor` checks writability by opening.
      auto err = error_from([&] { auto j = open_journal(p); });
      if (!err) failures += std::string(what) + ": opened for writing\n";
      else if (err->code() != errc::read_only || std::string(err->what()).find("read-only") == std::string::npos)
        failures += std::string(what) + ": wrong error: " + err->what() + "\n";
    };
    expect_read_only(db, "journal in a read-only folder");
    expect_read_only(ro_file, "read-only journal file");
    expect_read_only(locked_dir / "new.db", "new journal in a read-only folder");
    expect_read_only(locked_dir / "sub" / "new.db", "new folder in a read-only folder");
    try {
      // No -wal/-shm exist and none can be created: inspection still works.
      auto reader = open_journal(db, {.read_only = true});
      if (reader->steps("r").size() != 1) failures += "read-only inspection: step missing\n";
    } catch (const std::exception& e) {
      failures += std::string("read-only inspection failed: ") + e.what() + "\n";
    }
    return failures;
  };
  // Root writes through any chmod, so as root the checks run as nobody in a child.
  const std::string failures = geteuid() == 0 ? run_as_nobody(checks) : checks();
  CHECK(failures == "");

  fs::permissions(locked_dir, fs::perms(0755));
  for (const auto& p : {db, ro_file}) {
    fs::permissions(p, fs::perms(0644));
    auto j = open_journal(p);
    auto steps = j->steps("r");
    REQUIRE(steps.size() == 1);
    check_same_step(steps[0], step);
    CHECK(j->events("r").empty());
  }
  CHECK_FALSE(fs::exists(locked_dir / "new.db"));
  CHECK_FALSE(fs::exists(locked_dir / "sub"));
}

TEST_CASE("a locked journal says so, and nothing is half-written") {
  temp_dir dir;
  const auto db = dir / "cairn.db";
  { auto j = open_journal(db); j->create_run(a_run("r")); }

  SECTION("held by another connection of this process") {
    auto j = open_journal(db, {.busy_timeout = 100ms});
    SQLite::Database holder(db.string(), SQLite::OPEN_READWRITE);
    holder.exec("BEGIN EXCLUSIVE");
    holder.exec("INSERT INTO events (run_id, kind, data, at_ms) VALUES ('r', 'holder', '{}', 0)");

    auto start = std::chrono::steady_clock::now();
    auto err = error_from([&] { j->append_step(ok_step("r", 0, 1)); });
    auto waited = std::chrono::steady_clock::now() - start;
    REQUIRE(err);
    CHECK(err->code() == errc::locked);
    CHECK_THAT(err->what(), Catch::Contains("locked") && Catch::Contains(db.string()) &&
                                Catch::Contains("pid " + std::to_string(getpid())));
    CHECK(waited >= 90ms);  // busy_timeout is honoured, not the 5 s default
    CHECK(waited < 3s);
    auto attempt = error_from([&] { j->begin_attempt("r"); });
    REQUIRE(attempt);
    CHECK(attempt->code() == errc::locked);

    holder.exec("ROLLBACK");
    CHECK(j->steps("r").empty());
    CHECK(j->events("r").empty());
    CHECK(j->find_run("r")->attempts == 0);
    j->append_step(ok_step("r", 0, 1));
    CHECK(j->begin_attempt("r") == 1);
    CHECK(j->steps("r").size() == 1);
  }

  SECTION("held by another process, named by its pid") {
    std::optional<storage_error> err;
    pid_t holder_pid = 0;
    {
      lock_holder_process holder(db);
      holder_pid = holder.pid();
      auto j = open_journal(db, {.busy_timeout = 100ms});
      err = error_from([&] { j->append_step(ok_step("r", 0, 1)); });
    }
    REQUIRE(err);
    CHECK(err->code() == errc::locked);
    CHECK_THAT(err->what(), Catch::Contains("locked by another process (pid " + std::to_string(holder_pid) + ")"));

    auto j = open_journal(db);
    CHECK(j->steps("r").empty());
    CHECK(j->events("r").empty());
    j->append_step(ok_step("r", 0, 1));
    CHECK(j->steps("r").size() == 1);
  }
}

TEST_CASE("a full disk loses nothing that was committed") {
  temp_dir dir;
  tiny_disk disk(dir / "tiny", "512k");
  if (!disk.mounted) return;
  const auto& mnt = disk.at;

  const auto db = mnt / "cairn.db";
  const auto filler = mnt / "filler";
  std::vector<step_record> committed;
  const std::string chunk(4000, 'z');
  const auto big = ok_step("r", 5, std::string(64 * 1024, 'y'));
  {
    auto j = open_journal(db);
    j->create_run(a_run("r"));
    for (std::uint64_t seq = 0; seq < 5; ++seq) {
      committed.push_back(ok_step("r", seq, {{"chunk", chunk}, {"seq", seq}}));
      j->append_step(committed.back());
    }
    {
      std::ofstream fill(filler, std::ios::binary);
      const std::string block(4096, '\0');
      while (fill.write(block.data(), block.size()) && fill.flush()) {}
    }
    auto err = error_from([&] { j->append_step(big); });
    REQUIRE(err);
    CHECK(err->code() == errc::disk_full);
    CHECK_THAT(err->what(), Catch::Contains("disk full") && Catch::Contains(db.string()) &&
                                Catch::Contains("cairn resume r"));
    auto steps = j->steps("r");
    CHECK(steps.size() == committed.size());

    fs::remove(filler);
    j->append_step(ok_step("r", 5, "after freeing space"));  // the same journal recovers
  }
  auto j = open_journal(db);
  auto steps = j->steps("r");
  REQUIRE(steps.size() == committed.size() + 1);
  for (std::size_t i = 0; i < committed.size(); ++i) check_same_step(steps[i], committed[i]);
  CHECK(steps.back().result.output == "after freeing space");
}

TEST_CASE("a journal that lost its run to another is fenced: none of its writes reach the journal") {
  ON_EACH_BACKEND(where);
  auto a = where.open();
  auto b = where.open();
  a->create_run(a_run("r"));
  a->create_run(a_run("other"));
  const auto queued = a->enqueue_signal("r", "go", 1).id;
  REQUIRE(a->claim_run("r", "", "host-a"));
  CHECK(a->find_run("r")->epoch == 1);
  CHECK(a->begin_attempt("r") == 1);
  a->append_step(ok_step("r", 0, "a0"));
  a->append_event("r", "by_a", json::object(), 0);

  // host-a is judged dead (or forced out); host-b takes the run over.
  REQUIRE(b->claim_run("r", "host-a", "host-b"));
  CHECK(b->find_run("r")->epoch == 2);
  const auto events_before = b->events("r");

  new_run child = a_run("r.1");
  child.parent_id = "r";
  const std::vector<std::pair<std::string, std::function<void()>>> writes = {
      {"append_step", [&] { a->append_step(ok_step("r", 1, "a1")); }},
      {"append_event", [&] { a->append_event("r", "by_a", json::object(), 1); }},
      {"begin_attempt", [&] { a->begin_attempt("r"); }},
      {"deliver_signal", [&] { a->deliver_signal(queued, ok_step("r", 1, "a-signal")); }},
      {"create_run of a child", [&] { a->create_run(child); }},
      {"suspend_run", [&] { a->suspend_run("r", {"timer", "", 1, now_ms() + 60'000}); }},
      {"release_run", [&] { a->release_run("r"); }},
      {"reset_attempts", [&] { a->reset_attempts("r"); }},
      {"finish_run", [&] { a->finish_run("r", run_status::completed, "a-done", std::nullopt); }},
      {"append_step again", [&] { a->append_step(ok_step("r", 1, "a1")); }},
      {"confirm_held", [&] { a->confirm_held("r"); }},
      {"put_run_state", [&] { a->put_run_state("r", {{"by", "a"}}); }},
  };
  int refused = 0;
  for (const auto& [name, write] : writes) {
    INFO(name);
    auto err = error_from(write);
    REQUIRE(err);
    CHECK(err->code() == errc::fenced);
    CHECK_THAT(err->what(), Catch::Contains("run r was taken over by host-b (epoch 2)"));
    ++refused;
  }
  CHECK(refused == 12);

  // Nothing of host-a's is in the journal after the takeover.
  auto run = b->find_run("r");
  CHECK(run->owner == "host-b");
  CHECK(run->status == run_status::running);
  CHECK(run->epoch == 2);
  CHECK(run->attempts == 1);
  CHECK_FALSE(run->wait);
  REQUIRE(b->steps("r").size() == 1);
  CHECK(b->steps("r")[0].result.output == "a0");
  CHECK(b->events("r").size() == events_before.size());
  CHECK_FALSE(b->find_run("r.1"));
  CHECK_FALSE(b->signals("r")[0].delivered_seq);

  // The new owner writes as usual, to the end; a run host-a never claimed is not fenced.
  CHECK(b->begin_attempt("r") == 2);
  b->append_step(ok_step("r", 1, "b1"));
  b->deliver_signal(queued, ok_step("r", 2, "b-signal"));
  b->finish_run("r", run_status::completed, "b-done", std::nullopt);
  CHECK(b->find_run("r")->output == "b-done");
  a->append_event("other", "by_a", json::object());
  CHECK(a->events("other").size() == 1);
}

namespace {

using write_fn = std::function<void(journal&)>;

// What a write made under a claim since superseded came to: "fenced", as it
// must, or what happened instead.
std::string outcome(const std::exception_ptr& thrown) {
  if (!thrown) return "written past the fence";
  try {
    std::rethrow_exception(thrown);
  } catch (const storage_error& e) {
    return e.code() == errc::fenced ? "fenced" : std::string("refused for another reason: ") + e.what();
  }
}

template <class F>
std::exception_ptr thrown_by(F&& write) {
  try {
    write();
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

}  // namespace

TEST_CASE("a run claimed again by the same owner fences the older claim: alone, in a group commit, a group of one",
          "[epoch]") {
  // The owner string is the same (a worker restarted with its id, another
  // of its threads): only the epoch tells the two claims apart. A group
  // commit is fenced on its own path (PostgreSQL checks the fence in the
  // SQL of a pipeline it sends whole, a group of one without BEGIN), so
  // each shape of write is tried.
  ON_EACH_BACKEND(where);
  auto older = where.open();
  auto newer = where.open();
  for (const auto* id : {"r", "kept"}) {
    older->create_run(a_run(id));
    REQUIRE(older->claim_run(id, "", "host-a"));
  }
  older->append_step(ok_step("r", 0, "older"));
  REQUIRE(newer->claim_run("r", "host-a", "host-a"));
  REQUIRE(newer->find_run("r")->epoch == 2);
  const auto events_before = newer->events("r").size();

  const auto step = [](journal& w) { w.append_step(ok_step("r", 1, "older")); };
  const auto event = [](journal& w) { w.append_event("r", "older", json::object(), 1); };
  for (const auto& shape : std::vector<std::pair<std::string, write_fn>>{{"a step", step}, {"an event", event}}) {
    INFO(shape.first);
    CHECK(outcome(older->write_together(std::vector<write_fn>{shape.second})[0]) == "fenced");  // a group of one
    CHECK(outcome(thrown_by([&] { shape.second(*older); })) == "fenced");                      // alone
  }
  auto together = older->write_together(std::vector<write_fn>{
      [](journal& w) { w.append_step(ok_step("kept", 0, "kept")); },
      [&](journal& w) {
        event(w);
        step(w);
      },
      [](journal& w) { w.append_event("kept", "kept", json::object()); },
  });
  CHECK_FALSE(together[0]);
  CHECK(outcome(together[1]) == "fenced");
  CHECK_FALSE(together[2]);
  CHECK(outcome(thrown_by([&] { older->finish_run("r", run_status::completed, "older", std::nullopt); })) == "fenced");

  // Nothing of the older claim's reached the journal; the other run's group members did.
  REQUIRE(newer->steps("r").size() == 1);
  CHECK(newer->steps("r")[0].result.output == "older");
  CHECK(newer->events("r").size() == events_before);
  CHECK(newer->find_run("r")->status == run_status::running);
  CHECK(newer->steps("kept").size() == 1);
  CHECK(event_kinds(*newer, "kept").back() == "kept");

  // The newer claim writes on; released, the run is claimed afresh and the new claim holds.
  newer->append_step(ok_step("r", 1, "newer"));
  newer->release_run("r");
  REQUIRE(older->claim_run("r", "", "host-a"));
  CHECK(older->find_run("r")->epoch == 3);
  older->finish_run("r", run_status::completed, "older", std::nullopt);
  CHECK(older->steps("r").size() == 2);
}

TEST_CASE("a value stored past the bounds makes only its run unreadable, and says which value") {
  temp_dir dir;
  const auto db = dir / "cairn.db";
  auto j = open_journal(db);
  j->create_run(a_run("victim"));
  j->create_run(a_run("deep-input"));
  j->create_run(a_run("bystander"));
  j->append_step(ok_step("bystander", 0, {{"ok", true}}));
  const std::string deep = std::string(60'000, '[') + std::string(60'000, ']');
  {
    // As an older cairn, or another program, could have written them.
    SQLite::Database raw(db.string(), SQLite::OPEN_READWRITE);
    SQLite::Statement signal(raw, "INSERT INTO signals (run_id, name, payload, sent_at_ms) VALUES ('victim', 'go', ?, 1)");
    signal.bind(1, deep);
    signal.exec();
    SQLite::Statement input(raw, "UPDATE runs SET input = ? WHERE id = 'deep-input'");
    input.bind(1, deep);
    input.exec();
  }
  CHECK(j->has_pending_signal("victim", "go"));
  for (auto read : std::vector<std::function<void()>>{[&] { j->pending_signal("victim", "go"); },
                                                      [&] { j->signals("victim"); }}) {
    auto err = error_from(read);
    REQUIRE(err);
    CHECK(err->code() == errc::unreadable);
    CHECK_THAT(err->what(), Catch::Contains("payload of signal") && Catch::Contains("of run victim") &&
                                Catch::Contains("nests deeper than 128 levels"));
  }
  auto run = j->find_run("deep-input");
  REQUIRE(run);
  CHECK(run->input.is_null());
  CHECK_THAT(run->unreadable, Catch::Contains("the input of run deep-input nests deeper than 128 levels"));
  CHECK(j->list_runs().size() == 3);
  CHECK(j->find_run("bystander")->unreadable.empty());
  CHECK(j->steps("bystander").size() == 1);
}

TEST_CASE("enqueue_signal refuses a run that holds max_signals signals, delivered ones included") {
  ON_EACH_BACKEND(where);
  auto j = where.open();
  j->create_run(a_run("r"));
  const auto first = j->enqueue_signal("r", "go", 1, 2);
  CHECK(first.run_id == "r");
  CHECK(first.payload == 1);
  CHECK(j->signals("r")[0].sent_at_ms == first.sent_at_ms);
  auto step = ok_step("r", 0, 1);
  step.result.kind = protocol::step_kind::signal;
  j->deliver_signal(first.id, step);
  j->enqueue_signal("r", "go", 2, 2);
  auto err = error_from([&] { j->enqueue_signal("r", "go", 3, 2); });
  REQUIRE(err);
  CHECK(err->code() == errc::limit_reached);
  CHECK(j->signals("r").size() == 2);
}

TEST_CASE("bytes_of_run counts the bytes of a run's steps and events, not other runs'") {
  ON_EACH_BACKEND(where);
  auto j = where.open();
  j->create_run(a_run("r"));
  j->create_run(a_run("other"));
  const auto before = j->bytes_of_run("r");
  auto step = ok_step("r", 0, std::string(10'000, 'x'));
  j->append_step(step);
  const json data = {{"text", std::string(5'000, 'y')}};
  j->append_event("r", "note", data);
  j->append_step(ok_step("other", 0, std::string(50'000, 'z')));
  const auto after = j->bytes_of_run("r");
  // The step's name and output text; the event's kind and data text; each
  // long string once by content (digest and compressed body).
  const auto output = encode_output(step.result.output);
  const auto split = split_payloads(data);
  REQUIRE(output.pieces.size() == 1);
  REQUIRE(split.pieces.size() == 1);
  CHECK(after - before == step.result.name.size() + output.text.size() + output.pieces[0].digest.size() +
                              output.pieces[0].body.size() + 4 + split.manifest.dump().size() +
                              split.pieces[0].digest.size() + split.pieces[0].body.size());
  CHECK(after - before < 1'000);
}

namespace {

std::string tool_output(int n) {
  std::string s;
  while (s.size() < 5'000) s += "source " + std::to_string(n) + " says the log is written before the page. ";
  return s;
}

}  // namespace

TEST_CASE("a tool's output and the requests that repeat it are stored once, and read back as written") {
  ON_EACH_BACKEND(where);
  auto j = where.open();
  j->create_run(a_run("r"));
  const auto before = j->bytes_of_run("r");
  json messages = json::array({{{"role", "user"}, {"content", "Survey write-ahead logging."}}});
  std::vector<json> requests;
  for (int i = 0; i < 40; ++i) {
    requests.push_back({{"tool", "llm.chat"}, {"args", {{"messages", messages}, {"max_tokens", 4096}}}});
    j->append_event("r", "tool_started", requests.back(), 2 * i);
    const json reply = {{"content", "I will read source " + std::to_string(i) + "."}};
    j->append_step(ok_step("r", 2 * i, reply));
    messages.push_back({{"role", "assistant"}, {"content", reply["content"]}});
    j->append_step(ok_step("r", 2 * i + 1, tool_output(i)));
    messages.push_back({{"role", "tool"}, {"content", tool_output(i)}});
  }
  // 40 outputs of 5 KB, journaled as steps and repeated in up to 39 requests each.
  const auto bytes = j->bytes_of_run("r") - before;
  CHECK(bytes < messages.dump().size() / 2);
  std::vector<json> read;
  for (const auto& e : j->events("r")) read.push_back(e.data);
  CHECK(read == requests);
  const auto steps = j->steps("r");
  REQUIRE(steps.size() == 80);
  CHECK(steps[3].result.output == tool_output(1));
  CHECK(steps[2].result.output == json({{"content", "I will read source 1."}}));
  // steps_from's budget counts what a step holds when read, not its row.
  CHECK(j->steps_from("r", 1, 80, 6'000).size() == 2);
  CHECK(j->steps_from("r", 1, 80, 4'000).size() == 1);
  std::size_t events_read = 0;
  for (std::int64_t after = 0;;) {
    auto chunk = j->events_from("r", after, 64 * 1024);
    if (chunk.empty()) break;
    // From the 14th on, a request holds more than 64 KB once read: one a chunk.
    if (events_read >= 14) CHECK(chunk.size() == 1);
    for (const auto& e : chunk) CHECK(e.data == requests.at(events_read++));
    after = chunk.back().id;
  }
  CHECK(events_read == requests.size());
  // In a group commit (PostgreSQL pipelines it), claimed, with a payload the run holds already.
  REQUIRE(j->claim_run("r", "", "me"));
  const std::vector<write_fn> writes{[](journal& w) { w.append_step(ok_step("r", 80, tool_output(39))); },
                                     [](journal& w) { w.append_step(ok_step("r", 81, tool_output(40))); }};
  const auto errors = j->write_together(writes);
  CHECK_FALSE(errors[0]);
  CHECK_FALSE(errors[1]);
  const auto grouped = where.open()->steps_from("r", 80, 82, UINT64_MAX);
  REQUIRE(grouped.size() == 2);
  CHECK(grouped[0].result.output == tool_output(39));
  CHECK(grouped[1].result.output == tool_output(40));
}

TEST_CASE("a step output written before payloads reads as it was, a NUL-led string included") {
  temp_dir dir;
  const auto db = dir / "cairn.db";
  open_journal(db)->create_run(a_run("r"));
  const std::string forged = json(std::string(1, '\0') + "sha256:" + std::string(64, 'a')).dump();
  {
    SQLite::Database raw(db.string(), SQLite::OPEN_READWRITE);
    raw.exec("INSERT INTO steps (run_id, seq, name, kind, status, output, attempt, duration_us, started_at_ms, "
             "finished_at_ms) VALUES ('r', 0, 'old', 'step', 'ok', '" + forged + "', 1, 0, 0, 0)");
  }
  const auto steps = open_journal(db)->steps("r");
  REQUIRE(steps.size() == 1);
  CHECK(steps[0].result.output == std::string(1, '\0') + "sha256:" + std::string(64, 'a'));
}

TEST_CASE("a long string journaled in many events is stored once, and every event reads back as written") {
  ON_EACH_BACKEND(where);
  auto j = where.open();
  j->create_run(a_run("r"));
  j->create_run(a_run("other"));
  const std::string conversation(100'000, 'c');
  // A string that looks like a reference, as an agent could send one: it stays a string.
  const std::string forged = std::string(1, '\0') + "sha256:" + std::string(64, '0');
  std::vector<json> sent;
  for (int i = 0; i < 10; ++i)
    sent.push_back({{"messages", json::array({{{"role", "user"}, {"content", conversation}},
                                              {{"role", "tool"}, {"content", "call " + std::to_string(i)}}})},
                    {"forged", forged}});
  const auto before = j->bytes_of_run("r");
  for (const auto& data : sent) j->append_event("r", "tool_started", data, 0);
  j->append_event("other", "tool_started", sent[0], 0);
  // Ten requests of 100 KB each: the conversation once, and ten small manifests.
  CHECK(j->bytes_of_run("r") - before < 100'000 + 10 * 400);
  std::vector<json> read;
  for (const auto& e : j->events("r"))
    if (e.kind == "tool_started") read.push_back(e.data);
  CHECK(read == sent);
  CHECK(j->events("other").back().data == sent[0]);  // each run holds its own copy
}

namespace {

std::optional<storage_error> error_at(const std::vector<std::exception_ptr>& errors, std::size_t i) {
  if (!errors.at(i)) return std::nullopt;
  try {
    std::rethrow_exception(errors[i]);
  } catch (const storage_error& e) {
    return e;
  }
}

}  // namespace

TEST_CASE("one group commit makes the writes of many runs durable, and a refused write fails alone") {
  ON_EACH_BACKEND(where);
  {
    auto j = where.open();
    for (const auto* id : {"a", "b", "c"}) j->create_run(a_run(id));
    j->append_step(ok_step("b", 0, "first"));
    std::vector<write_fn> writes{
        [](journal& w) { w.append_step(ok_step("a", 0, "a0")); },
        [](journal& w) { w.append_step(ok_step("b", 0, "rewritten")); },  // write-once: refused
        [](journal& w) {
          w.append_step(ok_step("c", 0, "c0"));
          w.append_event("c", "note", {{"n", 1}}, 0);
        },
        [](journal& w) {
          w.append_event("a", "half", json::object());
          w.append_step(ok_step("ghost", 0, 1));  // no such run: this write's event goes too
        },
    };
    auto errors = j->write_together(writes);
    CHECK_FALSE(errors[0]);
    REQUIRE(error_at(errors, 1));
    CHECK(error_at(errors, 1)->code() == errc::conflict);
    CHECK_FALSE(errors[2]);
    REQUIRE(error_at(errors, 3));
    CHECK(error_at(errors, 3)->code() == errc::not_found);
  }
  auto j = where.open();  // what another process finds
  REQUIRE(j->steps("a").size() == 1);
  CHECK(j->steps("a")[0].result.output == "a0");
  REQUIRE(j->steps("b").size() == 1);
  CHECK(j->steps("b")[0].result.output == "first");
  CHECK(j->steps("c").size() == 1);
  CHECK(j->events_at("c", 0).size() == 1);
  for (const auto& e : j->events("a")) CHECK(e.kind != "half");
}

TEST_CASE("in a group commit, a run taken over is refused alone, and claims count once committed") {
  ON_EACH_BACKEND(where);
  auto mine = where.open();
  auto theirs = where.open();
  for (const auto* id : {"kept", "lost", "new"}) mine->create_run(a_run(id));
  REQUIRE(mine->claim_run("kept", "", "me"));
  REQUIRE(mine->claim_run("lost", "", "me"));
  REQUIRE(theirs->claim_run("lost", "me", "them"));
  std::vector<write_fn> writes{
      [](journal& w) { w.append_step(ok_step("kept", 0, 1)); },
      [](journal& w) { w.append_step(ok_step("lost", 0, 1)); },
      [](journal& w) {
        if (!w.claim_run("new", "", "me")) throw std::logic_error("claim refused");
        w.append_step(ok_step("new", 0, 1));
      },
  };
  auto errors = mine->write_together(writes);
  CHECK_FALSE(errors[0]);
  REQUIRE(error_at(errors, 1));
  CHECK(error_at(errors, 1)->code() == errc::fenced);
  CHECK_FALSE(errors[2]);
  CHECK(theirs->steps("lost").empty());
  CHECK(theirs->steps("kept").size() == 1);
  // The claim made inside the group fences later writes like any other.
  REQUIRE(theirs->claim_run("new", "me", "them"));
  auto err = error_from([&] { mine->append_step(ok_step("new", 1, 2)); });
  REQUIRE(err);
  CHECK(err->code() == errc::fenced);
}

TEST_CASE("in a group commit, a write sees the claim made before it in the same transaction") {
  ON_EACH_BACKEND(where);
  auto mine = where.open();
  auto theirs = where.open();
  for (const auto* id : {"back", "undone"}) mine->create_run(a_run(id));
  auto without_workspace = a_run("again");
  without_workspace.workspace = "";
  mine->create_run(without_workspace);
  // "back": held by this object at epoch 1, taken over, handed back;
  // "again": held at epoch 1 and claimed once more by the same owner.
  REQUIRE(mine->claim_run("back", "", "me"));
  REQUIRE(theirs->claim_run("back", "me", "them"));
  theirs->release_run("back");
  REQUIRE(mine->claim_run("again", "", "me"));
  REQUIRE(mine->claim_run("undone", "", "me"));
  int back_attempt = 0, again_attempt = 0;
  std::vector<write_fn> writes{
      [&](journal& w) {
        if (!w.claim_run("back", "", "me")) throw std::logic_error("claim refused");
        back_attempt = w.begin_attempt("back");
      },
      [&](journal& w) {
        if (!w.claim_run("again", "me", "me")) throw std::logic_error("claim refused");
        w.assign_workspace("again", "/tmp/again-ws", "");
        again_attempt = w.begin_attempt("again");
      },
      [](journal& w) {
        // A claim rolled back with its write: the hold it replaced counts again.
        if (!w.claim_run("undone", "me", "me")) throw std::logic_error("claim refused");
        throw std::runtime_error("this write fails after its claim");
      },
      [](journal& w) { w.append_step(ok_step("undone", 0, "at the first claim's epoch")); },
  };
  auto errors = mine->write_together(writes);
  CHECK_FALSE(errors[0]);
  CHECK_FALSE(errors[1]);
  CHECK(errors[2]);
  CHECK_FALSE(errors[3]);
  CHECK(back_attempt == 1);
  CHECK(again_attempt == 1);
  CHECK(theirs->find_run("again")->workspace == "/tmp/again-ws");
  CHECK(theirs->find_run("back")->epoch == 3);
  CHECK(theirs->find_run("undone")->epoch == 1);
  CHECK(theirs->steps("undone").size() == 1);
  // Committed, the new claims fence as any other.
  mine->append_step(ok_step("back", 0, 1));
  REQUIRE(theirs->claim_run("again", "me", "them"));
  auto err = error_from([&] { mine->append_step(ok_step("again", 0, 2)); });
  REQUIRE(err);
  CHECK(err->code() == errc::fenced);
}

TEST_CASE("a group commit on a full disk keeps nothing of any write and tells every writer") {
  temp_dir dir;
  tiny_disk disk(dir / "tiny", "4m");
  if (!disk.mounted) return;
  const auto& mnt = disk.at;

  const auto db = mnt / "cairn.db";
  const auto filler = mnt / "filler";
  constexpr int runs = 64;
  auto j = open_journal(db);
  for (int i = 0; i < runs; ++i) {
    j->create_run(a_run("r" + std::to_string(i)));
    j->append_step(ok_step("r" + std::to_string(i), 0, "acknowledged"));
  }
  {
    std::ofstream fill(filler, std::ios::binary);
    const std::string block(4096, '\0');
    while (fill.write(block.data(), block.size()) && fill.flush()) {}
  }
  std::vector<write_fn> writes;
  for (int i = 0; i < runs; ++i)
    writes.push_back([i](journal& w) { w.append_step(ok_step("r" + std::to_string(i), 1, std::string(8192, 'x'))); });
  auto errors = j->write_together(writes);
  for (int i = 0; i < runs; ++i) {
    auto err = error_at(errors, i);
    REQUIRE(err);
    CHECK(err->code() == errc::disk_full);
  }
  fs::remove(filler);
  auto after = open_journal(db);
  for (int i = 0; i < runs; ++i) {
    auto steps = after->steps("r" + std::to_string(i));
    REQUIRE(steps.size() == 1);  // the acknowledged step, and nothing of the failed batch
    CHECK(steps[0].result.output == "acknowledged");
  }
  // The same journal object goes on once there is room again.
  j->append_step(ok_step("r0", 1, "after freeing space"));
  CHECK(after->steps("r0").size() == 2);
}
