// The SQLite journal: storage::journal's calls on one connection
// (connection.hpp) to a database in WAL mode (schema.cpp).
#include "storage/sqlite/sqlite_journal.hpp"

#include <sqlite3.h>

#include <algorithm>
#include <functional>
#include <utility>

#include <SQLiteCpp/SQLiteCpp.h>
#include <fmt/format.h>

#include "storage/payloads.hpp"
#include "storage/records.hpp"
#include "storage/sqlite/connection.hpp"
#include "storage/sqlite/schema.hpp"

namespace cairn::storage::sqlite {
namespace fs = std::filesystem;
using namespace detail;

namespace {

const std::string run_select = fmt::format("SELECT {} FROM runs ", run_columns);
const std::string step_select = fmt::format("SELECT {} FROM steps ", step_columns);
const std::string signal_select = fmt::format("SELECT {} FROM signals ", signal_columns);
const std::string event_select = fmt::format("SELECT {} FROM events ", event_columns);

std::vector<event_record> read_events(SQLite::Statement& s, std::string_view run_id, const payload_lookup& payload);



class sqlite_journal final : public journal {
 public:
  sqlite_journal(const fs::path& path, const journal_options& options)
      : c_(path, options), data_version_(read_data_version()) {}

  const std::filesystem::path& path() const override { return c_.path(); }
  const journal_options& options() const override { return c_.options(); }
  int schema_version() const override { return latest_version(); }
  std::string_view backend() const override { return "sqlite"; }
  std::string server_version() override;
  journal_versions versions() override;
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
  bool others_wrote() override;
  void put_blobs(std::string_view run_id, std::span<const storage::blob> blobs,
                 std::span<const std::string> used) override;
  std::optional<storage::blob> find_blob(std::string_view digest) override;
  void register_worker(const worker_record& worker) override;
  bool renew_lease(std::string_view worker_id, std::int64_t lease_expires_at_ms, std::int64_t fenced_writes) override;
  void remove_worker(std::string_view worker_id) override;
  std::vector<worker_record> workers() override;
  std::optional<worker_record> find_worker(std::string_view worker_id) override;

  // For write_transaction (records.hpp).
  static constexpr const char* begin_statement = "BEGIN IMMEDIATE";
  bool grouped = false;  // inside write_together: what a write changes of the holds waits for the commit
  void run(const char* sql) { c_.run(sql); }

 private:
  using write_txn = write_transaction<sqlite_journal, SQLite::Exception>;

  void store(std::string_view run_id, const std::vector<payload>& pieces) {
    for (const auto& piece : pieces)
      c_.changed("INSERT OR IGNORE INTO payloads (run_id, digest, body) VALUES (?, ?, ?)", run_id, piece.digest,
                 blob{piece.body});
  }

  void event(std::string_view run_id, std::string_view kind, const json& data, std::optional<std::int64_t> seq) {
    auto split = split_payloads(data);
    store(run_id, split.pieces);
    c_.changed("INSERT INTO events (run_id, seq, kind, data, at_ms) VALUES (?, ?, ?, ?, ?)", run_id, seq, kind,
               dump(split.manifest), now_ms());
  }

  // The bodies of a run's payloads, by digest.
  payload_lookup payloads_of(std::string_view run_id) {
    return [this, run_id](const std::string& digest) -> std::optional<std::string> {
      auto body = c_.statement("SELECT body FROM payloads WHERE run_id = ? AND digest = ?", run_id, digest);
      if (!body.executeStep()) return std::nullopt;
      return body.getColumn(0).getString();
    };
  }

  void require_run(int changed, std::string_view run_id) {
    if (changed == 0) throw no_run_error(run_id, c_.path().string());
  }

  // The run's status; storage_error(not_found) if there is no such run.
  run_status status_of(std::string_view run_id) {
    auto s = c_.statement("SELECT status FROM runs WHERE id = ?", run_id);
    require_run(s.executeStep() ? 1 : 0, run_id);
    auto status = parse_run_status(s.getColumn(0).getString());
    if (!status) throw storage_error(errc::corrupt, fmt::format("run {} has an unknown status", run_id));
    return *status;
  }

  // Inside a write transaction: refuses the write if this object claimed the
  // run and someone has claimed it since. The claim stays, so every later
  // write is refused too.
  void fence(std::string_view run_id) {
    const holds::claim* h = held.find(run_id);
    if (!h) return;
    std::string owner;
    std::int64_t epoch = 0;
    bool found = false;
    {
      auto s = c_.statement("SELECT owner, epoch FROM runs WHERE id = ?", run_id);
      found = s.executeStep();
      if (found) {
        owner = s.getColumn(0).getString();
        epoch = s.getColumn(1).getInt64();
      }
    }
    require_run(found ? 1 : 0, run_id);
#ifdef CAIRN_TEST_UNSAFE_NO_EPOCH_FENCE  // cairn_unsafe_no_epoch_fence, with which storage_test must fail
    if (owner == h->owner) return;
#endif
    if (owner == h->owner && epoch == h->epoch) return;
    throw fenced_error(run_id, owner, epoch, h->epoch);
  }

