#include "storage/memory/memory_journal.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <mutex>
#include <thread>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "storage/payloads.hpp"
#include "storage/records.hpp"

namespace cairn::storage::memory {
namespace fs = std::filesystem;
using namespace detail;

namespace {

// A run's row with its insertion order (SQLite's rowid: ties within a millisecond).
struct run_row {
  run_record run;
  std::int64_t order = 0;
  std::optional<json> state = json::object();  // journal::run_state
};

// What a commit changed, undone in reverse order: a transaction's rollback,
// or a power cut forgetting a commit that was not synced.
using undo_log = std::vector<std::function<void()>>;

bool ends_with_slash_prefix(const std::string& longer, const std::string& shorter) {
  return longer.size() > shorter.size() && longer.compare(0, shorter.size(), shorter) == 0 &&
         longer[shorter.size()] == '/';
}

std::uint64_t stored_bytes(const std::optional<std::string>& text) { return text ? text->size() : 0; }

}  // namespace

struct database::state {
  std::string name;
  std::function<std::int64_t()> clock;
  std::recursive_timed_mutex mutex;  // held by a write transaction from BEGIN to its end

  std::map<std::string, run_row> runs;
  std::int64_t next_order = 1;
  std::map<std::string, std::map<std::uint64_t, step_record>> steps;  // by run, by seq
  std::map<std::string, std::vector<event_record>> events;             // by run, in id order
  std::int64_t next_event_id = 1;
  std::map<std::int64_t, signal_record> signals;
  std::int64_t next_signal_id = 1;
  std::map<std::string, std::map<std::string, std::uint64_t>> payloads;  // by run: digest -> its bytes
  std::map<std::string, worker_record> workers;
  std::map<std::string, blob> blobs;                         // by digest
  std::map<std::string, std::set<std::string>> blob_users;  // digest -> the runs that use it

  // The open write transaction's undo log, its savepoints (name, log size)
  // and the commits not synced yet, oldest first.
  undo_log log;
  std::vector<std::pair<std::string, std::size_t>> savepoints;
  std::vector<undo_log> unsynced;
  bool never_sync = false;
  std::function<void(fault_point)> fault;

  void undo_to(std::size_t mark) {
    while (log.size() > mark) {
      log.back()();
      log.pop_back();
    }
  }

  // Records how to put back what a write is about to change.
  void save_run(const std::string& id) {
    auto it = runs.find(id);
    std::optional<run_row> before;
    if (it != runs.end()) before = it->second;
    log.push_back([this, id, before = std::move(before)] {
      if (before) runs[id] = *before;
      else runs.erase(id);
    });
  }
  void save_signal(std::int64_t id) {
    auto before = signals.at(id);
    log.push_back([this, id, before = std::move(before)] { signals[id] = before; });
  }
  void save_worker(const std::string& id) {
    auto it = workers.find(id);
    std::optional<worker_record> before;
    if (it != workers.end()) before = it->second;
    log.push_back([this, id, before = std::move(before)] {
      if (before) workers[id] = *before;
      else workers.erase(id);
    });
  }
};

namespace {

class memory_journal final : public journal {
 public:
  memory_journal(std::shared_ptr<database::state> db, const journal_options& options)
      : db_(std::move(db)), path_("memory:" + db_->name), options_(options) {}
  ~memory_journal() override {
    if (lock_.owns_lock()) {
      db_->undo_to(0);
      db_->savepoints.clear();
    }
  }

  const fs::path& path() const override { return path_; }
  const journal_options& options() const override { return options_; }
  int schema_version() const override { return 1; }
  std::string_view backend() const override { return "memory"; }
  std::string server_version() override { return "in-memory journal"; }
  journal_versions versions() override { return {writer_name(), writer_name()}; }

  std::vector<std::exception_ptr> write_together(std::span<const std::function<void(journal&)>> writes,
                                                 bool sync_later) override {
    syncing_later_ = sync_later;
    auto errors = group_commit(*this, writes,
                               {.run = [this](const char* sql) { run(sql); },
                                .in_transaction = [this] { return lock_.owns_lock(); },
                                .begin = begin_statement,
                                .grouped = grouped,
                                .held = held_});
    syncing_later_ = false;
    return errors;
  }

