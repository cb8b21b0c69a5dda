#include "storage/postgres/postgres_journal.hpp"

#include <libpq-fe.h>
#include <poll.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "storage/payloads.hpp"
#include "storage/postgres/libpq.hpp"
#include "storage/postgres/schema.hpp"
#include "storage/records.hpp"
#include "storage/wakeup.hpp"

namespace cairn::storage::postgres {
namespace fs = std::filesystem;
using namespace detail;

namespace {

class postgres_journal final : public journal {
 public:
  postgres_journal(const fs::path& url, const journal_options& options);
  ~postgres_journal() override;

  const std::filesystem::path& path() const override;
  const journal_options& options() const override;
  int schema_version() const override;
  journal_versions versions() override;
  std::string_view backend() const override { return "postgresql"; }
  std::string server_version() override;
  std::vector<std::exception_ptr> write_together(std::span<const std::function<void(journal&)>> writes, bool sync_later) override;
  std::pair<run_record, bool> create_run(const new_run& run) override;
  std::optional<run_record> find_run(std::string_view id) override;
  std::vector<run_record> list_runs(const run_query& q) override;
  std::vector<run_record> children(std::string_view parent_id) override;
  std::vector<run_record> runs_with_workspace_near(const std::string& folder) override;
  bool claim_run(std::string_view id, std::string_view expected_owner, std::string_view new_owner) override;
  void confirm_held(std::string_view id) override;
  int begin_attempt(std::string_view id) override;
  void finish_run(std::string_view id, run_status status, const json& output, const std::optional<protocol::error_info>& error) override;
  void reset_attempts(std::string_view id) override;
  void suspend_run(std::string_view id, const wait_spec& w) override;
  void release_run(std::string_view id) override;
  cancel_mark request_cancel(std::string_view id, std::string_view reason) override;
  bool cancel_idle_run(std::string_view id, const std::string& message) override;
  std::vector<run_brief> schedulable(std::int64_t now_ms) override;
  std::optional<std::int64_t> next_due_ms(std::int64_t after_ms) override;
  std::map<run_status, int> count_by_status() override;
  signal_record enqueue_signal(std::string_view run_id, std::string_view name, const json& payload, std::uint64_t max_signals) override;
  std::optional<signal_record> pending_signal(std::string_view run_id, std::string_view name) override;
  bool has_pending_signal(std::string_view run_id, std::string_view name) override;
  void deliver_signal(std::int64_t signal_id, const step_record& step) override;
  std::vector<signal_record> signals(std::string_view run_id) override;
  void append_step(const step_record& step) override;
  std::vector<step_record> steps(std::string_view run_id) override;
  std::vector<step_record> steps_from(std::string_view run_id, std::uint64_t from_seq, std::uint64_t end_seq, std::uint64_t max_bytes) override;
  void append_event(std::string_view run_id, std::string_view kind, const json& data, std::optional<std::uint64_t> seq) override;
  std::vector<event_record> events(std::string_view run_id) override;
  std::vector<event_record> events_of_kinds(std::string_view run_id, std::span<const std::string_view> kinds) override;
  std::vector<event_record> events_from(std::string_view run_id, std::int64_t after_id, std::uint64_t max_bytes) override;
  std::vector<event_record> events_at(std::string_view run_id, std::uint64_t seq) override;
  std::uint64_t step_count(std::string_view run_id) override;
  std::uint64_t bytes_of_run(std::string_view run_id) override;
  std::optional<json> run_state(std::string_view run_id) override;
  void put_run_state(std::string_view run_id, const json& state) override;
  void assign_workspace(std::string_view id, const std::string& workspace, const std::string& workspace_host) override;
  run_record delete_run(std::string_view id) override;
  journal_space space() override;
  journal_space reclaim_space(std::uint64_t max_bytes) override;
  bool others_wrote() override { return true; }
  void put_blobs(std::string_view run_id, std::span<const blob> blobs, std::span<const std::string> used) override;
  std::optional<blob> find_blob(std::string_view digest) override;
  void register_worker(const worker_record& worker) override;
  bool renew_lease(std::string_view worker_id, std::int64_t lease_expires_at_ms, std::int64_t fenced_writes) override;
  void remove_worker(std::string_view worker_id) override;
  std::vector<worker_record> workers() override;
  std::optional<worker_record> find_worker(std::string_view worker_id) override;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace

struct postgres_journal::impl {
  fs::path path;
  journal_options options;
  std::string name;  // the URL without its password
  PGconn* conn = nullptr;
  std::unordered_map<const char*, std::string> prepared;  // SQL -> its statement's name on this connection
  int statements = 0;                                     // sent in the current call

  impl(const fs::path& url, const journal_options& o) : path(url), options(o), name(without_password(url.string())) {
    conn = connect_to(path.string());
    check_connected();
    try {
      set_up_session();
      if (options.read_only) check_schema_readable();
      else {
        migrate();
        note_writer();
      }
    } catch (const pg_failure& e) {
      PQfinish(conn);
      throw translate(e, {});
    } catch (...) {
      PQfinish(conn);
      throw;
    }
  }
  ~impl() { PQfinish(conn); }

  std::string where() const { return fmt::format("{}:{}", PQhost(conn), PQport(conn)); }

  // Throws storage_error(io) naming what to check when the connection did not come up.
  void check_connected() {
    if (PQstatus(conn) == CONNECTION_OK) return;
    const std::string why = trimmed(PQerrorMessage(conn));
    std::string message;
    errc code = errc::io;
    if (why.find("authentication") != std::string::npos || why.find("password") != std::string::npos ||
        why.find("pg_hba.conf") != std::string::npos || why.find("role \"") != std::string::npos) {
      message = fmt::format("cannot log in to journal {} as user {} ({}); check the user and password in --db",
                            name, PQuser(conn), why);
    } else if (why.find("database \"") != std::string::npos && why.find("does not exist") != std::string::npos) {
      if (options.read_only) code = errc::not_found;
      message = fmt::format("no cairn journal in {}: the database does not exist ({}); create it (createdb) or "
                            "check --db",
                            name, why);
    } else {
      message = fmt::format("cannot reach journal {} at {} ({}); is the server running? check --db", name, where(),
                            why);
    }
    PQfinish(conn);
    conn = nullptr;
    throw storage_error(code, message);
  }

  void set_up_session() {
    run("SET client_min_messages = warning");
    run("SET client_encoding = 'UTF8'");
    // A lock held past busy_timeout is errc::locked, as SQLite's busy timeout.
    run(fmt::format("SET lock_timeout = {}", options.busy_timeout.count()).c_str());
    // Durability is the server's (synchronous_commit on by default); normal
    // survives a crash of cairn but not of the server's machine.
    if (options.sync == sync_mode::normal) run("SET synchronous_commit = off");
    if (options.read_only) run("SET default_transaction_read_only = on");
  }

  // A connection lost (a server restart) is made again at the start of the next call.
  void reconnect_if_lost() {
    if (conn && PQstatus(conn) == CONNECTION_OK) return;
    prepared.clear();
    pending.clear();
    if (conn) PQreset(conn);
    else conn = connect_to(path.string());
    if (PQstatus(conn) != CONNECTION_OK)
      throw storage_error(errc::io, fmt::format("cannot reach journal {} at {} ({}); is the server running? check --db",
                                                name, where(), trimmed(PQerrorMessage(conn))));
    try {
      set_up_session();
    } catch (const pg_failure& e) {
      throw translate(e, {});
    }
  }

  // Where a statement ran: on its own (autocommit), in a transaction its own
  // pipeline began (nothing of it can have committed), or in one already open.
  enum class transaction { none, begun_with_it, open };
  transaction transaction_state() const {
    if (PQtransactionStatus(conn) != PQTRANS_IDLE) return transaction::open;
    return pending.empty() ? transaction::none : transaction::begun_with_it;
  }

