// What both journal backends share (internal to storage/): the columns a
// record is read from, how a stored row becomes a record, the bounds stored
// JSON is loaded within, and the errors both give. A backend reads a row
// through any type with null(i), text(i) and int64(i) for column i.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "storage/journal.hpp"
#include "storage/payloads.hpp"

namespace cairn::storage::detail {

// What created_by records of a journal migrated from `schema` (0: one made
// new now, by this cairn).
std::string created_by(int schema);

// The JSON text the journal stores: json::dump(), invalid UTF-8 replaced.
std::string dump(const json& j);

// The value of a JSON column (nullopt when NULL), or null with `why` set when
// it is beyond what cairn ever stores or not JSON. `what` names the value.
json load_or_explain(const std::optional<std::string>& text, std::string_view what, std::string& why);
// As load_or_explain, but such a value is storage_error(unreadable).
json load(const std::optional<std::string>& text, std::string_view what);

// The output, error_message and error_type columns of a step or a run's
// outcome: the output's JSON when ok, else the error.
std::tuple<std::optional<std::string>, std::optional<std::string>, std::optional<std::string>> outcome_columns(
    bool ok, const json& output, const protocol::error_info& error);

// A step's output (payloads.hpp encode_output), error_message and
// error_type columns, and the payloads its output names.
struct step_outcome {
  std::optional<std::string> output, error_message, error_type;
  std::vector<payload> pieces;
};
step_outcome step_outcome_columns(const protocol::step_result& r);

// completed, failed and cancelled are final; in_doubt is not (settle resumes it).
protocol::step_kind parse_kind(const std::string& s);
std::optional<std::string> null_if_empty(std::string_view s);

template <class Row>
std::optional<std::string> text_or_null(const Row& row, int i) {
  if (row.null(i)) return std::nullopt;
  return row.text(i);
}
template <class Row>
std::optional<std::int64_t> int64_or_null(const Row& row, int i) {
  if (row.null(i)) return std::nullopt;
  return row.int64(i);
}

// Columns 0-25 of read_run, in this order.
inline constexpr const char* run_columns =
    "id, agent, input, status, output, error_message, error_type, attempts, max_attempts, owner, sandbox, "
    "workspace, created_at_ms, updated_at_ms, finished_at_ms, policy, parent_id, wait_kind, wait_key, wait_seq, "
    "wake_at_ms, cancel_requested_at_ms, deadline_ms, epoch, workspace_host, cancel_reason";

template <class Row>
run_record read_run(const Row& s) {
  run_record r;
  r.id = s.text(0);
  r.agent = s.text(1);
  auto field = [&](int column, const char* name) {
    return load_or_explain(text_or_null(s, column), fmt::format("the {} of run {}", name, r.id), r.unreadable);
  };
  r.input = field(2, "input");
  auto status = parse_run_status(s.text(3));
  if (!status) throw storage_error(errc::corrupt, "run " + r.id + " has an unknown status");
  r.status = *status;
  r.output = field(4, "output");
  if (!s.null(5)) r.error = protocol::error_info{s.text(5), s.text(6)};
  r.attempts = static_cast<int>(s.int64(7));
  r.max_attempts = static_cast<int>(s.int64(8));
  r.owner = s.text(9);
  r.sandbox = s.text(10);
  r.workspace = s.text(11);
  r.created_at_ms = s.int64(12);
  r.updated_at_ms = s.int64(13);
  r.finished_at_ms = int64_or_null(s, 14);
  r.policy = field(15, "policy");
  if (!s.null(16)) r.parent_id = s.text(16);
  if (!s.null(17))
    r.wait = wait_spec{s.text(17), s.text(18), static_cast<std::uint64_t>(s.int64(19)), int64_or_null(s, 20)};
  r.cancel_requested_at_ms = int64_or_null(s, 21);
  r.deadline_ms = int64_or_null(s, 22);
  r.epoch = s.int64(23);
  r.workspace_host = s.text(24);
  if (!s.null(25)) r.cancel_reason = s.text(25);
  return r;
}

// Columns 0-10 of read_step.
inline constexpr const char* step_columns =
    "seq, name, kind, status, output, error_message, error_type, attempt, duration_us, started_at_ms, "
    "finished_at_ms";

// The output of a step as the steps table keeps it (payloads.hpp
// encode_output), read through `body_of`; `bytes`, when given, has the
// payloads read added.
json load_output(const std::optional<std::string>& text, const payload_lookup& body_of, const std::string& what,
                 std::uint64_t* bytes = nullptr);

// `bytes`, when given, has the step's size added: its name, error and
// output, with the payloads its output names.
template <class Row>
step_record read_step(const Row& s, std::string_view run_id, const payload_lookup& body_of,
                      std::uint64_t* bytes = nullptr) {
  step_record rec;
  rec.run_id = std::string(run_id);
  auto& r = rec.result;
  r.seq = static_cast<std::uint64_t>(s.int64(0));
  r.name = s.text(1);
  r.kind = parse_kind(s.text(2));
  r.ok = s.text(3) == "ok";
  if (r.ok) {
    const auto text = text_or_null(s, 4);
    if (bytes) *bytes += r.name.size() + (text ? text->size() : 0);
    r.output = load_output(text, body_of, fmt::format("the output of step {} of run {}", r.seq, run_id), bytes);
  } else {
    r.error = {s.text(5), s.text(6)};
    if (bytes) *bytes += r.name.size() + r.error.message.size() + r.error.type.size();
  }
  r.attempt = static_cast<int>(s.int64(7));
  r.duration_us = s.int64(8);
  rec.started_at_ms = s.int64(9);
  rec.finished_at_ms = s.int64(10);
  return rec;
}

inline constexpr const char* signal_columns =
    "id, run_id, name, payload, sent_at_ms, delivered_seq, delivered_at_ms";

template <class Row>
signal_record read_signal(const Row& s) {
  signal_record r;
  r.id = s.int64(0);
  r.run_id = s.text(1);
  r.name = s.text(2);
  r.payload = load(text_or_null(s, 3), fmt::format("the payload of signal {} of run {}", r.id, r.run_id));
  r.sent_at_ms = s.int64(4);
  if (!s.null(5)) r.delivered_seq = static_cast<std::uint64_t>(s.int64(5));
  r.delivered_at_ms = int64_or_null(s, 6);
  return r;
}

// Columns 0-4 of read_event.
inline constexpr const char* event_columns = "id, seq, kind, data, at_ms";

// `body_of` returns the payload stored under a digest for the run, nullopt when there is none.
// `bytes`, when given, has the event's stored size added: its kind, its data's text and the
// bodies of the payloads it names.
template <class Row>
event_record read_event(const Row& s, std::string_view run_id, const payload_lookup& body_of,
                        std::uint64_t* bytes = nullptr) {
  event_record e;
  e.id = s.int64(0);
  e.run_id = std::string(run_id);
  if (!s.null(1)) e.seq = static_cast<std::uint64_t>(s.int64(1));
  e.kind = s.text(2);
  const auto text = text_or_null(s, 3);
  if (bytes) *bytes += e.kind.size() + (text ? text->size() : 0);
  const auto what = fmt::format("the data of event {} of run {}", e.id, run_id);
  e.data = join_payloads(load(text, what), body_of, what, bytes);
  e.at_ms = s.int64(4);
  return e;
}

// The events of journal::events_from out of `read` (the next event and its
// size, nullopt at the end): at least one, then as many as fit in max_bytes.
std::vector<event_record> bounded_events(const std::function<std::optional<event_record>(std::uint64_t& bytes)>& read,
                                         std::uint64_t max_bytes);


// The errors both backends give, named by what happened. `journal` names the
// database in the message.
storage_error no_run_error(std::string_view run_id, std::string_view journal);
storage_error fenced_error(std::string_view run_id, const std::string& owner, std::int64_t epoch,
                           std::int64_t held_epoch);
storage_error step_conflict_error(std::string_view run_id, std::uint64_t seq, std::string_view journal);
storage_error finished_error(std::string_view run_id, run_status status, std::string_view doing);
storage_error schema_too_new_error(std::string_view journal, int version, int latest);
storage_error signal_limit_error(std::string_view run_id, std::int64_t held, std::string_view name);
storage_error signal_delivered_error(std::int64_t signal_id, const std::string& name, std::string_view run_id,
                                     std::int64_t delivered_seq);
storage_error workspace_set_error(std::string_view run_id, std::string_view journal);

// What delete_run (journal.hpp) reads of a run before it deletes it: the
// run's status and owner, its parent's status when its parent's row
// exists, and a child of it that has not ended, if any.
struct deletion_check {
  run_status status = run_status::pending;
  std::string owner;
  std::string parent_id;
  std::optional<run_status> parent_status;
  std::string unfinished_child;  // "" when every child has ended
  run_status child_status = run_status::pending;
};
// Throws storage_error(unfinished) when delete_run must refuse the run.
void check_deletable(std::string_view run_id, const deletion_check& c);
// The argument checks of finish_run and suspend_run (std::invalid_argument).
void check_finish(run_status status, const std::optional<protocol::error_info>& error);
void check_wait(const wait_spec& w);

// A write transaction; inside write_together, a savepoint of the group's.
// Rolls back unless committed. Backend has run(const char*), whose failures
// are of type Failure, `grouped`, and its BEGIN statement as begin_statement.
template <class Backend, class Failure>
class write_transaction {
 public:
  explicit write_transaction(Backend& b) : b_(b) { b_.run(b_.grouped ? "SAVEPOINT write" : Backend::begin_statement); }
  ~write_transaction() {
    if (done_) return;
    try {
      if (b_.grouped) {
        b_.run("ROLLBACK TO write");
        b_.run("RELEASE write");
      } else {
        b_.run("ROLLBACK");
      }
    } catch (const Failure&) {
      // The transaction is gone already (an I/O error, a full disk, a lost connection).
    }
  }
  write_transaction(const write_transaction&) = delete;
  write_transaction& operator=(const write_transaction&) = delete;