  std::pair<run_record, bool> create_run(const new_run& run) override {
    write_txn tx(*this);
    fence(run.parent_id);
    bool inserted = false;
    if (!db_->runs.count(run.id)) {
      const auto now = db_->clock();
      run_record r;
      r.id = run.id;
      r.agent = run.agent;
      r.input = run.input;
      r.max_attempts = run.max_attempts;
      r.sandbox = run.sandbox;
      r.workspace = run.workspace;
      r.created_at_ms = r.updated_at_ms = now;
      r.policy = run.policy;
      r.parent_id = run.parent_id;
      r.owner = run.owner;
      r.deadline_ms = run.deadline_ms;
      r.workspace_host = run.workspace_host;
      db_->save_run(run.id);
      db_->runs[run.id] = {std::move(r), db_->next_order++};
      inserted = true;
    }
    auto record = db_->runs.at(run.id).run;
    tx.commit();
    return {std::move(record), inserted};
  }

  std::optional<run_record> find_run(std::string_view id) override {
    std::lock_guard lock(db_->mutex);
    auto it = db_->runs.find(std::string(id));
    if (it == db_->runs.end()) return std::nullopt;
    return it->second.run;
  }

  std::vector<run_record> list_runs(const run_query& q) override {
    const auto named = [&](const std::string& agent) {
      return agent == q.agent || (agent.size() > q.agent.size() && agent.ends_with(q.agent) &&
                                  agent[agent.size() - q.agent.size() - 1] == '/');
    };
    const auto matches = [&](const run_record& r) {
      return (!q.status || r.status == *q.status) && (q.agent.empty() || named(r.agent)) &&
             (!q.since_ms || r.created_at_ms >= *q.since_ms);
    };
    auto all = runs_where([](const run_record&) { return true; });
    std::reverse(all.begin(), all.end());  // newest first
    auto from = all.begin();
    if (!q.before.empty()) {
      from = std::find_if(all.begin(), all.end(), [&](const run_record& r) { return r.id == q.before; });
      if (from == all.end()) return {};  // no such run: no page after it
      ++from;
    }
    const auto limit = static_cast<std::size_t>(std::max<std::int64_t>(q.limit.value_or(INT64_MAX), 0));
    std::vector<run_record> out;
    for (auto it = from; it != all.end() && out.size() < limit; ++it)
      if (matches(*it)) out.push_back(std::move(*it));
    return out;
  }

  std::vector<run_record> children(std::string_view parent_id) override {
    return runs_where([&](const run_record& r) { return r.parent_id == parent_id; });
  }

  std::vector<run_record> runs_with_workspace_near(const std::string& folder) override {
    return runs_where([&](const run_record& r) {
      const auto& w = r.workspace;
      return !w.empty() && (w == folder || w == "/" || ends_with_slash_prefix(w, folder) ||
                            ends_with_slash_prefix(folder, w));
    });
  }

  bool claim_run(std::string_view id, std::string_view expected_owner, std::string_view new_owner) override {
    write_txn tx(*this);
    auto it = db_->runs.find(std::string(id));
    if (it == db_->runs.end()) return false;
    auto& r = it->second.run;
    if (r.owner != expected_owner || r.status == run_status::completed || r.status == run_status::cancelled)
      return false;
    db_->save_run(r.id);
    r.status = run_status::running;
    r.owner = std::string(new_owner);
    ++r.epoch;
    r.updated_at_ms = db_->clock();
    r.wait.reset();
    const auto epoch = r.epoch;
    tx.commit();
    held_.take(id, {std::string(new_owner), epoch});
    return true;
  }

  void confirm_held(std::string_view id) override {
    std::lock_guard lock(db_->mutex);
    fence(id);
  }

  int begin_attempt(std::string_view id) override {
    write_txn tx(*this);
    fence(id);
    auto& r = change_run(id);
    ++r.attempts;
    r.updated_at_ms = db_->clock();
    const int attempt = r.attempts;
    tx.commit();
    return attempt;
  }

  void finish_run(std::string_view id, run_status status, const json& output,
                  const std::optional<protocol::error_info>& error) override {
    check_finish(status, error);
    write_txn tx(*this);
    fence(id);
    const bool ok = status == run_status::completed;
    auto& r = change_run(id);
    const auto now = db_->clock();
    r.status = status;
    r.output = ok ? output : json();
    if (ok) r.error.reset();
    else r.error = error;
    r.owner.clear();
    r.finished_at_ms = status == run_status::in_doubt ? std::nullopt : std::optional(now);
    r.updated_at_ms = now;
    r.wait.reset();
    tx.commit();
    held_.end(id);
  }