  [[noreturn]] void fail(PGresult* r, std::string_view sql, transaction tx) {
    const char* state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : nullptr;
    std::string message = trimmed(r ? PQresultErrorMessage(r) : PQerrorMessage(conn));
    if (message.empty()) message = trimmed(PQerrorMessage(conn));
    const std::string sqlstate = state ? state : "";
    const bool lost = PQstatus(conn) != CONNECTION_OK || starts_with(sqlstate, "57P") || starts_with(sqlstate, "08");
    // Outside a transaction a write commits alone: lost with it, it may have
    // committed. COMMIT itself the same.
    const bool ambiguous = lost && (sql == "COMMIT" || (tx == transaction::none && !writes_nothing(sql)));
    const bool repeatable = lost && statements == 1 && tx != transaction::open &&
                            (writes_nothing(sql) || tx == transaction::begun_with_it);
    throw pg_failure(message, sqlstate, lost, ambiguous, repeatable);
  }

  void check(const result& res, std::string_view sql, transaction tx) {
    const auto status = res.r ? PQresultStatus(res.r.get()) : PGRES_FATAL_ERROR;
    if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) fail(res.r.get(), sql, tx);
  }

  // Also when the BEGIN is still in `pending`.
  bool in_transaction() const { return !pending.empty() || PQtransactionStatus(conn) != PQTRANS_IDLE; }

  // Statements sent later, in one pipeline with the next statement whose
  // answer is awaited. BEGIN, SAVEPOINT and RELEASE have no answer to wait
  // for, so a group commit of one step costs two round trips (BEGIN ...
  // INSERT, RELEASE ... COMMIT), not five; in an optimistic group commit
  // the writes whose answer nobody reads (`post`) wait here too, and the
  // whole group goes with its COMMIT: one round trip.
  struct queued {
    const char* sql;
    const char* name = nullptr;  // the prepared statement, or null for SQL without parameters
    std::vector<param> params;
  };
  std::vector<queued> pending;
  static bool deferrable(std::string_view sql) {
    return sql == "BEGIN" || starts_with(sql, "SAVEPOINT ") || starts_with(sql, "RELEASE ");
  }
  bool optimistic = false;  // `post` may wait in `pending`

  // A statement without parameters (BEGIN, SAVEPOINT, SET ...).
  void run(const char* sql) {
    if (deferrable(sql)) return pending.push_back({sql, nullptr, {}});
    ++statements;
    send({sql, nullptr, {}});
  }

  // A statement with parameters ($1, $2, ...), prepared once per connection.
  template <class... Args>
  result exec(const char* sql, const Args&... args) {
    ++statements;
    return send(prepare(sql, {to_param(args)...}));
  }

  // A write whose answer nobody reads: in an optimistic group commit it goes
  // with the COMMIT, and its failure (a constraint, the fence) fails the
  // whole group, which then runs again member by member.
  template <class... Args>
  void post(const char* sql, const Args&... args) {
    ++statements;
    auto q = prepare(sql, {to_param(args)...});
    if (optimistic) pending.push_back(std::move(q));
    else send(std::move(q));
  }

  queued prepare(const char* sql, std::vector<param> params) {
    auto& statement = prepared[sql];
    if (statement.empty()) {
      const std::string fresh = fmt::format("cairn_{}", prepared.size());
      const auto tx = transaction_state();
      result made{{PQprepare(conn, fresh.c_str(), sql, static_cast<int>(params.size()), nullptr), &PQclear}};
      check(made, sql, tx);
      statement = fresh;
    }
    return {sql, statement.c_str(), std::move(params)};
  }

  // A statement's parameters as libpq takes them.
  struct wire {
    std::vector<const char*> values;
    std::vector<int> lengths, formats;
    explicit wire(const std::vector<param>& params) {
      for (const auto& p : params) {
        values.push_back(p.value ? p.value->data() : nullptr);
        lengths.push_back(p.value ? static_cast<int>(p.value->size()) : 0);
        formats.push_back(p.binary ? 1 : 0);
      }
    }
    int size() const { return static_cast<int>(values.size()); }
  };

  static bool send_one(PGconn* conn, const queued& q) {
    if (!q.name) return PQsendQueryParams(conn, q.sql, 0, nullptr, nullptr, nullptr, nullptr, 0) == 1;
    const wire w(q.params);
    return PQsendQueryPrepared(conn, q.name, w.size(), w.values.data(), w.lengths.data(), w.formats.data(), 0) == 1;
  }

  // Sends the pending statements and `last` and returns the answer to
  // `last`; the first failure of any of them is thrown. Lost with a COMMIT
  // in the pipeline, the failure is ambiguous.
  result send(queued last) {
    const auto tx = transaction_state();
    const std::string_view sql = last.sql;
    auto queue = std::move(pending);
    pending.clear();
    queue.push_back(std::move(last));
    // A transaction of one write (a group commit of one step): that write
    // alone commits as one, without a BEGIN and a COMMIT for the server to
    // parse and answer and without pipeline mode. Lost, it is as ambiguous
    // as the COMMIT it stands for; failed, nothing of it was kept.
    if (queue.size() == 3 && queue[0].sql == std::string_view(begin_statement) && queue[1].name && sql == "COMMIT")
      queue = {std::move(queue[1])};
    if (queue.size() == 1) {
      const auto& q = queue.front();
      const wire w(q.params);
      result res{
          {q.name ? PQexecPrepared(conn, q.name, w.size(), w.values.data(), w.lengths.data(), w.formats.data(), 0)
                  : PQexec(conn, q.sql),
           &PQclear}};
      check(res, sql, tx);
      return res;
    }
    bool sent = PQenterPipelineMode(conn) == 1;
    for (const auto& q : queue) sent = sent && send_one(conn, q);
    sent = sent && PQpipelineSync(conn) == 1;
    result failed, answer;
    std::string_view failed_sql;
    // Each statement's answer ends with a null; the pipeline's with PGRES_PIPELINE_SYNC.
    for (std::size_t i = 0; sent && i < queue.size() && PQstatus(conn) == CONNECTION_OK; ++i) {
      result r{{PQgetResult(conn), &PQclear}};
      while (PGresult* rest = PQgetResult(conn)) PQclear(rest);
      const auto status = r.r ? PQresultStatus(r.r.get()) : PGRES_FATAL_ERROR;
      if (!failed.r && status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK && status != PGRES_PIPELINE_ABORTED) {
        failed = std::move(r);
        failed_sql = queue[i].sql;
      } else if (i + 1 == queue.size()) {
        answer = std::move(r);
      }
    }
    if (sent && PQstatus(conn) == CONNECTION_OK) {
      result sync{{PQgetResult(conn), &PQclear}};
      sent = sync.r && PQresultStatus(sync.r.get()) == PGRES_PIPELINE_SYNC && PQexitPipelineMode(conn) == 1;
    }
    const bool lost = !sent || PQstatus(conn) != CONNECTION_OK;
    if (lost && sql == "COMMIT") fail(failed.r.get(), sql, tx);
    if (failed.r) fail(failed.r.get(), failed_sql, tx);
    if (lost || !answer.r) fail(nullptr, sql, tx);
    return answer;
  }

  // What a failed statement means for the user, with what to do about it.
  storage_error translate(const pg_failure& e, std::string_view run_id) const {
    if (e.ambiguous)
      return {errc::io, fmt::format("journal {}: the connection to the server was lost while committing ({}); the "
                                    "write may or may not have been kept: read it back before acting on it (is the server running? "
                                    "check --db)",
                                    name, e.what())};
    if (e.lost)
      return {errc::io, fmt::format("journal {}: the server closed the connection ({}); nothing of this transaction "
                                    "was kept; the next call reconnects (is the server running? check --db)",
                                    name, e.what())};
    const std::string& s = e.sqlstate;
    if (s == "23503" && !run_id.empty()) return no_run_error(run_id, name);
    if (starts_with(s, "23")) return {errc::conflict, fmt::format("journal {}: {}", name, e.what())};
    if (s == "53100")
      return {errc::disk_full, fmt::format("disk full writing journal {}: nothing of this write was kept; free "
                                           "space on the database server and run `cairn resume {}`",
                                           name, run_id.empty() ? "RUN" : run_id)};
    if (s == "25006" || s == "42501")
      return {errc::read_only, fmt::format("journal {} is read-only ({}); connect to the primary with a user that "
                                           "may write, or pass --db",
                                           name, e.what())};
    if (s == "55P03" || s == "40P01" || s == "40001")
      return {errc::locked, fmt::format("journal {} is locked by another worker ({}); wait for it to finish or use "
                                        "another --db",
                                        name, e.what())};
    if (s == "22021" || s == "22P05")
      return {errc::io, fmt::format("journal {}: PostgreSQL cannot store this text ({}): text with NUL bytes or "
                                    "invalid UTF-8 needs a SQLite journal",
                                    name, e.what())};
    return {errc::io, fmt::format("journal {}: {}", name, e.what())};
  }

