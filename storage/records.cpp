#include "storage/records.hpp"

#include <algorithm>
#include <stdexcept>

#include "protocol/bounded_json.hpp"
#include "protocol/version.hpp"
#include "storage/payloads.hpp"

namespace cairn::storage {

std::string writer_name() { return "cairn/" + std::string(protocol::cairn_version()); }

}  // namespace cairn::storage

namespace cairn::storage::detail {

std::string created_by(int schema) {
  return schema == 0 ? writer_name() : fmt::format("a cairn before 0.1.0 (schema {})", schema);
}

namespace {
// What cairn ever stores: values that fit in a frame.
constexpr protocol::json_bounds stored_bounds{protocol::max_depth, protocol::default_max_frame};
}  // namespace

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json load_or_explain(const std::optional<std::string>& text, std::string_view what, std::string& why) {
  if (!text) return json();
  try {
    return protocol::parse_bounded(*text, what, stored_bounds);
  } catch (const protocol::json_error& e) {
    why = fmt::format("{}; cairn never stores such a value (an older cairn or another program wrote it)", e.what());
    return json();
  }
}

json load(const std::optional<std::string>& text, std::string_view what) {
  std::string why;
  json value = load_or_explain(text, what, why);
  if (!why.empty()) throw storage_error(errc::unreadable, why);
  return value;
}

std::tuple<std::optional<std::string>, std::optional<std::string>, std::optional<std::string>> outcome_columns(
    bool ok, const json& output, const protocol::error_info& error) {
  if (ok) return {dump(output), std::nullopt, std::nullopt};
  return {std::nullopt, error.message, error.type};
}

step_outcome step_outcome_columns(const protocol::step_result& r) {
  if (!r.ok) return {std::nullopt, r.error.message, r.error.type, {}};
  auto stored = encode_output(r.output);
  return {std::move(stored.text), std::nullopt, std::nullopt, std::move(stored.pieces)};
}

protocol::step_kind parse_kind(const std::string& s) {
  if (auto k = protocol::parse_step_kind(s)) return *k;
  throw storage_error(errc::corrupt, "a journaled step has an unknown kind '" + s + "'");
}

std::optional<std::string> null_if_empty(std::string_view s) {
  if (s.empty()) return std::nullopt;
  return std::string(s);
}

json load_output(const std::optional<std::string>& text, const payload_lookup& body_of, const std::string& what,
                 std::uint64_t* bytes) {
  if (!text || !is_output_manifest(*text)) return load(text, what);
  return join_payloads(load(std::string(output_json(*text)), what), body_of, what, bytes);
}

std::vector<event_record> bounded_events(const std::function<std::optional<event_record>(std::uint64_t& bytes)>& read,
                                         std::uint64_t max_bytes) {
  std::vector<event_record> events;
  std::uint64_t total = 0;
  for (;;) {
    std::uint64_t bytes = 0;
    auto e = read(bytes);
    if (!e || (!events.empty() && total + bytes > max_bytes)) break;
    total += bytes;
    events.push_back(std::move(*e));
  }
  return events;
}

storage_error no_run_error(std::string_view run_id, std::string_view journal) {
  return {errc::not_found, fmt::format("no run '{}' in journal {}", run_id, journal)};
}

storage_error fenced_error(std::string_view run_id, const std::string& owner, std::int64_t epoch,
                           std::int64_t held_epoch) {
  return {errc::fenced, fmt::format("run {} was taken over by {} (epoch {}); this process (epoch {}) no longer "
                                    "holds it and writes nothing more to it",
                                    run_id, owner.empty() ? "another process, which has let it go since" : owner,
                                    epoch, held_epoch)};
}

storage_error step_conflict_error(std::string_view run_id, std::uint64_t seq, std::string_view journal) {
  return {errc::conflict, fmt::format("step {}/{} is already journaled in {}; a journaled step is final and is never "
                                      "written again",
                                      run_id, seq, journal)};
}

storage_error finished_error(std::string_view run_id, run_status status, std::string_view doing) {
  return {errc::finished, fmt::format("run {} already finished ({}); cannot {}", run_id, to_string(status), doing)};
}

void check_deletable(std::string_view run_id, const deletion_check& c) {
  if (!c.owner.empty())
    throw storage_error(errc::unfinished, fmt::format("run {} is {} and held by {}; cancel it first with `cairn cancel "
                                                      "{}`",
                                                      run_id, to_string(c.status), c.owner, run_id));
  if (!is_finished(c.status))
    throw storage_error(errc::unfinished, fmt::format("run {} has not ended ({}); cancel it first with `cairn cancel {}`",
                                                      run_id, to_string(c.status), run_id));
  if (!c.unfinished_child.empty())
    throw storage_error(errc::unfinished,
                        fmt::format("run {} has a child run that has not ended ({}, {}); cancel it first with `cairn "
                                    "cancel {}`",
                                    run_id, c.unfinished_child, to_string(c.child_status), c.unfinished_child));
  if (c.parent_status && !is_finished(*c.parent_status))
    throw storage_error(errc::unfinished, fmt::format("run {} is a child of run {}, which has not ended ({}) and may "
                                                      "still read it; remove it once its parent has ended",
                                                      run_id, c.parent_id, to_string(*c.parent_status)));
}

storage_error schema_too_new_error(std::string_view journal, int version, int latest) {
  return {errc::schema_too_new, fmt::format("journal {} has schema version {}, newer than this cairn knows ({}); "
                                            "upgrade cairn to open it",
                                            journal, version, latest)};
}

storage_error signal_limit_error(std::string_view run_id, std::int64_t held, std::string_view name) {
  return {errc::limit_reached, fmt::format("run {} already holds {} signals (queued and delivered), the most it may; "
                                           "signal '{}' was not queued",
                                           run_id, held, name)};
}

storage_error signal_delivered_error(std::int64_t signal_id, const std::string& name, std::string_view run_id,
                                     std::int64_t delivered_seq) {
  return {errc::conflict, fmt::format("signal {} ('{}') of run {} was already delivered at step {}; a signal is "
                                      "delivered once",
                                      signal_id, name, run_id, delivered_seq)};
}

storage_error workspace_set_error(std::string_view run_id, std::string_view journal) {
  return {errc::conflict, fmt::format("run {} in journal {} already has its workspace; a run's workspace is "
                                      "assigned once",
                                      run_id, journal)};
}

void check_finish(run_status status, const std::optional<protocol::error_info>& error) {
  if (status != run_status::completed && status != run_status::failed && status != run_status::cancelled &&
      status != run_status::in_doubt)
    throw std::invalid_argument("finish_run: status must be completed, failed, cancelled or in_doubt");
  if (status != run_status::completed && !error) throw std::invalid_argument("finish_run: this status needs an error");
}

void check_wait(const wait_spec& w) {
  if (w.kind != "timer" && w.kind != "signal" && w.kind != "child")
    throw std::invalid_argument("suspend_run: wait kind must be timer, signal or child, not '" + w.kind + "'");
  if (w.kind == "timer" && !w.wake_at_ms) throw std::invalid_argument("suspend_run: a timer needs wake_at_ms");
}

std::string workspace_near_sql(const std::string& folder) {
  // "/a/b" is near "/a/b", "/a/b/c" and "/a", not "/a/bc"; "/" holds every folder.
  return fmt::format("workspace <> '' AND (workspace = {0} OR workspace = '/' OR "
                     "substr(workspace, 1, length({0}) + 1) = {0} || '/' OR "
                     "substr({0}, 1, length(workspace) + 1) = workspace || '/')",
                     folder);
}

const holds::claim* holds::find(std::string_view run_id) const {
  for (auto c = pending_.rbegin(); c != pending_.rend(); ++c)
    if (c->run_id == run_id) return c->taken ? &*c->taken : nullptr;
  auto h = held_.find(std::string(run_id));
  return h == held_.end() ? nullptr : &h->second;
}

void holds::take(std::string_view run_id, claim c) {
  if (open_) pending_.push_back({std::string(run_id), std::move(c)});
  else held_[std::string(run_id)] = std::move(c);
}

void holds::end(std::string_view run_id) {
  if (open_) pending_.push_back({std::string(run_id), std::nullopt});
  else held_.erase(std::string(run_id));
}

void holds::open() {
  pending_.clear();
  open_ = true;
}

void holds::roll_back_to(std::size_t mark) { pending_.resize(std::min(mark, pending_.size())); }

void holds::commit() {
  open_ = false;
  for (auto& c : pending_) {
    if (c.taken) held_[c.run_id] = std::move(*c.taken);
    else held_.erase(c.run_id);
  }
  pending_.clear();
}

void holds::abandon() {
  open_ = false;
  pending_.clear();
}

std::vector<std::exception_ptr> group_commit(journal& self, std::span<const std::function<void(journal&)>> writes,
                                             const group_commit_backend& backend) {
  std::vector<std::exception_ptr> errors(writes.size());
  std::exception_ptr fatal;
  try {
    backend.run(backend.begin);
  } catch (...) {
    std::fill(errors.begin(), errors.end(), std::current_exception());
    return errors;
  }
  backend.grouped = true;
  backend.held.open();
  for (std::size_t i = 0; i < writes.size() && !fatal; ++i) {
    const auto mark = backend.held.mark();
    try {
      backend.run("SAVEPOINT member");
      writes[i](self);
      backend.run("RELEASE member");
    } catch (...) {
      errors[i] = std::current_exception();
      backend.held.roll_back_to(mark);
      // A full disk, an I/O error or a lost connection may have ended the
      // whole transaction: then nobody's write is kept.
      if (!backend.in_transaction()) fatal = errors[i];
      else
        try {
          backend.run("ROLLBACK TO member");
          backend.run("RELEASE member");
        } catch (...) {
          fatal = std::current_exception();
        }
    }
  }
  backend.grouped = false;
  if (!fatal)
    try {
      backend.run("COMMIT");
    } catch (...) {
      fatal = std::current_exception();
    }
  if (fatal) {
    if (backend.in_transaction())
      try {
        backend.run("ROLLBACK");
      } catch (...) {
        // rolled back already
      }
    backend.held.abandon();
    std::fill(errors.begin(), errors.end(), fatal);
    return errors;
  }
  backend.held.commit();
  return errors;
}

}  // namespace cairn::storage::detail