  void reset_attempts(std::string_view id) override {
    write_txn tx(*this);
    fence(id);
    auto& r = change_run(id);
    r.status = run_status::pending;
    r.attempts = 0;
    r.output = json();
    r.error.reset();
    r.finished_at_ms.reset();
    r.owner.clear();
    r.wait.reset();
    r.cancel_requested_at_ms.reset();
    r.cancel_reason.clear();
    r.updated_at_ms = db_->clock();
    tx.commit();
    held_.end(id);
  }

  void suspend_run(std::string_view id, const wait_spec& w) override {
    check_wait(w);
    write_txn tx(*this);
    fence(id);
    auto& r = unfinished_run(id, "make it wait");
    r.status = run_status::waiting;
    r.owner.clear();
    r.wait = w;
    r.updated_at_ms = db_->clock();
    tx.commit();
    held_.end(id);
  }

  void release_run(std::string_view id) override {
    write_txn tx(*this);
    fence(id);
    auto& r = unfinished_run(id, "release it");
    r.status = run_status::pending;
    r.owner.clear();
    r.wait.reset();
    r.updated_at_ms = db_->clock();
    tx.commit();
    held_.end(id);
  }

  cancel_mark request_cancel(std::string_view id, std::string_view reason) override {
    write_txn tx(*this);
    if (is_finished(existing_run(id).status)) return cancel_mark::run_finished;
    if (existing_run(id).cancel_requested_at_ms) return cancel_mark::marked_before;
    auto& r = change_run(id);
    r.cancel_requested_at_ms = r.updated_at_ms = db_->clock();
    r.cancel_reason = std::string(reason);
    tx.commit();
    return cancel_mark::marked_now;
  }

  bool cancel_idle_run(std::string_view id, const std::string& message) override {
    write_txn tx(*this);
    const auto& now_run = existing_run(id);
    if ((now_run.status != run_status::pending && now_run.status != run_status::waiting) || !now_run.owner.empty())
      return false;
    auto& r = change_run(id);
    const auto now = db_->clock();
    r.status = run_status::cancelled;
    r.error = protocol::error_info{message, "cancelled"};
    r.finished_at_ms = r.updated_at_ms = now;
    r.wait.reset();
    tx.commit();
    return true;
  }

  std::vector<run_brief> schedulable(std::int64_t now) override {
    std::lock_guard lock(db_->mutex);
    std::vector<const run_row*> rows;
    for (const auto& [id, row] : db_->runs) {
      const auto& r = row.run;
      if (r.status == run_status::pending || r.status == run_status::running || (r.status == run_status::waiting && can_move(r, now)))
        rows.push_back(&row);
    }
    std::sort(rows.begin(), rows.end(), oldest_first);
    std::vector<run_brief> out;
    for (const auto* row : rows)
      out.push_back({row->run.id, row->run.status, row->run.owner, row->run.parent_id, row->run.workspace_host});
    return out;
  }

  std::optional<std::int64_t> next_due_ms(std::int64_t after) override {
    std::lock_guard lock(db_->mutex);
    std::optional<std::int64_t> due;
    auto consider = [&](const std::optional<std::int64_t>& t) {
      if (t && *t > after && (!due || *t < *due)) due = t;
    };
    for (const auto& [id, row] : db_->runs) {
      if (row.run.status != run_status::waiting) continue;
      if (row.run.wait) consider(row.run.wait->wake_at_ms);
      consider(row.run.deadline_ms);
    }
    return due;
  }

  std::map<run_status, int> count_by_status() override {
    std::lock_guard lock(db_->mutex);
    std::map<run_status, int> counts;
    using enum run_status;
    for (auto st : {pending, running, waiting, completed, failed, cancelled, in_doubt}) counts[st] = 0;
    for (const auto& [id, row] : db_->runs) ++counts[row.run.status];
    return counts;
  }