  // Runs `body`, turning libpq's failures into storage_error. A transaction
  // inside `body` has rolled back by the time the error leaves. The
  // outermost call reconnects first if the connection was lost, runs again
  // once when the connection was found lost before anything was written,
  // and retries a deadlock or serialization failure up to busy_timeout.
  template <class F>
  auto guard(std::string_view run_id, F&& body) -> decltype(body()) {
    const bool outermost = depth == 0 && !grouped;
    const auto since = std::chrono::steady_clock::now();
    for (int attempt = 0;; ++attempt) {
      try {
        if (outermost) {
          reconnect_if_lost();
          statements = 0;
        }
        depth_counter d(depth);
        return body();
      } catch (const pg_failure& e) {
        if (outermost && e.repeatable && attempt == 0) continue;
        if (outermost && (e.sqlstate == "40P01" || e.sqlstate == "40001") &&
            std::chrono::steady_clock::now() - since < options.busy_timeout) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1 + attempt % 10));
          continue;
        }
        throw translate(e, run_id);
      } catch (const json::exception& e) {
        throw storage_error(errc::corrupt, fmt::format("journal {} holds invalid JSON ({})", name, e.what()));
      }
    }
  }
  int depth = 0;
  struct depth_counter {
    int& depth;
    explicit depth_counter(int& d) : depth(d) { ++depth; }
    ~depth_counter() { --depth; }
  };

  static constexpr const char* begin_statement = "BEGIN";
  using txn = write_transaction<impl, pg_failure>;

  // Migrations under an advisory lock, in one transaction: two workers
  // opening a fresh database at once create the schema once.
  int stored_version() {
    auto r = exec("SELECT count(*) FROM pg_catalog.pg_class WHERE relname = 'cairn_schema' "
                  "AND relnamespace = to_regnamespace(current_schema())::oid");
    if (pg_row{r, 0}.int64(0) == 0) return 0;
    auto v = exec("SELECT coalesce(max(version), 0) FROM cairn_schema");
    return static_cast<int>(pg_row{v, 0}.int64(0));
  }

  void migrate() {
    int version = stored_version();
    if (version > latest_version()) throw schema_too_new_error(name, version, latest_version());
    if (version == latest_version()) return;
    txn tx(*this);
    run(migration_lock);
    // Read again under the lock: another worker may have migrated meanwhile.
    version = stored_version();
    if (version > latest_version()) throw schema_too_new_error(name, version, latest_version());
    if (version == 0) run("CREATE TABLE cairn_schema (version INT NOT NULL)");
    for (const auto& m : migrations())
      if (m.version > version) run(m.sql);
    run("DELETE FROM cairn_schema");
    exec("INSERT INTO cairn_schema (version) VALUES ($1)", latest_version());
    exec("INSERT INTO journal_info (key, value) VALUES ('created_by', $1) ON CONFLICT (key) DO NOTHING",
         detail::created_by(version));
    tx.commit();
  }

  // This cairn as the journal's last writer: a write only when another was.
  void note_writer() {
    const auto me = writer_name();
    auto last = exec("SELECT value FROM journal_info WHERE key = 'last_written_by'");
    if (last.rows() == 1 && pg_row{last, 0}.text(0) == me) return;
    exec("INSERT INTO journal_info (key, value) VALUES ('last_written_by', $1) "
         "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
         me);
  }

  void check_schema_readable() {
    const int version = stored_version();
    if (version == 0)
      throw storage_error(errc::not_found, fmt::format("no cairn journal in {} (nothing has run yet?)", name));
    if (version > latest_version()) throw schema_too_new_error(name, version, latest_version());
    if (version < latest_version())
      throw storage_error(errc::io, fmt::format("journal {} has schema version {}, older than this cairn's ({}); "
                                                "any writing command (`cairn run`, `cairn resume`) upgrades it",
                                                name, version, latest_version()));
  }

  // The runs this object claimed; in a group commit (`grouped`) what a
  // write changes of them waits for the commit.
  holds held;
  bool grouped = false;

  // Inside a write transaction: refuses the write if this object claimed the
  // run and someone has claimed it since. FOR SHARE keeps a claim from
  // another worker out until this transaction ends.
  void fence(std::string_view run_id) {
    const holds::claim* h = held.find(run_id);
    if (!h) return;
    // In an optimistic group nobody waits for the answer: a refusal fails
    // the group, which runs again member by member, and this says why.
#ifdef CAIRN_TEST_UNSAFE_NO_EPOCH_FENCE  // cairn_unsafe_no_epoch_fence, with which storage_test must fail
    if (optimistic)
      return post("SELECT cairn_fence($1, $2, (SELECT epoch FROM runs WHERE id = $1))", run_id, h->owner);
#endif
    if (optimistic) return post("SELECT cairn_fence($1, $2, $3)", run_id, h->owner, h->epoch);
    auto r = exec("SELECT owner, epoch FROM runs WHERE id = $1 FOR SHARE", run_id);
    if (r.rows() == 0) throw no_run_error(run_id, name);
    const pg_row row{r, 0};
    if (row.text(0) == h->owner && row.int64(1) == h->epoch) return;
    throw fenced_error(run_id, row.text(0), row.int64(1), h->epoch);
  }

  // `write` under the fence: in one transaction with the check when this
  // object holds the run, else as it is.
  template <class F>
  void fenced(std::string_view run_id, F&& write) {
    if (!held.find(run_id)) return write();
    txn tx(*this);
    fence(run_id);
    write();
    tx.commit();
  }

  run_status status_of(std::string_view run_id, const char* sql = "SELECT status FROM runs WHERE id = $1") {
    auto r = exec(sql, run_id);
    if (r.rows() == 0) throw no_run_error(run_id, name);
    auto status = parse_run_status(pg_row{r, 0}.text(0));
    if (!status) throw storage_error(errc::corrupt, fmt::format("run {} has an unknown status", run_id));
    return *status;
  }

  // Inside the transaction that causes it, so it is heard at commit (or never).
  void notify(change what, std::string_view run_id) {
    const std::string text = wakeup_text(run_id, what);
    if (text.size() <= max_wakeup_bytes) post("SELECT pg_notify($1, $2)", wake_channel, text);
  }

  // A run's end is heard by whoever waits on it, and its parent's scheduler.
  void notify_ended(std::string_view run_id, const std::optional<std::string>& parent_id) {
    notify(change::ended, run_id);
    if (parent_id && !parent_id->empty()) notify(change::child_ended, *parent_id);
  }

  // Inserts the payloads of a run that does not hold them yet; none for a run
  // that does not exist (the row that names them says so).
  void store(std::string_view run_id, const std::vector<payload>& pieces) {
    for (const auto& piece : pieces)
      post("INSERT INTO payloads (run_id, digest, body) SELECT $1::text, $2::text, $3::bytea "
           "WHERE EXISTS (SELECT 1 FROM runs WHERE id = $1) ON CONFLICT DO NOTHING",
           run_id, piece.digest, bytes{piece.body});
  }

  void event(std::string_view run_id, std::string_view kind, const json& data, std::optional<std::int64_t> seq) {
    auto split = split_payloads(data);
    store(run_id, split.pieces);
    post("INSERT INTO events (run_id, seq, kind, data, at_ms) VALUES ($1, $2, $3, $4, $5)", run_id, seq, kind,
         dump(split.manifest), now_ms());
  }

  // Inserts the step row, fenced when this object holds the run: one
  // statement, so a step costs one round trip. A (run, seq) already
  // journaled is storage_error(conflict).
  void insert_step(const step_record& step) {
    auto columns = step_outcome_columns(step.result);
    if (columns.pieces.empty()) return insert_step_row(step, columns);
    // The payloads its output names with it, under the fence.
    txn tx(*this);
    fence(step.run_id);
    store(step.run_id, columns.pieces);
    insert_step_row(step, columns);
    tx.commit();
  }

  void insert_step_row(const step_record& step, const step_outcome& columns) {
    const auto& r = step.result;
    const auto& [out, message, type, pieces] = columns;
    const holds::claim* h = held.find(step.run_id);
    const std::optional<std::string> owner = h ? std::optional(h->owner) : std::nullopt;
    const std::optional<std::int64_t> epoch = h ? std::optional(h->epoch) : std::nullopt;
    const auto write = [&, &out = out, &message = message, &type = type](const char* sql) -> std::optional<result> {
      const auto args = std::make_tuple(std::string_view(step.run_id), static_cast<std::int64_t>(r.seq), r.name,
                                        protocol::to_string(r.kind), std::string_view(r.ok ? "ok" : "error"), out,
                                        message, type, r.attempt, r.duration_us, step.started_at_ms,
                                        step.finished_at_ms, owner, epoch);
      if (optimistic) {
        std::apply([&](const auto&... a) { post(sql, a...); }, args);
        return std::nullopt;
      }
      return std::apply([&](const auto&... a) { return exec(sql, a...); }, args);
    };
    try {
      // Optimistic, nobody reads the answer: a refused fence or an unknown
      // run leaves run_id NULL, which NOT NULL refuses, failing the group.
      if (optimistic)
        return void(write("INSERT INTO steps (run_id, seq, name, kind, status, output, error_message, error_type, "
                          "attempt, duration_us, started_at_ms, finished_at_ms) VALUES ("
                          "(SELECT id FROM runs WHERE id = $1 AND ($13::text IS NULL OR (owner = $13 AND "
#ifdef CAIRN_TEST_UNSAFE_NO_EPOCH_FENCE  // cairn_unsafe_no_epoch_fence, with which storage_test must fail
                          "$14::bigint IS NOT NULL)) FOR SHARE), "
#else
                          "epoch = $14::bigint)) FOR SHARE), "
#endif
                          "$2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"));
      // With no claim ($13 NULL) the row is inserted if the run exists; the
      // key refuses a rewrite, the reference an unknown run.
      if (write("INSERT INTO steps (run_id, seq, name, kind, status, output, error_message, error_type, attempt, "
                "duration_us, started_at_ms, finished_at_ms) "
                "SELECT $1::text, $2::bigint, $3::text, $4::text, $5::text, $6::text, $7::text, $8::text, "
                "$9::integer, $10::bigint, $11::bigint, $12::bigint FROM runs "
                "WHERE id = $1 AND ($13::text IS NULL OR (owner = $13 AND epoch = $14::bigint)) FOR SHARE")
              ->affected() == 1)
        return;
    } catch (const pg_failure& e) {
      if (e.sqlstate != "23505") throw;
      throw step_conflict_error(step.run_id, r.seq, name);
    }
    fence(step.run_id);  // says why: no such run, or taken over
    throw no_run_error(step.run_id, name);
  }

  // A group commit in one round trip: every member's writes, then COMMIT,
  // sent in one pipeline (a member that reads waits for what it reads).
  // nullopt when something failed other than the connection: nothing was
  // kept, and the caller runs the group again a member at a time, so each
  // writer hears its own answer.
  std::optional<std::vector<std::exception_ptr>> optimistic_group(
      journal& self, std::span<const std::function<void(journal&)>> writes) {
    try {
      reconnect_if_lost();
    } catch (const storage_error&) {
      return std::nullopt;  // the member-by-member path says why
    }
    statements = 0;
    held.open();
    grouped = optimistic = true;
    std::exception_ptr failure;
    try {
      run(begin_statement);
      for (const auto& write : writes) write(self);
      grouped = optimistic = false;
      run("COMMIT");
    } catch (const pg_failure& e) {
      failure = std::make_exception_ptr(translate(e, {}));
    } catch (...) {
      failure = std::current_exception();
    }
    grouped = optimistic = false;
    if (!failure) {
      held.commit();
      return std::vector<std::exception_ptr>(writes.size());
    }
    held.abandon();
    pending.clear();
    // Lost with the COMMIT under way, or gone: everyone hears it.
    if (PQstatus(conn) != CONNECTION_OK) return std::vector<std::exception_ptr>(writes.size(), failure);
    if (PQtransactionStatus(conn) != PQTRANS_IDLE) try {
        run("ROLLBACK");
      } catch (const pg_failure&) {
        return std::vector<std::exception_ptr>(writes.size(), failure);
      }
    return std::nullopt;
  }

  // SQL built at run time, kept so its text has a stable address (the key of `prepared`).
  std::unordered_map<std::string, std::string> queries;
  const char* query(const std::string& sql) {
    auto& kept = queries[sql];
    if (kept.empty()) kept = sql;
    return kept.c_str();
  }

  template <class... Args>
  std::vector<run_record> runs(const std::string& sql_tail, const Args&... args) {
    auto r = exec(query(fmt::format("SELECT {} FROM runs {}", run_columns, sql_tail)), args...);
    std::vector<run_record> out;
    for (int i = 0; i < r.rows(); ++i) out.push_back(read_run(pg_row{r, i}));
    return out;
  }

  // The bodies of a run's payloads, by digest.
  payload_lookup payloads_of(std::string_view run_id) {
    return [this, run_id](const std::string& digest) -> std::optional<std::string> {
      auto body = exec("SELECT body FROM payloads WHERE run_id = $1 AND digest = $2", run_id, digest);
      if (body.rows() == 0) return std::nullopt;
      return from_hex_bytea(pg_row{body, 0}.text(0));
    };
  }

  std::vector<event_record> read_events(const result& r, std::string_view run_id) {
    std::vector<event_record> out;
    const auto payloads = payloads_of(run_id);
    for (int i = 0; i < r.rows(); ++i) out.push_back(read_event(pg_row{r, i}, run_id, payloads));
    return out;
  }

  worker_record read_worker(const result& r, int i) {
    const pg_row row{r, i};
    worker_record w;
    w.id = row.text(0);
    w.host = row.text(1);
    w.workspace_root = row.text(2);
    w.started_at_ms = int64_or_null(row, 3).value_or(0);
    w.renewed_at_ms = int64_or_null(row, 4).value_or(0);
    w.lease_expires_at_ms = int64_or_null(row, 5).value_or(0);
    w.fenced_writes = int64_or_null(row, 6).value_or(0);
    w.runs = static_cast<int>(row.int64(7));
    return w;
  }
};