  // `write` under the fence: in one transaction with the check when this
  // object holds the run, else as it is (a single statement commits alone).
  template <class F>
  void fenced(std::string_view run_id, F&& write) {
    if (!held.find(run_id)) return write();
    write_txn tx(*this);
    fence(run_id);
    write();
    tx.commit();
  }

  // Why an update guarded by "not finished" changed nothing.
  [[noreturn]] void throw_finished_or_missing(std::string_view run_id, std::string_view doing) {
    throw finished_error(run_id, status_of(run_id), doing);
  }

  // Inserts the step row; a (run, seq) already journaled is storage_error(conflict).
  void insert_step(const step_record& step) {
    const auto& r = step.result;
    const auto [out, message, type, pieces] = step_outcome_columns(r);
    store(step.run_id, pieces);
    try {
      c_.changed("INSERT INTO steps (run_id, seq, name, kind, status, output, error_message, error_type, attempt, "
                 "duration_us, started_at_ms, finished_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                 step.run_id, static_cast<std::int64_t>(r.seq), r.name, protocol::to_string(r.kind),
                 std::string_view(r.ok ? "ok" : "error"), out, message, type, r.attempt, r.duration_us,
                 step.started_at_ms, step.finished_at_ms);
    } catch (const SQLite::Exception& e) {
      if ((e.getExtendedErrorCode() & 0xff) != SQLITE_CONSTRAINT ||
          e.getExtendedErrorCode() == SQLITE_CONSTRAINT_FOREIGNKEY)
        throw;
      throw step_conflict_error(step.run_id, r.seq, c_.path().string());
    }
  }

  // Changes when another connection commits (this one's commits leave it).
  std::int64_t read_data_version() {
    return c_.guard({}, [&] { return c_.db().execAndGet("PRAGMA data_version").getInt64(); });
  }