  signal_record enqueue_signal(std::string_view run_id, std::string_view name, const json& payload,
                               std::uint64_t max_signals) override {
    write_txn tx(*this);
    const auto status = existing_run(run_id).status;
    if (is_finished(status))
      throw storage_error(errc::finished, fmt::format("run {} already finished ({}); nobody will read signal '{}'",
                                                      run_id, to_string(status), name));
    std::int64_t held = 0;
    for (const auto& [id, s] : db_->signals) held += s.run_id == run_id ? 1 : 0;
    if (static_cast<std::uint64_t>(held) >= max_signals) throw signal_limit_error(run_id, held, name);
    signal_record r{db_->next_signal_id++, std::string(run_id), std::string(name), payload, db_->clock(),
                    std::nullopt, std::nullopt};
    db_->signals[r.id] = r;
    db_->log.push_back([db = db_.get(), id = r.id] { db->signals.erase(id); });
    tx.commit();
    return r;
  }

  std::optional<signal_record> pending_signal(std::string_view run_id, std::string_view name) override {
    std::lock_guard lock(db_->mutex);
    for (const auto& [id, s] : db_->signals)
      if (s.run_id == run_id && s.name == name && !s.delivered_seq) return s;
    return std::nullopt;
  }

  bool has_pending_signal(std::string_view run_id, std::string_view name) override {
    return pending_signal(run_id, name).has_value();
  }

  void deliver_signal(std::int64_t signal_id, const step_record& step) override {
    write_txn tx(*this);
    fence(step.run_id);
    auto it = db_->signals.find(signal_id);
    if (it == db_->signals.end())
      throw storage_error(errc::not_found, fmt::format("no signal {} in journal {}", signal_id, path_.string()));
    if (it->second.run_id != step.run_id)
      throw std::invalid_argument(fmt::format("deliver_signal: signal {} belongs to run {}, not {}", signal_id,
                                              it->second.run_id, step.run_id));
    const std::string name = it->second.name;
    if (it->second.delivered_seq)
      throw signal_delivered_error(signal_id, name, step.run_id, static_cast<std::int64_t>(*it->second.delivered_seq));
    db_->save_signal(signal_id);
    it->second.delivered_seq = step.result.seq;
    it->second.delivered_at_ms = db_->clock();
    insert_step(step);
    tx.commit();
  }

  std::vector<signal_record> signals(std::string_view run_id) override {
    std::lock_guard lock(db_->mutex);
    std::vector<signal_record> out;
    for (const auto& [id, s] : db_->signals)
      if (s.run_id == run_id) out.push_back(s);
    return out;
  }

  void append_step(const step_record& step) override {
    write_txn tx(*this);
    fence(step.run_id);
    insert_step(step);
    tx.commit();
  }

  std::vector<step_record> steps(std::string_view run_id) override {
    return steps_from(run_id, 0, UINT64_MAX, UINT64_MAX);
  }

  std::vector<step_record> steps_from(std::string_view run_id, std::uint64_t from_seq, std::uint64_t end_seq,
                                      std::uint64_t max_bytes) override {
    std::lock_guard lock(db_->mutex);
    std::vector<step_record> out;
    auto it = db_->steps.find(std::string(run_id));
    if (it == db_->steps.end()) return out;
    std::uint64_t bytes = 0;
    for (auto s = it->second.lower_bound(from_seq); s != it->second.end() && s->first < end_seq; ++s) {
      bytes += step_read_bytes(s->second);
      if (!out.empty() && bytes > max_bytes) break;
      out.push_back(s->second);
    }
    return out;
  }

  void append_event(std::string_view run_id, std::string_view kind, const json& data,
                    std::optional<std::uint64_t> seq) override {
    write_txn tx(*this);
    fence(run_id);
    existing_run(run_id);
    event(run_id, kind, data, seq);
    tx.commit();
  }

  std::vector<event_record> events(std::string_view run_id) override {
    std::lock_guard lock(db_->mutex);
    auto it = db_->events.find(std::string(run_id));
    return it == db_->events.end() ? std::vector<event_record>{} : it->second;
  }

  std::vector<event_record> events_of_kinds(std::string_view run_id,
                                           std::span<const std::string_view> kinds) override {
    std::lock_guard lock(db_->mutex);
    std::vector<event_record> out;
    if (auto it = db_->events.find(std::string(run_id)); it != db_->events.end())
      for (const auto& e : it->second)
        if (std::find(kinds.begin(), kinds.end(), e.kind) != kinds.end()) out.push_back(e);
    return out;
  }