namespace {
constexpr const char* worker_select =
    "SELECT id, host, workspace_root, started_at_ms, renewed_at_ms, lease_expires_at_ms, fenced_writes, "
    "(SELECT count(*) FROM runs WHERE owner = workers.id) FROM workers ";
}  // namespace

postgres_journal::postgres_journal(const fs::path& url, const journal_options& options)
    : impl_(std::make_unique<impl>(url, options)) {}

postgres_journal::~postgres_journal() = default;

const fs::path& postgres_journal::path() const { return impl_->path; }

const journal_options& postgres_journal::options() const { return impl_->options; }

int postgres_journal::schema_version() const { return latest_version(); }

// sync_later: PostgreSQL syncs every commit (journal.hpp).
std::vector<std::exception_ptr> postgres_journal::write_together(std::span<const std::function<void(journal&)>> writes,
                                                                 bool /*sync_later*/) {
  auto& j = *impl_;
  if (auto done = j.optimistic_group(*this, writes)) return *std::move(done);
  return group_commit(*this, writes,
                      {.run = [&j](const char* sql) { j.guard({}, [&] { j.run(sql); }); },
                       .in_transaction = [&j] { return PQstatus(j.conn) == CONNECTION_OK && j.in_transaction(); },
                       .begin = impl::begin_statement,
                       .grouped = j.grouped,
                       .held = j.held});
}

