// The event schema: every kind of event a run's journal holds, declared
// once. The ledger is the only writer (storage writes none of its own): it
// builds each event with event(), which refuses a kind or data the schema
// does not declare, and `cairn show` formats events through the same
// declarations. Events are the run's history for people and for replay's
// bookkeeping; the run's state itself is in its row.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "protocol/messages.hpp"
#include "storage/journal.hpp"

namespace cairn::engine {

using json = nlohmann::json;

// An event as the journal keeps it.
struct event_row {
  std::string kind;
  json data;
  std::optional<std::uint64_t> seq;
};

// Who writes an event: the run's owner, as part of an attempt's effects or
// the transitions it makes (fenced by its claim), or a request from outside
// the run (a signal sent, a cancel asked), which no claim fences.
enum class event_writer { owner, request };

struct event_declaration {
  std::string_view kind;
  // The data's fields, in order; a field ending in '?' may be null.
  std::span<const std::string_view> fields;
  event_writer writer;
  bool at_step;  // recorded at the step it concerns (event_row::seq set)
  bool notable;  // listed under "events" by `cairn show`
};

// Every declared kind, in the order the docs list them.
std::span<const event_declaration> event_declarations();
// The declaration of `kind`; nullptr for a kind this cairn does not know
// (written by a newer one).
const event_declaration* declared_event(std::string_view kind);

// The event of `kind` with `data`: std::logic_error when the kind is not
// declared, the data's fields are not exactly the declared ones, or a seq is
// given or missing against the declaration. A bug in cairn, never input.
event_row event(std::string_view kind, json data, std::optional<std::uint64_t> seq = std::nullopt);

// The events of the run's transitions, with their data.
event_row attempt_started(int attempt);
event_row run_finished(storage::run_status status, const std::optional<protocol::error_info>& error);
event_row run_reset(storage::run_status status_before, int attempts_before);
event_row run_waiting(const storage::wait_spec& w);
event_row run_released(std::string_view reason);
event_row cancel_requested(std::string_view reason);
event_row signal_queued(const storage::signal_record& s);
event_row signal_delivered(const storage::signal_record& s, std::uint64_t seq);

}  // namespace cairn::engine