  std::vector<event_record> events_from(std::string_view run_id, std::int64_t after_id,
                                        std::uint64_t max_bytes) override {
    std::lock_guard lock(db_->mutex);
    auto it = db_->events.find(std::string(run_id));
    if (it == db_->events.end()) return {};
    auto next = std::upper_bound(it->second.begin(), it->second.end(), after_id,
                                 [](std::int64_t id, const event_record& e) { return id < e.id; });
    return bounded_events(
        [&](std::uint64_t& bytes) -> std::optional<event_record> {
          if (next == it->second.end()) return std::nullopt;
          bytes = next->kind.size() + dump(next->data).size();
          return *next++;
        },
        max_bytes);
  }

  std::vector<event_record> events_at(std::string_view run_id, std::uint64_t seq) override {
    std::vector<event_record> out;
    for (auto& e : events(run_id))
      if (e.seq == seq) out.push_back(std::move(e));
    return out;
  }

  std::uint64_t step_count(std::string_view run_id) override {
    std::lock_guard lock(db_->mutex);
    auto it = db_->steps.find(std::string(run_id));
    return it == db_->steps.end() ? 0 : it->second.size();
  }

  std::uint64_t bytes_of_run(std::string_view run_id) override {
    std::lock_guard lock(db_->mutex);
    const std::string id(run_id);
    std::uint64_t bytes = 0;
    if (auto s = db_->steps.find(id); s != db_->steps.end())
      for (const auto& [seq, step] : s->second) bytes += step_bytes(step);
    if (auto e = db_->events.find(id); e != db_->events.end())
      for (const auto& ev : e->second) bytes += ev.kind.size() + dump(split_payloads(ev.data).manifest).size();
    if (auto p = db_->payloads.find(id); p != db_->payloads.end())
      for (const auto& [digest, size] : p->second) bytes += size;
    return bytes;
  }

  std::optional<json> run_state(std::string_view run_id) override {
    std::lock_guard lock(db_->mutex);
    existing_run(run_id);
    return db_->runs.at(std::string(run_id)).state;
  }

  void put_run_state(std::string_view run_id, const json& state) override {
    write_txn tx(*this);
    fence(run_id);
    existing_run(run_id);
    db_->save_run(std::string(run_id));
    db_->runs.at(std::string(run_id)).state = state;
    tx.commit();
  }

  void assign_workspace(std::string_view id, const std::string& workspace,
                        const std::string& workspace_host) override {
    write_txn tx(*this);
    fence(id);
    if (!existing_run(id).workspace.empty()) throw workspace_set_error(id, path_.string());
    auto& r = change_run(id);
    r.workspace = workspace;
    r.workspace_host = workspace_host;
    r.updated_at_ms = db_->clock();
    tx.commit();
  }

  run_record delete_run(std::string_view id) override {
    write_txn tx(*this);
    const run_record record = existing_run(id);
    deletion_check check{record.status, record.owner, record.parent_id, std::nullopt, "", run_status::pending};
    if (auto parent = db_->runs.find(record.parent_id); !record.parent_id.empty() && parent != db_->runs.end())
      check.parent_status = parent->second.run.status;
    for (const auto& [child_id, row] : db_->runs)
      if (row.run.parent_id == id && !is_finished(row.run.status)) {
        check.unfinished_child = child_id;
        check.child_status = row.run.status;
        break;
      }
    check_deletable(id, check);
    const std::string key(id);
    db_->save_run(key);
    db_->runs.erase(key);
    take_back(db_->steps, key);
    take_back(db_->events, key);
    take_back(db_->payloads, key);
    for (auto it = db_->blob_users.begin(); it != db_->blob_users.end();) {
      if (!it->second.contains(key)) {
        ++it;
        continue;
      }
      db_->log.push_back([db = db_.get(), digest = it->first, users = it->second] { db->blob_users[digest] = users; });
      it->second.erase(key);
      if (!it->second.empty()) {
        ++it;
        continue;
      }
      if (auto b = db_->blobs.find(it->first); b != db_->blobs.end()) {
        db_->log.push_back([db = db_.get(), kept = b->second] { db->blobs[kept.digest] = kept; });
        db_->blobs.erase(b);
      }
      it = db_->blob_users.erase(it);
    }
    for (auto it = db_->signals.begin(); it != db_->signals.end();) {
      if (it->second.run_id != id) {
        ++it;
        continue;
      }
      db_->log.push_back([db = db_.get(), signal = it->second] { db->signals[signal.id] = signal; });
      it = db_->signals.erase(it);
    }
    tx.commit();
    return record;
  }