std::pair<run_record, bool> postgres_journal::create_run(const new_run& run) {
  auto& j = *impl_;
  return j.guard(run.id, [&] {
    const auto now = now_ms();
    bool inserted = false;
    {
      impl::txn tx(j);
      // A child is created for its parent's attempt: fenced by the parent's claim.
      if (!run.parent_id.empty()) j.fence(run.parent_id);
      inserted = j.exec("INSERT INTO runs (id, agent, input, status, max_attempts, sandbox, workspace, created_at_ms, "
                        "updated_at_ms, policy, parent_id, owner, deadline_ms, workspace_host) "
                        "VALUES ($1, $2, $3, 'pending', $4, $5, $6, $7, $7, $8, $9, $10, $11, $12) "
                        "ON CONFLICT (id) DO NOTHING",
                        run.id, run.agent, dump(run.input), run.max_attempts, run.sandbox, run.workspace, now,
                        dump(run.policy), null_if_empty(run.parent_id), run.owner, run.deadline_ms,
                        run.workspace_host)
                     .affected() == 1;
      if (inserted) j.notify(change::submitted, run.id);
      tx.commit();
    }
    auto record = find_run(run.id);
    if (!record) throw storage_error(errc::io, "run " + run.id + " vanished right after it was created");
    return std::pair{std::move(*record), inserted};
  });
}

std::optional<run_record> postgres_journal::find_run(std::string_view id) {
  return impl_->guard(id, [&]() -> std::optional<run_record> {
    auto found = impl_->runs("WHERE id = $1", id);
    if (found.empty()) return std::nullopt;
    return std::move(found.front());
  });
}

std::vector<run_record> postgres_journal::list_runs(const run_query& q) {
  return impl_->guard({}, [&] {
    std::optional<std::string> status;
    if (q.status) status = std::string(to_string(*q.status));
    // A next page has a statement of its own, as on SQLite: its bound,
    // behind `$4 = '' OR`, would not seek the index in a generic plan.
    static const std::string where =
        "WHERE ($1::text IS NULL OR status = $1) "
        "AND ($2 = '' OR agent = $2 OR (right(agent, length($2)) = $2 "
        "AND substr(agent, length(agent) - length($2), 1) = '/')) "
        "AND ($3::bigint IS NULL OR created_at_ms >= $3) ";
    static const std::string order = "ORDER BY created_at_ms DESC, row_order DESC LIMIT $5";
    static const std::string first_page = where + "AND $4::text = '' " + order;
    static const std::string next_page =
        where + "AND (created_at_ms, row_order) < (SELECT created_at_ms, row_order FROM runs WHERE id = $4) " + order;
    return impl_->runs(q.before.empty() ? first_page : next_page, status, q.agent, q.since_ms, q.before, q.limit);
  });
}

std::vector<run_record> postgres_journal::runs_with_workspace_near(const std::string& folder) {
  return impl_->guard({}, [&] { return impl_->runs("WHERE " + detail::workspace_near_sql("$1::text"), folder); });
}

std::vector<run_record> postgres_journal::children(std::string_view parent_id) {
  return impl_->guard(parent_id,
                      [&] { return impl_->runs("WHERE parent_id = $1 ORDER BY created_at_ms, row_order", parent_id); });
}

bool postgres_journal::claim_run(std::string_view id, std::string_view expected_owner, std::string_view new_owner) {
  auto& j = *impl_;
  return j.guard(id, [&] {
    // SKIP LOCKED: a run another worker is claiming (or writing to) right now
    // is not waited for; the caller looks again later. NO KEY UPDATE, not
    // UPDATE: inserts that only reference the run (its steps and events) do
    // not hold it up.
    auto r = j.exec("UPDATE runs SET status = 'running', owner = $3, epoch = epoch + 1, updated_at_ms = $4, "
                    "wait_kind = NULL, wait_key = NULL, wait_seq = NULL, wake_at_ms = NULL "
                    "WHERE id = (SELECT id FROM runs WHERE id = $1 AND owner = $2 "
                    "  AND status NOT IN ('completed', 'cancelled') FOR NO KEY UPDATE SKIP LOCKED) "
                    "RETURNING epoch",
                    id, expected_owner, new_owner, now_ms());
    if (r.rows() != 1) return false;
    const std::int64_t epoch = pg_row{r, 0}.int64(0);
    j.held.take(id, {std::string(new_owner), epoch});
    return true;
  });
}

void postgres_journal::confirm_held(std::string_view id) {
  impl_->guard(id, [&] { impl_->fence(id); });
}

int postgres_journal::begin_attempt(std::string_view id) {
  auto& j = *impl_;
  return j.guard(id, [&] {
    impl::txn tx(j);
    j.fence(id);
    auto r = j.exec("UPDATE runs SET attempts = attempts + 1, updated_at_ms = $2 WHERE id = $1 RETURNING attempts", id,
                    now_ms());
    if (r.rows() == 0) throw no_run_error(id, j.name);
    const int attempt = static_cast<int>(pg_row{r, 0}.int64(0));
    tx.commit();
    return attempt;
  });
}

void postgres_journal::finish_run(std::string_view id, run_status status, const json& output,
                                  const std::optional<protocol::error_info>& error) {
  check_finish(status, error);
  auto& j = *impl_;
  j.guard(id, [&] {
    const bool ok = status == run_status::completed;
    const auto now = now_ms();
    impl::txn tx(j);
    j.fence(id);
    auto [out, message, type] = outcome_columns(ok, output, ok ? protocol::error_info{} : *error);
    auto r = j.exec("UPDATE runs SET status = $2, output = $3, error_message = $4, error_type = $5, owner = '', "
                    "finished_at_ms = $6, updated_at_ms = $7, wait_kind = NULL, wait_key = NULL, wait_seq = NULL, "
                    "wake_at_ms = NULL WHERE id = $1 RETURNING parent_id",
                    id, to_string(status), out, message, type,
                    status == run_status::in_doubt ? std::optional<std::int64_t>() : std::optional(now), now);
    if (r.rows() == 0) throw no_run_error(id, j.name);
    j.notify_ended(id, text_or_null(pg_row{r, 0}, 0));
    tx.commit();
    j.held.end(id);
  });
}

void postgres_journal::reset_attempts(std::string_view id) {
  auto& j = *impl_;
  j.guard(id, [&] {
    impl::txn tx(j);
    j.fence(id);
    auto before = j.exec("SELECT status, attempts FROM runs WHERE id = $1 FOR NO KEY UPDATE", id);
    if (before.rows() == 0) throw no_run_error(id, j.name);
    j.exec("UPDATE runs SET status = 'pending', attempts = 0, output = NULL, error_message = NULL, "
           "error_type = NULL, finished_at_ms = NULL, owner = '', wait_kind = NULL, wait_key = NULL, "
           "wait_seq = NULL, wake_at_ms = NULL, cancel_requested_at_ms = NULL, cancel_reason = NULL, "
           "updated_at_ms = $2 WHERE id = $1",
           id, now_ms());
    j.notify(change::released, id);
    tx.commit();
    j.held.end(id);
  });
}

void postgres_journal::suspend_run(std::string_view id, const wait_spec& w) {
  check_wait(w);
  const auto seq = static_cast<std::int64_t>(w.seq);
  auto& j = *impl_;
  j.guard(id, [&] {
    impl::txn tx(j);
    j.fence(id);
    if (j.exec("UPDATE runs SET status = 'waiting', owner = '', wait_kind = $2, wait_key = $3, wait_seq = $4, "
               "wake_at_ms = $5, updated_at_ms = $6 WHERE id = $1 AND status NOT IN ('completed', 'failed', "
               "'cancelled')",
               id, w.kind, w.key, seq, w.wake_at_ms, now_ms())
            .affected() == 0)
      throw finished_error(id, j.status_of(id), "make it wait");
    j.notify(change::waiting, id);
    tx.commit();
    j.held.end(id);
  });
}