  void commit() {
    b_.run(b_.grouped ? "RELEASE write" : "COMMIT");
    done_ = true;
  }

 private:
  Backend& b_;
  bool done_ = false;
};

// journal::register_worker's clean-up, on both backends ($1: the expiry
// before which a worker holding no run is forgotten).
inline constexpr const char* forget_workers_sql =
    "DELETE FROM workers WHERE lease_expires_at_ms < $1 AND NOT EXISTS (SELECT 1 FROM runs WHERE runs.owner = "
    "workers.id)";

// The SQL condition of journal::runs_with_workspace_near, `folder` being
// the parameter's placeholder: the same text on both backends.
std::string workspace_near_sql(const std::string& folder);

// The runs a journal object holds (journal::claim_run), each at the owner
// and epoch its claim set: what its fence compares the run's row with. A
// claim taken or a hold ended inside a group commit is seen at once by the
// later writes of that transaction (a run claimed and begun in one write is
// fenced by that claim, not by an older one), and counts beyond it only once
// the group commits; dropped with its write when that write is rolled back.
class holds {
 public:
  struct claim {
    std::string owner;
    std::int64_t epoch = 0;
  };
  // The claim on the run as a write made now sees it; nullptr: not held.
  const claim* find(std::string_view run_id) const;
  // After the write that made it committed (or, in a group, at once for
  // the group and for good when the group commits).
  void take(std::string_view run_id, claim c);
  void end(std::string_view run_id);

  // For a group commit: changes from open() on are pending; mark() and
  // roll_back_to() drop those of one write; commit() keeps, abandon() drops
  // what is pending.
  void open();
  std::size_t mark() const { return pending_.size(); }
  void roll_back_to(std::size_t mark);
  void commit();
  void abandon();

 private:
  std::unordered_map<std::string, claim> held_;
  struct change {
    std::string run_id;
    std::optional<claim> taken;  // nullopt: the hold ends
  };
  std::vector<change> pending_;
  bool open_ = false;
};

// A group commit (journal::write_together) on a backend: `run` executes a
// statement (BEGIN, SAVEPOINT member, ...; a failure is storage_error) and
// `in_transaction` says whether the group's transaction is still open (a
// full disk or a lost connection ends it). While the writes run, `grouped`
// is set, and the holds' changes wait for the commit.
struct group_commit_backend {
  std::function<void(const char* sql)> run;
  std::function<bool()> in_transaction;
  const char* begin;  // the statement that opens the transaction
  bool& grouped;
  holds& held;
};
std::vector<std::exception_ptr> group_commit(journal& self, std::span<const std::function<void(journal&)>> writes,
                                             const group_commit_backend& backend);

}  // namespace cairn::storage::detail