  // Nothing on disk: a database of memory has no file to shrink.
  journal_space space() override { return {}; }
  journal_space reclaim_space(std::uint64_t) override { return {}; }
  bool others_wrote() override { return true; }

  void put_blobs(std::string_view run_id, std::span<const blob> blobs, std::span<const std::string> used) override {
    write_txn tx(*this);
    existing_run(run_id);
    for (const auto& b : blobs)
      if (db_->blobs.emplace(b.digest, b).second)
        db_->log.push_back([db = db_.get(), digest = b.digest] { db->blobs.erase(digest); });
    for (const auto& digest : used)
      if (db_->blob_users[digest].emplace(run_id).second)
        db_->log.push_back([db = db_.get(), digest, id = std::string(run_id)] { db->blob_users[digest].erase(id); });
    tx.commit();
  }

  std::optional<blob> find_blob(std::string_view digest) override {
    std::lock_guard lock(db_->mutex);
    auto it = db_->blobs.find(std::string(digest));
    if (it == db_->blobs.end()) return std::nullopt;
    return it->second;
  }

  void register_worker(const worker_record& w) override {
    write_txn tx(*this);
    db_->save_worker(w.id);
    db_->workers[w.id] = w;
    const auto forget_before = db_->clock() - forgotten_worker_ms;
    std::vector<std::string> forgotten;
    for (const auto& [id, worker] : db_->workers)
      if (worker.lease_expires_at_ms < forget_before && runs_owned_by(id) == 0) forgotten.push_back(id);
    for (const auto& id : forgotten) {
      db_->save_worker(id);
      db_->workers.erase(id);
    }
    tx.commit();
  }

  bool renew_lease(std::string_view worker_id, std::int64_t lease_expires_at_ms, std::int64_t fenced_writes) override {
    write_txn tx(*this);
    const auto now = db_->clock();
    auto it = db_->workers.find(std::string(worker_id));
    if (it == db_->workers.end() || it->second.lease_expires_at_ms <= now) return false;
    db_->save_worker(it->first);
    it->second.lease_expires_at_ms = lease_expires_at_ms;
    it->second.renewed_at_ms = now;
    it->second.fenced_writes = fenced_writes;
    tx.commit();
    return true;
  }

  void remove_worker(std::string_view worker_id) override {
    write_txn tx(*this);
    if (db_->workers.count(std::string(worker_id))) {
      db_->save_worker(std::string(worker_id));
      db_->workers.erase(std::string(worker_id));
    }
    tx.commit();
  }

  std::vector<worker_record> workers() override {
    std::lock_guard lock(db_->mutex);
    std::vector<worker_record> out;
    for (const auto& [id, w] : db_->workers) out.push_back(with_runs(w));
    std::sort(out.begin(), out.end(), [](const worker_record& a, const worker_record& b) {
      return std::tie(a.started_at_ms, a.id) < std::tie(b.started_at_ms, b.id);
    });
    return out;
  }

  std::optional<worker_record> find_worker(std::string_view worker_id) override {
    std::lock_guard lock(db_->mutex);
    auto it = db_->workers.find(std::string(worker_id));
    if (it == db_->workers.end()) return std::nullopt;
    return with_runs(it->second);
  }

  // The transaction statements write_transaction and group_commit run
  // (records.hpp), on the database's undo log.
  static constexpr const char* begin_statement = "BEGIN";
  bool grouped = false;
  void run(const char* sql) {
    const std::string_view s(sql);
    if (s == begin_statement) return begin();
    if (s.starts_with("SAVEPOINT ")) {
      db_->savepoints.emplace_back(std::string(s.substr(10)), db_->log.size());
      return;
    }
    if (s.starts_with("RELEASE ")) return release(s.substr(8));
    if (s.starts_with("ROLLBACK TO ")) return db_->undo_to(savepoint(s.substr(12)));
    if (s == "COMMIT") return commit();
    if (s == "ROLLBACK") return roll_back();
    throw std::logic_error(fmt::format("the in-memory journal has no statement '{}'", s));
  }

 private:
  using write_txn = write_transaction<memory_journal, storage_error>;