void postgres_journal::release_run(std::string_view id) {
  auto& j = *impl_;
  j.guard(id, [&] {
    impl::txn tx(j);
    j.fence(id);
    if (j.exec("UPDATE runs SET status = 'pending', owner = '', updated_at_ms = $2, wait_kind = NULL, "
               "wait_key = NULL, wait_seq = NULL, wake_at_ms = NULL "
               "WHERE id = $1 AND status NOT IN ('completed', 'failed', 'cancelled')",
               id, now_ms())
            .affected() == 0)
      throw finished_error(id, j.status_of(id), "release it");
    j.notify(change::released, id);
    tx.commit();
    j.held.end(id);
  });
}

cancel_mark postgres_journal::request_cancel(std::string_view id, std::string_view reason) {
  auto& j = *impl_;
  return j.guard(id, [&] {
    impl::txn tx(j);
    if (is_finished(j.status_of(id, "SELECT status FROM runs WHERE id = $1 FOR NO KEY UPDATE")))
      return cancel_mark::run_finished;
    const auto now = now_ms();
    if (j.exec("UPDATE runs SET cancel_requested_at_ms = $2, cancel_reason = $3, updated_at_ms = $2 "
               "WHERE id = $1 AND cancel_requested_at_ms IS NULL",
               id, now, reason)
            .affected() == 0)
      return cancel_mark::marked_before;
    j.notify(change::cancel_requested, id);
    tx.commit();
    return cancel_mark::marked_now;
  });
}

bool postgres_journal::cancel_idle_run(std::string_view id, const std::string& message) {
  auto& j = *impl_;
  return j.guard(id, [&] {
    impl::txn tx(j);
    const auto now = now_ms();
    auto r = j.exec("UPDATE runs SET status = 'cancelled', error_message = $2, error_type = 'cancelled', "
                    "finished_at_ms = $3, updated_at_ms = $3, wait_kind = NULL, wait_key = NULL, wait_seq = NULL, "
                    "wake_at_ms = NULL WHERE id = $1 AND status IN ('pending', 'waiting') AND owner = '' "
                    "RETURNING parent_id",
                    id, message, now);
    if (r.rows() == 0) {
      j.status_of(id);  // not_found if there is no such run
      return false;
    }
    j.notify_ended(id, text_or_null(pg_row{r, 0}, 0));
    tx.commit();
    return true;
  });
}

std::vector<run_brief> postgres_journal::schedulable(std::int64_t now) {
  auto& j = *impl_;
  return j.guard({}, [&] {
    auto r = j.exec("SELECT id, status, owner, parent_id, workspace_host, created_at_ms, row_order FROM runs "
                    "  WHERE status IN ('pending', 'running') "
                    "UNION ALL "
                    "SELECT id, status, owner, parent_id, workspace_host, created_at_ms, row_order FROM runs AS r "
                    "  WHERE status = 'waiting' AND ("
                    "  wake_at_ms <= $1 OR deadline_ms <= $1 OR cancel_requested_at_ms IS NOT NULL "
                    "  OR (wait_kind = 'signal' AND EXISTS (SELECT 1 FROM signals AS s WHERE s.run_id = r.id "
                    "      AND s.name = r.wait_key AND s.delivered_seq IS NULL)) "
                    "  OR (wait_kind = 'child' AND EXISTS (SELECT 1 FROM runs AS c WHERE c.id = r.wait_key "
                    "      AND c.status IN ('completed', 'failed', 'cancelled')))) "
                    "ORDER BY created_at_ms, row_order",
                    now);
    std::vector<run_brief> runs;
    for (int i = 0; i < r.rows(); ++i) {
      const pg_row row{r, i};
      run_brief b;
      b.id = row.text(0);
      b.status = *parse_run_status(row.text(1));  // one of the three above
      b.owner = row.text(2);
      if (!row.null(3)) b.parent_id = row.text(3);
      b.workspace_host = row.text(4);
      runs.push_back(std::move(b));
    }
    return runs;
  });
}

std::optional<std::int64_t> postgres_journal::next_due_ms(std::int64_t after) {
  auto& j = *impl_;
  return j.guard({}, [&]() -> std::optional<std::int64_t> {
    auto r = j.exec("SELECT least((SELECT min(wake_at_ms) FROM runs WHERE status = 'waiting' AND wake_at_ms > $1), "
                    "(SELECT min(deadline_ms) FROM runs WHERE status = 'waiting' AND deadline_ms > $1))",
                    after);
    return int64_or_null(pg_row{r, 0}, 0);
  });
}

std::map<run_status, int> postgres_journal::count_by_status() {
  auto& j = *impl_;
  return j.guard({}, [&] {
    std::map<run_status, int> counts;
    using enum run_status;
    for (auto st : {pending, running, waiting, completed, failed, cancelled, in_doubt}) counts[st] = 0;
    auto r = j.exec("SELECT status, count(*) FROM runs GROUP BY status");
    for (int i = 0; i < r.rows(); ++i) {
      const pg_row row{r, i};
      auto status = parse_run_status(row.text(0));
      if (!status)
        throw storage_error(errc::corrupt,
                            fmt::format("journal {} has a run with an unknown status '{}'", j.name, row.text(0)));
      counts[*status] = static_cast<int>(row.int64(1));
    }
    return counts;
  });
}

signal_record postgres_journal::enqueue_signal(std::string_view run_id, std::string_view name, const json& payload,
                                               std::uint64_t max_signals) {
  auto& j = *impl_;
  return j.guard(run_id, [&] {
    impl::txn tx(j);
    // The run's row lock orders concurrent senders: they cannot overshoot max_signals.
    const auto status = j.status_of(run_id, "SELECT status FROM runs WHERE id = $1 FOR NO KEY UPDATE");
    if (is_finished(status))
      throw storage_error(errc::finished, fmt::format("run {} already finished ({}); nobody will read signal '{}'",
                                                      run_id, to_string(status), name));
    auto held = j.exec("SELECT count(*) FROM signals WHERE run_id = $1", run_id);
    const std::int64_t count = pg_row{held, 0}.int64(0);
    if (static_cast<std::uint64_t>(count) >= max_signals) throw signal_limit_error(run_id, count, name);
    signal_record r{0, std::string(run_id), std::string(name), payload, now_ms(), std::nullopt, std::nullopt};
    auto id = j.exec("INSERT INTO signals (run_id, name, payload, sent_at_ms) VALUES ($1, $2, $3, $4) RETURNING id",
                     run_id, name, dump(payload), r.sent_at_ms);
    r.id = pg_row{id, 0}.int64(0);
    j.notify(change::signalled, run_id);
    tx.commit();
    return r;
  });
}

bool postgres_journal::has_pending_signal(std::string_view run_id, std::string_view name) {
  auto& j = *impl_;
  return j.guard(run_id, [&] {
    return j.exec("SELECT 1 FROM signals WHERE run_id = $1 AND name = $2 AND delivered_seq IS NULL LIMIT 1", run_id,
                  name)
               .rows() > 0;
  });
}

std::optional<signal_record> postgres_journal::pending_signal(std::string_view run_id, std::string_view name) {
  auto& j = *impl_;
  return j.guard(run_id, [&]() -> std::optional<signal_record> {
    auto r = j.exec(j.query(fmt::format("SELECT {} FROM signals WHERE run_id = $1 AND name = $2 AND delivered_seq IS "
                                        "NULL ORDER BY id LIMIT 1",
                                        signal_columns)),
                    run_id, name);
    if (r.rows() == 0) return std::nullopt;
    return read_signal(pg_row{r, 0});
  });
}

