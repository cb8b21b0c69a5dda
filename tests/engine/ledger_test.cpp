// The ledger on the in-memory journal: the events of a run's transitions are
// the ledger's (engine/event_schema.hpp), written in the same transaction as
// the change they record, and built only through the schema.
#include "engine/ledger.hpp"

#include <algorithm>
#include <set>

#include <catch2/catch.hpp>

#include "engine/event_schema.hpp"
#include "storage/memory/memory_journal.hpp"

using namespace cairn;
using namespace cairn::engine;
using storage::run_status;

namespace {

storage::new_run a_run(const std::string& id) {
  return {.id = id, .agent = "/agent", .sandbox = "none", .workspace = "/w/" + id};
}

std::vector<std::string> kinds(storage::journal& j, const std::string& run) {
  std::vector<std::string> out;
  for (const auto& e : j.events(run)) out.push_back(e.kind);
  return out;
}

storage::step_record a_step(const std::string& run, std::uint64_t seq) {
  storage::step_record s;
  s.run_id = run;
  s.result.seq = seq;
  s.result.name = "s";
  s.result.kind = protocol::step_kind::step;
  s.result.ok = true;
  s.result.output = "out";
  return s;
}

// A ledger and a reader on one fresh in-memory database.
struct bench {
  storage::memory::database db;
  ledger l{db.open()};
  std::unique_ptr<storage::journal> reader = db.open();
};

}  // namespace

TEST_CASE("every transition's event is written by the ledger, with the schema's data") {
  bench b;
  b.l.create_run(a_run("r"));
  REQUIRE(b.l.claim_run("r", "", "me"));
  CHECK(b.l.begin_attempt("r") == 1);
  CHECK(b.l.begin_attempt("r") == 2);
  auto events = b.reader->events("r");
  REQUIRE(events.size() == 2);
  CHECK(events[1].kind == "attempt_started");
  CHECK(events[1].data == json{{"attempt", 2}});
  CHECK_FALSE(events[1].seq);

  const storage::wait_spec w{"signal", "approval", 4, 1'700'000'050'000};
  b.l.apply("r", {effects::suspended{.wait = w}});
  auto at = b.reader->events_at("r", 4);
  REQUIRE(at.size() == 1);
  CHECK(at[0].kind == "run_waiting");
  CHECK(at[0].data == json{{"kind", "signal"}, {"key", "approval"}, {"seq", 4}, {"wake_at_ms", 1'700'000'050'000}});
  const auto so_far = kinds(*b.reader, "r");
  CHECK(so_far[so_far.size() - 2] == "suspended");  // the effect's own event, beside it

  const auto sig = b.l.enqueue_signal("r", "approval", {{"ok", true}}, 10);
  CHECK(b.reader->events("r").back().data == json{{"name", "approval"}, {"signal_id", sig.id}});
  REQUIRE(b.l.claim_run("r", "", "me"));
  b.l.apply("r", {effects::step_committed{a_step("r", 4), effects::delivered_signal{sig.id, sig.name}}});
  at = b.reader->events_at("r", 4);
  REQUIRE(at.size() == 2);
  CHECK(at[1].kind == "signal_delivered");
  CHECK(at[1].data == json{{"name", "approval"}, {"signal_id", sig.id}});

  CHECK(b.l.request_cancel("r", "enough"));
  CHECK(b.l.request_cancel("r", "again"));  // marked already: no second event
  const auto after_cancels = kinds(*b.reader, "r");
  CHECK(std::count(after_cancels.begin(), after_cancels.end(), "cancel_requested") == 1);

  b.l.apply("r", {effects::released{"host shutting down"}});
  CHECK(b.reader->events("r").back().data == json{{"reason", "host shutting down"}});

  REQUIRE(b.l.claim_run("r", "", "me"));
  b.l.apply("r", {effects::run_ended{run_status::failed, nullptr, protocol::error_info{"boom", "ValueError"}}});
  CHECK(b.reader->events("r").back().kind == "run_failed");
  CHECK(b.reader->events("r").back().data == json{{"error", {{"message", "boom"}, {"type", "ValueError"}}}});

  b.l.apply("r", {effects::attempts_reset{}});
  CHECK(b.reader->events("r").back().kind == "run_reset");
  CHECK(b.reader->events("r").back().data == json{{"status", "failed"}, {"attempts", 2}});

  b.l.create_run(a_run("idle"));
  CHECK(b.l.cancel_idle_run("idle", "stopped by alice"));
  CHECK(b.reader->events("idle").back().kind == "run_cancelled");
  CHECK(kinds(*b.reader, "idle") == std::vector<std::string>{"run_cancelled"});

  // Every kind written is declared.
  for (const auto* id : {"r", "idle"})
    for (const auto& e : b.reader->events(id)) CHECK(declared_event(e.kind));
}

