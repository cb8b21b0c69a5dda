// The PostgreSQL backend of storage::journal (internal to storage/): every
// method has the contract of journal's method of the same name
// (journal.hpp); journal dispatches to it when its path is a URL. The schema
// and its migrations are at the top of postgres_journal.cpp.
//
// One object is one libpq connection. A call that finds the connection lost
// (a server restart) fails with storage_error(io) and the next call
// reconnects. Wake-ups (wakeup.hpp) are NOTIFYs on channel cairn_wake sent
// inside the transactions that cause them, so they are delivered at commit.
#pragma once

#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "storage/journal.hpp"
#include "storage/wakeup.hpp"

struct pg_conn;  // libpq's PGconn

namespace cairn::storage {

// The channel of wake-ups on PostgreSQL; the payload is "WHAT RUN_ID" (wakeup.hpp).
inline constexpr const char* wake_channel = "cairn_wake";

class postgres_journal {
 public:
  postgres_journal(const std::filesystem::path& url, journal_options options);
  ~postgres_journal();
  postgres_journal(const postgres_journal&) = delete;
  postgres_journal& operator=(const postgres_journal&) = delete;

  const std::filesystem::path& path() const;
  const journal_options& options() const;
  // The schema version this cairn writes on PostgreSQL.
  static int schema_version();

  // `self` is the journal the writes are given (it dispatches back here).
  std::vector<std::exception_ptr> write_together(journal& self,
                                                 std::span<const std::function<void(journal&)>> writes);
  std::pair<run_record, bool> create_run(const new_run& run);
  std::optional<run_record> find_run(std::string_view id);
  std::vector<run_record> list_runs();
  std::vector<run_record> children(std::string_view parent_id);
  std::vector<run_record> runs_with_workspace_near(const std::string& folder);
  bool claim_run(std::string_view id, std::string_view expected_owner, std::string_view new_owner);
  void confirm_held(std::string_view id);
  int begin_attempt(std::string_view id);
  void finish_run(std::string_view id, run_status status, const json& output,
                  const std::optional<protocol::error_info>& error);
  void reset_attempts(std::string_view id);
  void suspend_run(std::string_view id, const wait_spec& w);
  void release_run(std::string_view id, std::string_view reason);
  bool request_cancel(std::string_view id, std::string_view reason);
  bool cancel_idle_run(std::string_view id, const std::string& message);
  std::vector<run_brief> schedulable(std::int64_t now_ms);
  std::optional<std::int64_t> next_due_ms(std::int64_t after_ms);
  std::map<run_status, int> count_by_status();
  signal_record enqueue_signal(std::string_view run_id, std::string_view name, const json& payload,
                               std::uint64_t max_signals);
  std::optional<signal_record> pending_signal(std::string_view run_id, std::string_view name);
  bool has_pending_signal(std::string_view run_id, std::string_view name);
  void deliver_signal(std::int64_t signal_id, const step_record& step);
  std::vector<signal_record> signals(std::string_view run_id);
  void append_step(const step_record& step);
  std::vector<step_record> steps(std::string_view run_id);
  std::vector<step_record> steps_from(std::string_view run_id, std::uint64_t from_seq, std::uint64_t end_seq,
                                      std::uint64_t max_bytes);
  void append_event(std::string_view run_id, std::string_view kind, const json& data,
                    std::optional<std::uint64_t> seq);
  std::vector<event_record> events(std::string_view run_id);
  std::vector<event_record> events_at(std::string_view run_id, std::uint64_t seq);
  std::uint64_t step_count(std::string_view run_id);
  std::uint64_t bytes_of_run(std::string_view run_id);
  void assign_workspace(std::string_view id, const std::string& workspace, const std::string& workspace_host);
  void register_worker(const worker_record& worker);
  bool renew_lease(std::string_view worker_id, std::int64_t lease_expires_at_ms, std::int64_t fenced_writes);
  void remove_worker(std::string_view worker_id);
  std::vector<worker_record> workers();
  std::optional<worker_record> find_worker(std::string_view worker_id);
  std::string server_version();

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

// A connection LISTENing on wake_channel for wake_listener (wakeup.hpp).
// Throws storage_error(io) when the server cannot be reached.
class postgres_listener {
 public:
  explicit postgres_listener(const std::string& url);
  ~postgres_listener();
  postgres_listener(const postgres_listener&) = delete;
  postgres_listener& operator=(const postgres_listener&) = delete;

  // Hands each wake-up heard to `on_wake` until `stop_fd` is readable. When
  // the connection is lost it tries again every second, and once back calls
  // on_wake with an empty run id: hints may have been missed meanwhile.
  void listen(int stop_fd, const std::function<void(const std::string& run_id, change what)>& on_wake);

 private:
  bool connect();
  std::string url_;
  ::pg_conn* conn_ = nullptr;
};

}  // namespace cairn::storage