  void begin() {
    if (options_.read_only)
      throw storage_error(errc::read_only, fmt::format("journal {} was opened read-only", path_.string()));
    // Polled with try_lock, as SQLite's busy handler polls: a timed lock is
    // pthread_mutex_clocklock, which ThreadSanitizer (clang 15) does not
    // see, and then reports every unlock of it as one of an unlocked mutex.
    std::unique_lock lock(db_->mutex, std::defer_lock);
    const auto give_up = std::chrono::steady_clock::now() + options_.busy_timeout;
    while (!lock.try_lock()) {
      if (std::chrono::steady_clock::now() >= give_up)
        throw storage_error(errc::locked, fmt::format("journal {} is locked by another connection; wait for it to "
                                                      "finish",
                                                      path_.string()));
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    if (db_->fault) db_->fault(fault_point::begin);
    lock_ = std::move(lock);
    db_->log.clear();
    db_->savepoints.clear();
  }

  std::size_t savepoint(std::string_view name) const {
    for (auto it = db_->savepoints.rbegin(); it != db_->savepoints.rend(); ++it)
      if (it->first == name) return it->second;
    throw std::logic_error(fmt::format("the in-memory journal has no savepoint '{}'", name));
  }

  void release(std::string_view name) {
    savepoint(name);  // exists
    while (db_->savepoints.back().first != name) db_->savepoints.pop_back();
    db_->savepoints.pop_back();
  }

  void commit() {
    try {
      if (db_->fault) db_->fault(fault_point::commit);
    } catch (...) {
      roll_back();
      throw;
    }
    const bool synced = options_.sync == sync_mode::full && !syncing_later_ && !db_->never_sync;
    if (synced) db_->unsynced.clear();
    else if (!db_->log.empty()) db_->unsynced.push_back(std::move(db_->log));
    db_->log.clear();
    db_->savepoints.clear();
    lock_.unlock();
  }

  // Also when a failed commit has rolled back already.
  void roll_back() {
    if (!lock_.owns_lock()) return;
    db_->undo_to(0);
    db_->savepoints.clear();
    lock_.unlock();
  }

  static bool oldest_first(const run_row* a, const run_row* b) {
    return std::tie(a->run.created_at_ms, a->order) < std::tie(b->run.created_at_ms, b->order);
  }

  template <class Pred>
  std::vector<run_record> runs_where(Pred&& keep) {
    std::lock_guard lock(db_->mutex);
    std::vector<const run_row*> rows;
    for (const auto& [id, row] : db_->runs)
      if (keep(row.run)) rows.push_back(&row);
    std::sort(rows.begin(), rows.end(), oldest_first);
    std::vector<run_record> out;
    for (const auto* row : rows) out.push_back(row->run);
    return out;
  }

  // Whether a waiting run can move at `now` (journal::schedulable).
  bool can_move(const run_record& r, std::int64_t now) const {
    if (r.deadline_ms && *r.deadline_ms <= now) return true;
    if (r.cancel_requested_at_ms) return true;
    if (!r.wait) return false;
    if (r.wait->wake_at_ms && *r.wait->wake_at_ms <= now) return true;
    if (r.wait->kind == "signal")
      for (const auto& [id, s] : db_->signals)
        if (s.run_id == r.id && s.name == r.wait->key && !s.delivered_seq) return true;
    if (r.wait->kind == "child") {
      auto child = db_->runs.find(r.wait->key);
      return child != db_->runs.end() && is_finished(child->second.run.status);
    }
    return false;
  }

  int runs_owned_by(const std::string& worker) const {
    int n = 0;
    for (const auto& [id, row] : db_->runs) n += !row.run.owner.empty() && row.run.owner == worker ? 1 : 0;
    return n;
  }

  worker_record with_runs(worker_record w) const {
    w.runs = runs_owned_by(w.id);
    return w;
  }

  // The run; storage_error(not_found) if there is none.
  const run_record& existing_run(std::string_view id) const {
    auto it = db_->runs.find(std::string(id));
    if (it == db_->runs.end()) throw no_run_error(id, path_.string());
    return it->second.run;
  }

  // The run, to change inside the open write transaction (its old row is kept for a rollback).
  run_record& change_run(std::string_view id) {
    existing_run(id);
    db_->save_run(std::string(id));
    return db_->runs.at(std::string(id)).run;
  }

  run_record& unfinished_run(std::string_view id, std::string_view doing) {
    const auto status = existing_run(id).status;
    if (is_finished(status)) throw finished_error(id, status, doing);
    return change_run(id);
  }

  // Refuses the write if this object claimed the run and someone has
  // claimed it since (journal.hpp, claim_run).
  void fence(std::string_view run_id) {
    const holds::claim* h = held_.find(run_id);
    if (!h) return;
    const auto& r = existing_run(run_id);
#ifdef CAIRN_TEST_UNSAFE_NO_EPOCH_FENCE  // cairn_unsafe_memory_no_epoch_fence, with which the simulator must fail
    if (r.owner == h->owner) return;
#endif
    if (r.owner == h->owner && r.epoch == h->epoch) return;
    throw fenced_error(run_id, r.owner, r.epoch, h->epoch);
  }

  // Removes `key`'s entry of a by-run map inside the open write
  // transaction, kept in the undo log for a rollback.
  template <class Map>
  void take_back(Map& by_run, const std::string& key) {
    auto it = by_run.find(key);
    if (it == by_run.end()) return;
    db_->log.push_back([&by_run, key, kept = std::move(it->second)] { by_run[key] = kept; });
    by_run.erase(it);
  }

  // What steps_from counts of a step: its name, output and error, as read.
  static std::uint64_t step_read_bytes(const step_record& step) {
    const auto& r = step.result;
    auto [out, message, type] = outcome_columns(r.ok, r.output, r.error);
    return r.name.size() + stored_bytes(out) + stored_bytes(message) + stored_bytes(type);
  }

  // What the SQL backends store of a step: its row's columns (the payloads counted apart).
  static std::uint64_t step_bytes(const step_record& step) {
    const auto [out, message, type, pieces] = step_outcome_columns(step.result);
    return step.result.name.size() + stored_bytes(out) + stored_bytes(message) + stored_bytes(type);
  }

  void store(const std::string& id, const std::vector<payload>& pieces) {
    auto& payloads = db_->payloads[id];
    for (const auto& piece : pieces)
      if (payloads.emplace(piece.digest, piece.digest.size() + piece.body.size()).second)
        db_->log.push_back([db = db_.get(), id, digest = piece.digest] { db->payloads[id].erase(digest); });
  }

  void insert_step(const step_record& step) {
    existing_run(step.run_id);
    auto& of_run = db_->steps[step.run_id];
    if (of_run.count(step.result.seq)) throw step_conflict_error(step.run_id, step.result.seq, path_.string());
    store(step.run_id, step_outcome_columns(step.result).pieces);
    of_run.emplace(step.result.seq, step);
    db_->log.push_back([db = db_.get(), id = step.run_id, seq = step.result.seq] { db->steps[id].erase(seq); });
  }

  void event(std::string_view run_id, std::string_view kind, const json& data, std::optional<std::uint64_t> seq) {
    const std::string id(run_id);
    store(id, split_payloads(data).pieces);
    db_->events[id].push_back({db_->next_event_id++, id, seq, std::string(kind), data, db_->clock()});
    db_->log.push_back([db = db_.get(), id] { db->events[id].pop_back(); });
  }

  std::shared_ptr<database::state> db_;
  fs::path path_;
  journal_options options_;
  std::unique_lock<std::recursive_timed_mutex> lock_;  // while this object's write transaction is open
  holds held_;
  bool syncing_later_ = false;
};

}  // namespace

database::database(std::string name, std::function<std::int64_t()> clock) : state_(std::make_shared<state>()) {
  state_->name = std::move(name);
  state_->clock = std::move(clock);
}

database::~database() = default;

std::unique_ptr<journal> database::open(journal_options options) const {
  return std::make_unique<memory_journal>(state_, options);
}

void database::lose_power() {
  std::lock_guard lock(state_->mutex);
  for (auto it = state_->unsynced.rbegin(); it != state_->unsynced.rend(); ++it)
    for (auto undo = it->rbegin(); undo != it->rend(); ++undo) (*undo)();
  state_->unsynced.clear();
}

void database::inject_faults(std::function<void(fault_point)> hook) {
  std::lock_guard lock(state_->mutex);
  state_->fault = std::move(hook);
}

void database::never_sync(bool on) {
  std::lock_guard lock(state_->mutex);
  state_->never_sync = on;
}

std::size_t database::unsynced_commits() const {
  std::lock_guard lock(state_->mutex);
  return state_->unsynced.size();
}

}  // namespace cairn::storage::memory