TEST_CASE("a refused transition writes no event: the event shares the change's transaction") {
  bench b;
  b.l.create_run(a_run("r"));
  REQUIRE(b.l.claim_run("r", "", "me"));
  b.l.apply("r", {effects::run_ended{run_status::completed, "done", std::nullopt}});
  const auto before = b.reader->events("r").size();
  CHECK_THROWS_AS(b.l.apply("r", {effects::released{"late"}}), storage::storage_error);
  CHECK_THROWS_AS(b.l.apply("r", {effects::suspended{.wait = {"timer", "", 1, 5}}}), storage::storage_error);
  CHECK_THROWS_AS(b.l.enqueue_signal("r", "go", {}, 10), storage::storage_error);
  CHECK_FALSE(b.l.request_cancel("r", "late"));
  CHECK(b.reader->events("r").size() == before);

  // A run another process took over: the fence refuses the change and its event.
  storage::memory::database db;
  ledger mine{db.open()};
  auto theirs = db.open();
  mine.create_run(a_run("t"));
  REQUIRE(mine.claim_run("t", "", "me"));
  REQUIRE(theirs->claim_run("t", "me", "them"));
  CHECK_THROWS_AS(mine.begin_attempt("t"), storage::storage_error);
  CHECK(theirs->events("t").empty());
  CHECK(theirs->find_run("t")->attempts == 0);
}

TEST_CASE("the schema refuses an event it does not declare, or data other than declared") {
  CHECK_THROWS_AS(event("no_such_kind", json::object()), std::logic_error);
  CHECK_THROWS_AS(event("run_released", json::object()), std::logic_error);                         // lacks reason
  CHECK_THROWS_AS(event("run_released", {{"reason", "x"}, {"extra", 1}}), std::logic_error);         // more fields
  CHECK_THROWS_AS(event("run_released", {{"reason", "x"}}, 3), std::logic_error);                    // not at a step
  CHECK_THROWS_AS(event("tool_settled", {{"how", "x"}}), std::logic_error);                          // needs its step
  CHECK_THROWS_AS(event("run_released", {{"reason", nullptr}}), std::logic_error);                   // not nullable
  CHECK(event("wait_started", {{"signal", "go"}, {"deadline_ms", nullptr}}, 2).kind == "wait_started");  // nullable
  CHECK(event("run_released", {{"reason", "x"}}).data == json{{"reason", "x"}});
}

TEST_CASE("every declared kind is declared once, and `cairn show` lists what it marks notable") {
  std::set<std::string_view> seen;
  for (const auto& d : event_declarations()) CHECK(seen.insert(d.kind).second);
  CHECK(seen.size() == 21);
  CHECK(declared_event("run_failed")->notable);
  CHECK_FALSE(declared_event("attempt_started")->notable);
  CHECK(declared_event("cancel_requested")->writer == event_writer::request);
  CHECK_FALSE(declared_event("written_by_a_newer_cairn"));
}