void postgres_journal::deliver_signal(std::int64_t signal_id, const step_record& step) {
  const auto seq = static_cast<std::int64_t>(step.result.seq);
  auto& j = *impl_;
  j.guard(step.run_id, [&] {
    // The check and both writes share one transaction, the signal's row
    // locked: two workers racing to deliver it cannot both succeed.
    impl::txn tx(j);
    j.fence(step.run_id);
    auto r = j.exec("SELECT run_id, name, delivered_seq FROM signals WHERE id = $1 FOR UPDATE", signal_id);
    if (r.rows() == 0) throw storage_error(errc::not_found, fmt::format("no signal {} in journal {}", signal_id, j.name));
    const pg_row row{r, 0};
    if (row.text(0) != step.run_id)
      throw std::invalid_argument(fmt::format("deliver_signal: signal {} belongs to run {}, not {}", signal_id,
                                              row.text(0), step.run_id));
    const std::string name = row.text(1);
    if (!row.null(2)) throw signal_delivered_error(signal_id, name, step.run_id, row.int64(2));
    j.exec("UPDATE signals SET delivered_seq = $2, delivered_at_ms = $3 WHERE id = $1", signal_id, seq, now_ms());
    j.insert_step(step);
    tx.commit();
  });
}

std::vector<signal_record> postgres_journal::signals(std::string_view run_id) {
  auto& j = *impl_;
  return j.guard(run_id, [&] {
    auto r = j.exec(j.query(fmt::format("SELECT {} FROM signals WHERE run_id = $1 ORDER BY id", signal_columns)), run_id);
    std::vector<signal_record> out;
    for (int i = 0; i < r.rows(); ++i) out.push_back(read_signal(pg_row{r, i}));
    return out;
  });
}

void postgres_journal::append_step(const step_record& step) {
  impl_->guard(step.run_id, [&] { impl_->insert_step(step); });
}

std::vector<step_record> postgres_journal::steps(std::string_view run_id) {
  return steps_from(run_id, 0, UINT64_MAX, UINT64_MAX);
}

std::vector<step_record> postgres_journal::steps_from(std::string_view run_id, std::uint64_t from_seq,
                                                      std::uint64_t end_seq, std::uint64_t max_bytes) {
  auto& j = *impl_;
  return j.guard(run_id, [&] {
    auto r = j.exec(j.query(fmt::format("SELECT {} FROM steps WHERE run_id = $1 AND seq >= $2 AND seq < $3 ORDER BY seq",
                                        step_columns)),
                    run_id, static_cast<std::int64_t>(std::min<std::uint64_t>(from_seq, INT64_MAX)),
                    static_cast<std::int64_t>(std::min<std::uint64_t>(end_seq, INT64_MAX)));
    const auto payloads = j.payloads_of(run_id);
    std::vector<step_record> steps;
    std::uint64_t bytes = 0;
    for (int i = 0; i < r.rows(); ++i) {
      auto step = read_step(pg_row{r, i}, run_id, payloads, &bytes);
      if (!steps.empty() && bytes > max_bytes) break;
      steps.push_back(std::move(step));
    }
    return steps;
  });
}

void postgres_journal::append_event(std::string_view run_id, std::string_view kind, const json& data,
                                    std::optional<std::uint64_t> seq) {
  std::optional<std::int64_t> s;
  if (seq) s = static_cast<std::int64_t>(*seq);
  impl_->guard(run_id, [&] { impl_->fenced(run_id, [&] { impl_->event(run_id, kind, data, s); }); });
}

std::vector<event_record> postgres_journal::events(std::string_view run_id) {
  auto& j = *impl_;
  return j.guard(run_id, [&] {
    auto r = j.exec(j.query(fmt::format("SELECT {} FROM events WHERE run_id = $1 ORDER BY id", event_columns)), run_id);
    return j.read_events(r, run_id);
  });
}

std::vector<event_record> postgres_journal::events_of_kinds(std::string_view run_id,
                                                           std::span<const std::string_view> kinds) {
  auto& j = *impl_;
  return j.guard(run_id, [&] {
    const std::string names = dump(json(std::vector<std::string>(kinds.begin(), kinds.end())));
    auto r = j.exec(j.query(fmt::format("SELECT {} FROM events WHERE run_id = $1 AND kind IN (SELECT "
                                        "jsonb_array_elements_text($2::jsonb)) ORDER BY id",
                                        event_columns)),
                    run_id, names);
    return j.read_events(r, run_id);
  });
}

std::vector<event_record> postgres_journal::events_from(std::string_view run_id, std::int64_t after_id,
                                                       std::uint64_t max_bytes) {
  auto& j = *impl_;
  return j.guard(run_id, [&] {
    // The rows whose text fits in max_bytes, counted by the server (the
    // first always): the result libpq holds stays within the bound. Their
    // payloads are read one at a time as the chunk is filled.
    auto r = j.exec(j.query(fmt::format(
                        "SELECT {} FROM (SELECT {}, sum(octet_length(kind) + octet_length(data)) OVER (ORDER BY id) "
                        "  AS upto, row_number() OVER (ORDER BY id) AS n FROM events WHERE run_id = $1 AND id > $2) e "
                        "WHERE upto <= $3 OR n = 1 ORDER BY id",
                        event_columns, event_columns)),
                    run_id, after_id, static_cast<std::int64_t>(std::min<std::uint64_t>(max_bytes, INT64_MAX)));
    const auto payloads = j.payloads_of(run_id);
    int i = 0;
    return bounded_events(
        [&](std::uint64_t& bytes) -> std::optional<event_record> {
          if (i == r.rows()) return std::nullopt;
          return read_event(pg_row{r, i++}, run_id, payloads, &bytes);
        },
        max_bytes);
  });
}

std::vector<event_record> postgres_journal::events_at(std::string_view run_id, std::uint64_t seq) {
  auto& j = *impl_;
  return j.guard(run_id, [&] {
    auto r = j.exec(
        j.query(fmt::format("SELECT {} FROM events WHERE run_id = $1 AND seq = $2 ORDER BY id", event_columns)), run_id,
        static_cast<std::int64_t>(seq));
    return j.read_events(r, run_id);
  });
}

std::uint64_t postgres_journal::step_count(std::string_view run_id) {
  auto& j = *impl_;
  return j.guard(run_id, [&] {
    auto r = j.exec("SELECT count(*) FROM steps WHERE run_id = $1", run_id);
    return static_cast<std::uint64_t>(pg_row{r, 0}.int64(0));
  });
}

std::uint64_t postgres_journal::bytes_of_run(std::string_view run_id) {
  auto& j = *impl_;
  return j.guard(run_id, [&]() -> std::uint64_t {
    auto r = j.exec("SELECT journal_bytes FROM run_states WHERE run_id = $1", run_id);
    return r.rows() == 0 ? 0 : static_cast<std::uint64_t>(pg_row{r, 0}.int64(0));
  });
}

std::optional<json> postgres_journal::run_state(std::string_view run_id) {
  auto& j = *impl_;
  return j.guard(run_id, [&]() -> std::optional<json> {
    auto r = j.exec("SELECT state FROM run_states WHERE run_id = $1", run_id);
    if (r.rows() == 0) throw no_run_error(run_id, j.name);
    const pg_row row{r, 0};
    if (row.null(0)) return std::nullopt;
    return load(row.text(0), fmt::format("the state of run {}", run_id));
  });
}

void postgres_journal::put_run_state(std::string_view run_id, const json& state) {
  auto& j = *impl_;
  j.guard(run_id, [&] {
    j.fenced(run_id, [&] {
      if (j.exec("UPDATE run_states SET state = $2 WHERE run_id = $1", run_id, dump(state)).affected() == 0)
        throw no_run_error(run_id, j.name);
    });
  });
}