  connection c_;
  holds held;  // the runs this object claimed
  std::int64_t data_version_;  // as others_wrote last read it
};

}  // namespace

std::vector<std::exception_ptr> sqlite_journal::write_together(std::span<const std::function<void(journal&)>> writes,
                                                        bool sync_later) {
  auto run = [this](const char* sql) { c_.guard({}, [&] { c_.run(sql); }); };
  // Whatever happens, the connection syncs again afterwards (one that
  // cannot must not write on: the exception ends the process).
  struct sync_again {
    connection* c;
    ~sync_again() {
      if (c) c->sync_as_asked();
    }
  } restore{sync_later ? &c_ : nullptr};
  if (sync_later) c_.sync_later();
  return group_commit(*this, writes,
                      {.run = run,
                       .in_transaction = [this] { return sqlite3_get_autocommit(c_.db().getHandle()) == 0; },
                       .begin = begin_statement,
                       .grouped = grouped,
                       .held = held});
}

std::pair<run_record, bool> sqlite_journal::create_run(const new_run& run) {
  return c_.guard(run.id, [&] {
    const auto now = now_ms();
    int inserted = 0;
    // A child is created for its parent's attempt: fenced by the parent's claim.
    fenced(run.parent_id, [&] {
      inserted = c_.changed(
          "INSERT INTO runs (id, agent, input, status, max_attempts, sandbox, workspace, "
          "created_at_ms, updated_at_ms, policy, parent_id, owner, deadline_ms, workspace_host) "
          "VALUES (?, ?, ?, 'pending', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
          run.id, run.agent, dump(run.input), run.max_attempts, run.sandbox, run.workspace, now, now, dump(run.policy),
          null_if_empty(run.parent_id), run.owner, run.deadline_ms, run.workspace_host);
    });
    auto record = find_run(run.id);
    if (!record) throw storage_error(errc::io, "run " + run.id + " vanished right after it was created");
    return std::pair{std::move(*record), inserted == 1};
  });
}

std::optional<run_record> sqlite_journal::find_run(std::string_view id) {
  return c_.guard(id, [&]() -> std::optional<run_record> {
    auto s = c_.statement((run_select + "WHERE id = ?").c_str(), id);
    if (!s.executeStep()) return std::nullopt;
    return read_run(sqlite_row{s});
  });
}

std::vector<run_record> sqlite_journal::children(std::string_view parent_id) {
  return c_.guard(parent_id, [&] {
    auto s = c_.statement((run_select + "WHERE parent_id = ? ORDER BY created_at_ms, rowid").c_str(), parent_id);
    std::vector<run_record> runs;
    while (s.executeStep()) runs.push_back(read_run(sqlite_row{s}));
    return runs;
  });
}

std::vector<run_record> sqlite_journal::runs_with_workspace_near(const std::string& folder) {
  return c_.guard({}, [&] {
    auto s = c_.statement((run_select + "WHERE " + detail::workspace_near_sql("?1")).c_str(), folder);
    std::vector<run_record> runs;
    while (s.executeStep()) runs.push_back(read_run(sqlite_row{s}));
    return runs;
  });
}

std::vector<run_record> sqlite_journal::list_runs(const run_query& q) {
  return c_.guard({}, [&] {
    // rowid breaks ties within a millisecond in insertion order. An absent
    // field's test is true. A next page has a statement of its own: behind
    // `?4 = '' OR` its bound could not seek runs_by_created, and each page
    // scanned every newer run (paging 100,000 runs read 5 million rows).
    static const std::string where = run_select +
        "WHERE (?1 IS NULL OR status = ?1) "
        "AND (?2 = '' OR agent = ?2 OR (substr(agent, -length(?2)) = ?2 AND substr(agent, -length(?2) - 1, 1) = '/')) "
        "AND (?3 IS NULL OR created_at_ms >= ?3) ";
    static const std::string order = "ORDER BY created_at_ms DESC, rowid DESC LIMIT ?5";
    static const std::string first_page = where + order;
    static const std::string next_page =
        where + "AND (created_at_ms, rowid) < (SELECT created_at_ms, rowid FROM runs WHERE id = ?4) " + order;
    std::optional<std::string> status;
    if (q.status) status = std::string(to_string(*q.status));
    auto s = c_.statement((q.before.empty() ? first_page : next_page).c_str(), status, q.agent, q.since_ms, q.before,
                          q.limit.value_or(-1));
    std::vector<run_record> runs;
    while (s.executeStep()) runs.push_back(read_run(sqlite_row{s}));
    return runs;
  });
}

bool sqlite_journal::claim_run(std::string_view id, std::string_view expected_owner, std::string_view new_owner) {
  return c_.guard(id, [&] {
    write_txn tx(*this);
    if (c_.changed("UPDATE runs SET status = 'running', owner = ?, epoch = epoch + 1, updated_at_ms = ?, "
                       "wait_kind = NULL, wait_key = NULL, wait_seq = NULL, wake_at_ms = NULL "
                       "WHERE id = ? AND owner = ? AND status NOT IN ('completed', 'cancelled')",
                       new_owner, now_ms(), id, expected_owner) != 1)
      return false;
    auto s = c_.statement("SELECT epoch FROM runs WHERE id = ?", id);
    s.executeStep();
    const std::int64_t epoch = s.getColumn(0).getInt64();
    tx.commit();
    held.take(id, {std::string(new_owner), epoch});
    return true;
  });
}

void sqlite_journal::confirm_held(std::string_view id) {
  c_.guard(id, [&] { fence(id); });
}

int sqlite_journal::begin_attempt(std::string_view id) {
  return c_.guard(id, [&] {
    write_txn tx(*this);
    fence(id);
    require_run(
        c_.changed("UPDATE runs SET attempts = attempts + 1, updated_at_ms = ? WHERE id = ?", now_ms(), id), id);
    auto s = c_.statement("SELECT attempts FROM runs WHERE id = ?", id);
    s.executeStep();
    const int attempt = s.getColumn(0).getInt();
    tx.commit();
    return attempt;
  });
}

void sqlite_journal::finish_run(std::string_view id, run_status status, const json& output,
                         const std::optional<protocol::error_info>& error) {
  check_finish(status, error);
  c_.guard(id, [&] {
    const bool ok = status == run_status::completed;
    const auto now = now_ms();
    write_txn tx(*this);
    fence(id);
    auto [out, message, type] = outcome_columns(ok, output, ok ? protocol::error_info{} : *error);
    require_run(
        c_.changed("UPDATE runs SET status = ?, output = ?, error_message = ?, error_type = ?, "
                       "owner = '', finished_at_ms = ?, updated_at_ms = ?, wait_kind = NULL, "
                       "wait_key = NULL, wait_seq = NULL, wake_at_ms = NULL WHERE id = ?",
                       to_string(status), out, message, type,
                       status == run_status::in_doubt ? std::optional<std::int64_t>() : std::optional(now), now, id),
        id);
    tx.commit();
    held.end(id);
  });
}

void sqlite_journal::reset_attempts(std::string_view id) {
  c_.guard(id, [&] {
    write_txn tx(*this);
    fence(id);
    require_run(c_.statement("SELECT 1 FROM runs WHERE id = ?", id).executeStep() ? 1 : 0, id);
    c_.changed(
        "UPDATE runs SET status = 'pending', attempts = 0, output = NULL, error_message = NULL, "
        "error_type = NULL, finished_at_ms = NULL, owner = '', wait_kind = NULL, wait_key = NULL, "
        "wait_seq = NULL, wake_at_ms = NULL, cancel_requested_at_ms = NULL, cancel_reason = NULL, updated_at_ms = ? "
        "WHERE id = ?",
        now_ms(), id);
    tx.commit();
    held.end(id);
  });
}

void sqlite_journal::suspend_run(std::string_view id, const wait_spec& w) {
  check_wait(w);
  const auto seq = static_cast<std::int64_t>(w.seq);
  c_.guard(id, [&] {
    write_txn tx(*this);
    fence(id);
    if (c_.changed(
            "UPDATE runs SET status = 'waiting', owner = '', wait_kind = ?, wait_key = ?, wait_seq = ?, "
            "wake_at_ms = ?, updated_at_ms = ? WHERE id = ? AND status NOT IN ('completed', 'failed', 'cancelled')",
            w.kind, w.key, seq, w.wake_at_ms, now_ms(), id) == 0)
      throw_finished_or_missing(id, "make it wait");
    tx.commit();
    held.end(id);
  });
}

void sqlite_journal::release_run(std::string_view id) {
  c_.guard(id, [&] {
    write_txn tx(*this);
    fence(id);
    if (c_.changed("UPDATE runs SET status = 'pending', owner = '', updated_at_ms = ?, wait_kind = NULL, "
                       "wait_key = NULL, wait_seq = NULL, wake_at_ms = NULL "
                       "WHERE id = ? AND status NOT IN ('completed', 'failed', 'cancelled')",
                       now_ms(), id) == 0)
      throw_finished_or_missing(id, "release it");
    tx.commit();
    held.end(id);
  });
}

cancel_mark sqlite_journal::request_cancel(std::string_view id, std::string_view reason) {
  return c_.guard(id, [&] {
    write_txn tx(*this);
    if (is_finished(status_of(id))) return cancel_mark::run_finished;
    const auto now = now_ms();
    if (c_.changed("UPDATE runs SET cancel_requested_at_ms = ?, cancel_reason = ?, updated_at_ms = ? "
                   "WHERE id = ? AND cancel_requested_at_ms IS NULL",
                   now, reason, now, id) == 0)
      return cancel_mark::marked_before;
    tx.commit();
    return cancel_mark::marked_now;
  });
}

bool sqlite_journal::cancel_idle_run(std::string_view id, const std::string& message) {
  return c_.guard(id, [&] {
    write_txn tx(*this);
    const auto now = now_ms();
    if (c_.changed("UPDATE runs SET status = 'cancelled', error_message = ?, error_type = 'cancelled', "
                       "finished_at_ms = ?, updated_at_ms = ?, wait_kind = NULL, wait_key = NULL, wait_seq = NULL, "
                       "wake_at_ms = NULL WHERE id = ? AND status IN ('pending', 'waiting') AND owner = ''",
                       message, now, now, id) == 0) {
      status_of(id);  // not_found if there is no such run
      return false;
    }
    tx.commit();
    return true;
  });
}

std::vector<run_brief> sqlite_journal::schedulable(std::int64_t now) {
  return c_.guard({}, [&] {
    // Finished runs cost nothing. Each waiting run costs one entry of the
    // runs_waiting index, plus one probe of signals_undelivered or of the runs
    // key if it waits for a signal or a child (about 1 ms per 1,000 of those).
    // INDEXED BY pins the plan: after an ANALYZE, SQLite would otherwise scan
    // every run, since most runs share a few finished statuses.
    auto s = c_.statement(
        "SELECT id, status, owner, parent_id, workspace_host, created_at_ms, rowid AS row FROM runs "
        "  INDEXED BY runs_by_wake WHERE status IN ('pending', 'running') "
        "UNION ALL "
        "SELECT id, status, owner, parent_id, workspace_host, created_at_ms, rowid FROM runs AS r "
        "  INDEXED BY runs_waiting WHERE status = 'waiting' AND ("
        "  wake_at_ms <= ?1 OR deadline_ms <= ?1 OR cancel_requested_at_ms IS NOT NULL "
        "  OR (wait_kind = 'signal' AND EXISTS (SELECT 1 FROM signals AS s WHERE s.run_id = r.id "
        "      AND s.name = r.wait_key AND s.delivered_seq IS NULL)) "
        "  OR (wait_kind = 'child' AND EXISTS (SELECT 1 FROM runs AS c WHERE c.id = r.wait_key "
        "      AND c.status IN ('completed', 'failed', 'cancelled')))) "
        "ORDER BY created_at_ms, row",
        now);
    std::vector<run_brief> runs;
    while (s.executeStep()) {
      run_brief b;
      b.id = s.getColumn(0).getString();
      b.status = *parse_run_status(s.getColumn(1).getString());  // one of the three above
      b.owner = s.getColumn(2).getString();
      if (!s.getColumn(3).isNull()) b.parent_id = s.getColumn(3).getString();
      b.workspace_host = s.getColumn(4).getString();
      runs.push_back(std::move(b));
    }
    return runs;
  });
}

std::optional<std::int64_t> sqlite_journal::next_due_ms(std::int64_t after) {
  return c_.guard({}, [&]() -> std::optional<std::int64_t> {
    // The first is a seek in runs_by_wake; the second scans runs_waiting,
    // which holds only the waiting runs and is covering.
    auto s = c_.statement(
        "SELECT min(t) FROM ("
        "  SELECT min(wake_at_ms) AS t FROM runs INDEXED BY runs_by_wake "
        "    WHERE status = 'waiting' AND wake_at_ms > ?1 "
        "  UNION ALL "
        "  SELECT min(deadline_ms) FROM runs INDEXED BY runs_waiting "
        "    WHERE status = 'waiting' AND deadline_ms > ?1)",
        after);
    if (!s.executeStep() || s.getColumn(0).isNull()) return std::nullopt;
    return s.getColumn(0).getInt64();
  });
}

std::map<run_status, int> sqlite_journal::count_by_status() {
  return c_.guard({}, [&] {
    std::map<run_status, int> counts;
    using enum run_status;
    for (auto st : {pending, running, waiting, completed, failed, cancelled, in_doubt}) counts[st] = 0;
    auto s = c_.statement("SELECT status, count(*) FROM runs GROUP BY status");
    while (s.executeStep()) {
      auto status = parse_run_status(s.getColumn(0).getString());
      if (!status)
        throw storage_error(errc::corrupt, fmt::format("journal {} has a run with an unknown status '{}'",
                                                       c_.path().string(), s.getColumn(0).getString()));
      counts[*status] = s.getColumn(1).getInt();
    }
    return counts;
  });
}

signal_record sqlite_journal::enqueue_signal(std::string_view run_id, std::string_view name, const json& payload,
                                     std::uint64_t max_signals) {
  return c_.guard(run_id, [&] {
    write_txn tx(*this);
    const auto status = status_of(run_id);
    if (is_finished(status))
      throw storage_error(errc::finished, fmt::format("run {} already finished ({}); nobody will read signal '{}'",
                                                      run_id, to_string(status), name));
    // Counted under the write lock: concurrent senders cannot overshoot.
    auto held = c_.statement("SELECT count(*) FROM signals WHERE run_id = ?", run_id);
    held.executeStep();
    if (static_cast<std::uint64_t>(held.getColumn(0).getInt64()) >= max_signals)
      throw signal_limit_error(run_id, held.getColumn(0).getInt64(), name);
    signal_record r{0, std::string(run_id), std::string(name), payload, now_ms(), std::nullopt, std::nullopt};
    c_.changed("INSERT INTO signals (run_id, name, payload, sent_at_ms) VALUES (?, ?, ?, ?)", run_id, name,
                   dump(payload), r.sent_at_ms);
    r.id = c_.db().getLastInsertRowid();
    tx.commit();
    return r;
  });
}

bool sqlite_journal::has_pending_signal(std::string_view run_id, std::string_view name) {
  return c_.guard(run_id, [&] {
    auto s = c_.statement("SELECT 1 FROM signals WHERE run_id = ? AND name = ? AND delivered_seq IS NULL LIMIT 1",
                              run_id, name);
    return s.executeStep();
  });
}

std::optional<signal_record> sqlite_journal::pending_signal(std::string_view run_id, std::string_view name) {
  return c_.guard(run_id, [&]() -> std::optional<signal_record> {
    auto s = c_.statement(
        (signal_select + "WHERE run_id = ? AND name = ? AND delivered_seq IS NULL ORDER BY id LIMIT 1").c_str(), run_id,
        name);
    if (!s.executeStep()) return std::nullopt;
    return read_signal(sqlite_row{s});
  });
}

void sqlite_journal::deliver_signal(std::int64_t signal_id, const step_record& step) {
  const auto seq = static_cast<std::int64_t>(step.result.seq);
  c_.guard(step.run_id, [&] {
    // The check and both writes share one write transaction: two hosts racing
    // to deliver the same signal cannot both succeed.
    write_txn tx(*this);
    fence(step.run_id);
    std::string name;
    {
      auto s = c_.statement("SELECT run_id, name, delivered_seq FROM signals WHERE id = ?", signal_id);
      if (!s.executeStep())
        throw storage_error(errc::not_found,
                            fmt::format("no signal {} in journal {}", signal_id, c_.path().string()));
      if (s.getColumn(0).getString() != step.run_id)
        throw std::invalid_argument(fmt::format("deliver_signal: signal {} belongs to run {}, not {}", signal_id,
                                                s.getColumn(0).getString(), step.run_id));
      name = s.getColumn(1).getString();
      if (!s.getColumn(2).isNull())
        throw signal_delivered_error(signal_id, name, step.run_id, s.getColumn(2).getInt64());
    }
    c_.changed("UPDATE signals SET delivered_seq = ?, delivered_at_ms = ? WHERE id = ?", seq, now_ms(), signal_id);
    insert_step(step);
    tx.commit();
  });
}

std::vector<signal_record> sqlite_journal::signals(std::string_view run_id) {
  return c_.guard(run_id, [&] {
    auto s = c_.statement((signal_select + "WHERE run_id = ? ORDER BY id").c_str(), run_id);
    std::vector<signal_record> out;
    while (s.executeStep()) out.push_back(read_signal(sqlite_row{s}));
    return out;
  });
}

void sqlite_journal::append_step(const step_record& step) {
  // Durable when it returns.
  c_.guard(step.run_id, [&] { fenced(step.run_id, [&] { insert_step(step); }); });
}

std::vector<step_record> sqlite_journal::steps(std::string_view run_id) {
  return c_.guard(run_id, [&] {
    auto s = c_.statement((step_select + "WHERE run_id = ? ORDER BY seq").c_str(), run_id);
    const auto payloads = payloads_of(run_id);
    std::vector<step_record> steps;
    while (s.executeStep()) steps.push_back(read_step(sqlite_row{s}, run_id, payloads));
    return steps;
  });
}

std::vector<step_record> sqlite_journal::steps_from(std::string_view run_id, std::uint64_t from_seq, std::uint64_t end_seq,
                                             std::uint64_t max_bytes) {
  return c_.guard(run_id, [&] {
    auto s = c_.statement((step_select + "WHERE run_id = ? AND seq >= ? AND seq < ? ORDER BY seq").c_str(), run_id,
                              static_cast<std::int64_t>(std::min<std::uint64_t>(from_seq, INT64_MAX)),
                              static_cast<std::int64_t>(std::min<std::uint64_t>(end_seq, INT64_MAX)));
    const auto payloads = payloads_of(run_id);
    std::vector<step_record> steps;
    std::uint64_t bytes = 0;
    while (s.executeStep()) {
      auto step = read_step(sqlite_row{s}, run_id, payloads, &bytes);
      if (!steps.empty() && bytes > max_bytes) break;
      steps.push_back(std::move(step));
    }
    return steps;
  });
}

void sqlite_journal::append_event(std::string_view run_id, std::string_view kind, const json& data,
                           std::optional<std::uint64_t> seq) {
  std::optional<std::int64_t> s;
  if (seq) s = static_cast<std::int64_t>(*seq);
  c_.guard(run_id, [&] { fenced(run_id, [&] { event(run_id, kind, data, s); }); });
}

std::vector<event_record> sqlite_journal::events(std::string_view run_id) {
  return c_.guard(run_id, [&] {
    auto s = c_.statement((event_select + "WHERE run_id = ? ORDER BY id").c_str(), run_id);
    return read_events(s, run_id, payloads_of(run_id));
  });
}

std::vector<event_record> sqlite_journal::events_of_kinds(std::string_view run_id,
                                                         std::span<const std::string_view> kinds) {
  return c_.guard(run_id, [&] {
    const std::string names = dump(json(std::vector<std::string>(kinds.begin(), kinds.end())));
    auto s = c_.statement(
        (event_select + "WHERE run_id = ? AND kind IN (SELECT value FROM json_each(?)) ORDER BY id").c_str(), run_id,
        names);
    return read_events(s, run_id, payloads_of(run_id));
  });
}

std::vector<event_record> sqlite_journal::events_from(std::string_view run_id, std::int64_t after_id,
                                                     std::uint64_t max_bytes) {
  return c_.guard(run_id, [&] {
    auto s = c_.statement((event_select + "WHERE run_id = ? AND id > ? ORDER BY id").c_str(), run_id, after_id);
    const auto payloads = payloads_of(run_id);
    return bounded_events(
        [&](std::uint64_t& bytes) -> std::optional<event_record> {
          if (!s.executeStep()) return std::nullopt;
          return read_event(sqlite_row{s}, run_id, payloads, &bytes);
        },
        max_bytes);
  });
}

std::vector<event_record> sqlite_journal::events_at(std::string_view run_id, std::uint64_t seq) {
  return c_.guard(run_id, [&] {
    auto s = c_.statement((event_select + "WHERE run_id = ? AND seq = ? ORDER BY id").c_str(), run_id,
                              static_cast<std::int64_t>(seq));
    return read_events(s, run_id, payloads_of(run_id));
  });
}

std::uint64_t sqlite_journal::step_count(std::string_view run_id) {
  return c_.guard(run_id, [&] {
    auto s = c_.statement("SELECT count(*) FROM steps WHERE run_id = ?", run_id);
    s.executeStep();
    return static_cast<std::uint64_t>(s.getColumn(0).getInt64());
  });
}

std::uint64_t sqlite_journal::bytes_of_run(std::string_view run_id) {
  return c_.guard(run_id, [&]() -> std::uint64_t {
    auto s = c_.statement("SELECT journal_bytes FROM run_states WHERE run_id = ?", run_id);
    return s.executeStep() ? static_cast<std::uint64_t>(s.getColumn(0).getInt64()) : 0;
  });
}

std::optional<json> sqlite_journal::run_state(std::string_view run_id) {
  return c_.guard(run_id, [&]() -> std::optional<json> {
    auto s = c_.statement("SELECT state FROM run_states WHERE run_id = ?", run_id);
    require_run(s.executeStep() ? 1 : 0, run_id);
    if (s.getColumn(0).isNull()) return std::nullopt;
    return load(s.getColumn(0).getString(), fmt::format("the state of run {}", run_id));
  });
}

void sqlite_journal::put_run_state(std::string_view run_id, const json& state) {
  c_.guard(run_id, [&] {
    fenced(run_id, [&] {
      require_run(c_.changed("UPDATE run_states SET state = ? WHERE run_id = ?", dump(state), run_id), run_id);
    });
  });
}

// --- Retention (schema 8) ---

run_record sqlite_journal::delete_run(std::string_view id) {
  return c_.guard(id, [&] {
    write_txn tx(*this);
    deletion_check check;
    auto record = find_run(id);
    if (!record) throw no_run_error(id, c_.path().string());
    check.status = record->status;
    check.owner = record->owner;
    check.parent_id = record->parent_id;
    if (!record->parent_id.empty()) {
      auto parent = c_.statement("SELECT status FROM runs WHERE id = ?", record->parent_id);
      if (parent.executeStep()) check.parent_status = parse_run_status(parent.getColumn(0).getString());
    }
    {
      auto child = c_.statement("SELECT id, status FROM runs WHERE parent_id = ? AND status NOT IN ('completed', "
                                "'failed', 'cancelled') LIMIT 1",
                                id);
      if (child.executeStep()) {
        check.unfinished_child = child.getColumn(0).getString();
        check.child_status = parse_run_status(child.getColumn(1).getString()).value_or(run_status::pending);
      }
    }
    check_deletable(id, check);
    // The run's row goes last: its status lets the steps go (schema 8's trigger).
    for (const char* sql : {"DELETE FROM blobs WHERE digest IN (SELECT digest FROM run_blobs WHERE run_id = ?1) "
                            "AND NOT EXISTS (SELECT 1 FROM run_blobs o WHERE o.digest = blobs.digest AND o.run_id <> ?1)",
                            "DELETE FROM run_blobs WHERE run_id = ?1",
                            "DELETE FROM payloads WHERE run_id = ?1", "DELETE FROM events WHERE run_id = ?1",
                            "DELETE FROM signals WHERE run_id = ?1", "DELETE FROM steps WHERE run_id = ?1",
                            "DELETE FROM run_states WHERE run_id = ?1", "DELETE FROM runs WHERE id = ?1"})
      c_.changed(sql, id);
    tx.commit();
    return std::move(*record);
  });
}

journal_space sqlite_journal::space() {
  return c_.guard({}, [&] {
    const auto pages = [&](const char* pragma) {
      return static_cast<std::uint64_t>(c_.db().execAndGet(pragma).getInt64());
    };
    const auto page = pages("PRAGMA page_size");
    return journal_space{pages("PRAGMA page_count") * page, pages("PRAGMA freelist_count") * page};
  });
}

journal_space sqlite_journal::reclaim_space(std::uint64_t max_bytes) {
  c_.guard({}, [&] {
    const auto page = static_cast<std::uint64_t>(c_.db().execAndGet("PRAGMA page_size").getInt64());
    const auto pages = std::max<std::uint64_t>(1, max_bytes / page);
    // Its own short write transaction: writers wait for one slice at most.
    c_.db().exec(fmt::format("PRAGMA incremental_vacuum({})", pages));
  });
  const auto left = space();
  // The file shrinks when a checkpoint copies the shorter database back;
  // PASSIVE waits for no reader or writer.
  if (left.free_bytes == 0)
    sqlite3_wal_checkpoint_v2(c_.db().getHandle(), nullptr, SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr);
  return left;
}

bool sqlite_journal::others_wrote() {
  const auto now = read_data_version();
  return std::exchange(data_version_, now) != now;
}

// --- Pieces of workspace files (schema 9) ---

void sqlite_journal::put_blobs(std::string_view run_id, std::span<const storage::blob> blobs,
                               std::span<const std::string> used) {
  c_.guard(run_id, [&] {
    write_txn tx(*this);
    require_run(c_.statement("SELECT 1 FROM runs WHERE id = ?", run_id).executeStep() ? 1 : 0, run_id);
    for (const auto& b : blobs)
      c_.changed("INSERT OR IGNORE INTO blobs (digest, size, data) VALUES (?, ?, ?)", b.digest,
                 static_cast<std::int64_t>(b.size), sqlite::blob{b.data});
    for (const auto& digest : used)
      c_.changed("INSERT OR IGNORE INTO run_blobs (run_id, digest) VALUES (?, ?)", run_id, digest);
    tx.commit();
  });
}

std::optional<storage::blob> sqlite_journal::find_blob(std::string_view digest) {
  return c_.guard({}, [&]() -> std::optional<storage::blob> {
    auto s = c_.statement("SELECT size, data FROM blobs WHERE digest = ?", digest);
    if (!s.executeStep()) return std::nullopt;
    const auto data = s.getColumn(1);
    return storage::blob{std::string(digest), static_cast<std::uint64_t>(s.getColumn(0).getInt64()),
                std::string(static_cast<const char*>(data.getBlob()), static_cast<std::size_t>(data.getBytes()))};
  });
}

// --- Workspaces assigned at first execution, workers and their leases (schema 6) ---

void sqlite_journal::assign_workspace(std::string_view id, const std::string& workspace, const std::string& workspace_host) {
  c_.guard(id, [&] {
    write_txn tx(*this);
    fence(id);
    if (c_.changed(
            "UPDATE runs SET workspace = ?, workspace_host = ?, updated_at_ms = ? WHERE id = ? AND workspace = ''",
            workspace, workspace_host, now_ms(), id) == 0) {
      status_of(id);  // not_found if there is no such run
      throw workspace_set_error(id, c_.path().string());
    }
    tx.commit();
  });
}

namespace {

// The columns read_worker reads; `runs` counts the runs the worker owns.
constexpr const char* worker_columns =
    "SELECT w.id, w.host, w.workspace_root, w.started_at_ms, w.renewed_at_ms, w.lease_expires_at_ms, "
    "w.fenced_writes, (SELECT count(*) FROM runs WHERE owner = w.id AND owner <> '') FROM workers AS w ";

worker_record read_worker(SQLite::Statement& s) {
  worker_record w;
  w.id = s.getColumn(0).getString();
  w.host = s.getColumn(1).getString();
  w.workspace_root = s.getColumn(2).getString();
  w.started_at_ms = s.getColumn(3).getInt64();
  w.renewed_at_ms = s.getColumn(4).getInt64();
  w.lease_expires_at_ms = s.getColumn(5).getInt64();
  w.fenced_writes = s.getColumn(6).getInt64();
  w.runs = s.getColumn(7).getInt();
  return w;
}

}  // namespace

void sqlite_journal::register_worker(const worker_record& w) {
  c_.guard({}, [&] {
    write_txn tx(*this);
    c_.changed(
        "INSERT OR REPLACE INTO workers (id, host, workspace_root, started_at_ms, renewed_at_ms, "
        "lease_expires_at_ms, fenced_writes) VALUES (?, ?, ?, ?, ?, ?, ?)",
        w.id, w.host, w.workspace_root, w.started_at_ms, w.renewed_at_ms, w.lease_expires_at_ms, w.fenced_writes);
    c_.changed(detail::forget_workers_sql, now_ms() - forgotten_worker_ms);
    tx.commit();
  });
}

bool sqlite_journal::renew_lease(std::string_view worker_id, std::int64_t lease_expires_at_ms, std::int64_t fenced_writes) {
  return c_.guard({}, [&] {
    // One statement: the check of the old expiry and the renewal are atomic,
    // so a lease another worker already saw expired is never revived.
    const auto now = now_ms();
    return c_.changed(
               "UPDATE workers SET lease_expires_at_ms = ?, renewed_at_ms = ?, fenced_writes = ? "
               "WHERE id = ? AND lease_expires_at_ms > ?",
               lease_expires_at_ms, now, fenced_writes, worker_id, now) == 1;
  });
}

void sqlite_journal::remove_worker(std::string_view worker_id) {
  c_.guard({}, [&] { c_.changed("DELETE FROM workers WHERE id = ?", worker_id); });
}

std::vector<worker_record> sqlite_journal::workers() {
  return c_.guard({}, [&] {
    auto s = c_.statement((std::string(worker_columns) + "ORDER BY w.started_at_ms, w.id").c_str());
    std::vector<worker_record> out;
    while (s.executeStep()) out.push_back(read_worker(s));
    return out;
  });
}

std::optional<worker_record> sqlite_journal::find_worker(std::string_view worker_id) {
  return c_.guard({}, [&]() -> std::optional<worker_record> {
    auto s = c_.statement((std::string(worker_columns) + "WHERE w.id = ?").c_str(), worker_id);
    if (!s.executeStep()) return std::nullopt;
    return read_worker(s);
  });
}

std::string sqlite_journal::server_version() { return fmt::format("SQLite {}", sqlite3_libversion()); }

journal_versions sqlite_journal::versions() {
  return c_.guard({}, [&] {
    journal_versions v;
    auto s = c_.statement("SELECT key, value FROM journal_info");
    while (s.executeStep()) {
      const auto key = s.getColumn(0).getString();
      if (key == "created_by") v.created_by = s.getColumn(1).getString();
      if (key == "last_written_by") v.last_written_by = s.getColumn(1).getString();
    }
    return v;
  });
}

namespace {

std::vector<event_record> read_events(SQLite::Statement& s, std::string_view run_id, const payload_lookup& payload) {
  std::vector<event_record> events;
  while (s.executeStep()) events.push_back(read_event(sqlite_row{s}, run_id, payload));
  return events;
}

}  // namespace


std::unique_ptr<journal> open_journal(const fs::path& path, const journal_options& options) {
  return std::make_unique<sqlite_journal>(path, options);
}

int schema_version() { return latest_version(); }

}  // namespace cairn::storage::sqlite