void postgres_journal::assign_workspace(std::string_view id, const std::string& workspace,
                                        const std::string& workspace_host) {
  auto& j = *impl_;
  j.guard(id, [&] {
    impl::txn tx(j);
    j.fence(id);
    if (j.exec("UPDATE runs SET workspace = $2, workspace_host = $3, updated_at_ms = $4 WHERE id = $1 AND workspace = ''",
               id, workspace, workspace_host, now_ms())
            .affected() == 0) {
      j.status_of(id);  // not_found if there is no such run
      throw workspace_set_error(id, j.name);
    }
    tx.commit();
  });
}

run_record postgres_journal::delete_run(std::string_view id) {
  auto& j = *impl_;
  return j.guard(id, [&] {
    impl::txn tx(j);
    // The row locked against a claim, a cancel or a child made meanwhile;
    // the parent's against a resume that would wait for this child again.
    auto rows = j.runs("WHERE id = $1 FOR UPDATE", id);
    if (rows.empty()) throw no_run_error(id, j.name);
    run_record record = std::move(rows.front());
    deletion_check check;
    check.status = record.status;
    check.owner = record.owner;
    check.parent_id = record.parent_id;
    if (!record.parent_id.empty()) {
      auto parent = j.exec("SELECT status FROM runs WHERE id = $1 FOR SHARE", record.parent_id);
      if (parent.rows() == 1) check.parent_status = parse_run_status(pg_row{parent, 0}.text(0));
    }
    auto child = j.exec("SELECT id, status FROM runs WHERE parent_id = $1 AND status NOT IN ('completed', 'failed', "
                        "'cancelled') LIMIT 1",
                        id);
    if (child.rows() == 1) {
      check.unfinished_child = pg_row{child, 0}.text(0);
      check.child_status = parse_run_status(pg_row{child, 0}.text(1)).value_or(run_status::pending);
    }
    check_deletable(id, check);
    // The run's row goes last: its status lets the steps go (schema 9's trigger).
    // A blob another run stores meanwhile is stored again: its insert waits
    // for this transaction and finds no conflict once it commits.
    for (const char* sql : {"DELETE FROM blobs WHERE digest IN (SELECT digest FROM run_blobs WHERE run_id = $1) "
                            "AND NOT EXISTS (SELECT 1 FROM run_blobs o WHERE o.digest = blobs.digest AND o.run_id <> $1)",
                            "DELETE FROM run_blobs WHERE run_id = $1",
                            "DELETE FROM payloads WHERE run_id = $1", "DELETE FROM events WHERE run_id = $1",
                            "DELETE FROM signals WHERE run_id = $1", "DELETE FROM steps WHERE run_id = $1",
                            "DELETE FROM run_states WHERE run_id = $1", "DELETE FROM runs WHERE id = $1"})
      j.exec(sql, id);
    tx.commit();
    return record;
  });
}

journal_space postgres_journal::space() {
  auto& j = *impl_;
  return j.guard({}, [&] {
    auto r = j.exec("SELECT pg_database_size(current_database())");
    return journal_space{static_cast<std::uint64_t>(pg_row{r, 0}.int64(0)), 0};
  });
}

journal_space postgres_journal::reclaim_space(std::uint64_t) {
  // Outside any transaction, as VACUUM must be; it takes no lock a writer waits for.
  impl_->guard({}, [&] { impl_->run("VACUUM runs, run_states, steps, events, signals, payloads, blobs, run_blobs"); });
  return space();
}

void postgres_journal::put_blobs(std::string_view run_id, std::span<const blob> blobs,
                                 std::span<const std::string> used) {
  auto& j = *impl_;
  j.guard(run_id, [&] {
    impl::txn tx(j);
    if (j.exec("SELECT 1 FROM runs WHERE id = $1 FOR SHARE", run_id).rows() == 0) throw no_run_error(run_id, j.name);
    for (const auto& b : blobs)
      j.exec("INSERT INTO blobs (digest, size, data) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING", b.digest,
             static_cast<std::int64_t>(b.size), bytes{b.data});
    for (const auto& digest : used)
      j.exec("INSERT INTO run_blobs (run_id, digest) VALUES ($1, $2) ON CONFLICT DO NOTHING", run_id, digest);
    tx.commit();
  });
}

std::optional<blob> postgres_journal::find_blob(std::string_view digest) {
  auto& j = *impl_;
  return j.guard({}, [&]() -> std::optional<blob> {
    auto r = j.exec("SELECT size, data FROM blobs WHERE digest = $1", digest);
    if (r.rows() == 0) return std::nullopt;
    return blob{std::string(digest), static_cast<std::uint64_t>(pg_row{r, 0}.int64(0)),
                from_hex_bytea(pg_row{r, 0}.text(1))};
  });
}

void postgres_journal::register_worker(const worker_record& w) {
  auto& j = *impl_;
  j.guard({}, [&] {
    impl::txn tx(j);
    j.exec("INSERT INTO workers (id, host, workspace_root, started_at_ms, renewed_at_ms, lease_expires_at_ms, "
           "fenced_writes) VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (id) DO UPDATE SET host = EXCLUDED.host, "
           "workspace_root = EXCLUDED.workspace_root, started_at_ms = EXCLUDED.started_at_ms, "
           "renewed_at_ms = EXCLUDED.renewed_at_ms, lease_expires_at_ms = EXCLUDED.lease_expires_at_ms, "
           "fenced_writes = EXCLUDED.fenced_writes",
           w.id, w.host, w.workspace_root, w.started_at_ms, w.renewed_at_ms, w.lease_expires_at_ms, w.fenced_writes);
    j.exec(detail::forget_workers_sql, now_ms() - journal::forgotten_worker_ms);
    tx.commit();
  });
}

bool postgres_journal::renew_lease(std::string_view worker_id, std::int64_t lease_expires_at_ms,
                                   std::int64_t fenced_writes) {
  auto& j = *impl_;
  return j.guard({}, [&] {
    const auto now = now_ms();
    return j.exec("UPDATE workers SET renewed_at_ms = $2, lease_expires_at_ms = $3, fenced_writes = $4 "
                  "WHERE id = $1 AND lease_expires_at_ms > $2",
                  worker_id, now, lease_expires_at_ms, fenced_writes)
               .affected() == 1;
  });
}

void postgres_journal::remove_worker(std::string_view worker_id) {
  impl_->guard({}, [&] { impl_->exec("DELETE FROM workers WHERE id = $1", worker_id); });
}

std::vector<worker_record> postgres_journal::workers() {
  auto& j = *impl_;
  return j.guard({}, [&] {
    auto r = j.exec(j.query(std::string(worker_select) + "ORDER BY started_at_ms, id"));
    std::vector<worker_record> out;
    for (int i = 0; i < r.rows(); ++i) out.push_back(j.read_worker(r, i));
    return out;
  });
}

std::optional<worker_record> postgres_journal::find_worker(std::string_view worker_id) {
  auto& j = *impl_;
  return j.guard({}, [&]() -> std::optional<worker_record> {
    auto r = j.exec(j.query(std::string(worker_select) + "WHERE id = $1"), worker_id);
    if (r.rows() == 0) return std::nullopt;
    return j.read_worker(r, 0);
  });
}

journal_versions postgres_journal::versions() {
  auto& j = *impl_;
  return j.guard({}, [&] {
    journal_versions v;
    auto r = j.exec("SELECT key, value FROM journal_info");
    for (int i = 0; i < r.rows(); ++i) {
      const pg_row row{r, i};
      if (row.text(0) == "created_by") v.created_by = row.text(1);
      if (row.text(0) == "last_written_by") v.last_written_by = row.text(1);
    }
    return v;
  });
}

std::string postgres_journal::server_version() {
  auto& j = *impl_;
  return j.guard({}, [&] {
    j.reconnect_if_lost();
    // "15.18 (Debian 15.18-0+deb12u1)": the version is the first word.
    std::string version = PQparameterStatus(j.conn, "server_version");
    return "PostgreSQL " + version.substr(0, version.find(' '));
  });
}

std::unique_ptr<journal> open_journal(const fs::path& url, const journal_options& options) {
  return std::make_unique<postgres_journal>(url, options);
}

int schema_version() { return latest_version(); }

}  // namespace cairn::storage::postgres
