// The ledger on the in-memory journal: the events of a run's transitions are
// the ledger's (engine/event_schema.hpp), written in the same transaction as
// the change they record, and built only through the schema.
#include "engine/ledger.hpp"

#include <algorithm>
#include <random>
#include <set>

#include <catch2/catch.hpp>

#include "engine/event_schema.hpp"
#include "engine/run_state.hpp"
#include "storage/memory/memory_journal.hpp"
#include "tests/temp_dir.hpp"

#include <SQLiteCpp/SQLiteCpp.h>

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
  CHECK(seen.size() == 29);
  CHECK(declared_event("run_failed")->notable);
  CHECK_FALSE(declared_event("attempt_started")->notable);
  CHECK(declared_event("cancel_requested")->writer == event_writer::request);
  CHECK(declared_event("agent_replaced")->writer == event_writer::request);  // cairn resume --agent
  CHECK(declared_event("forked")->writer == event_writer::request);          // cairn fork, on the run forked
  CHECK(declared_event("imported")->writer == event_writer::request);        // cairn import
  CHECK_FALSE(declared_event("written_by_a_newer_cairn"));
}

// The state the ledger keeps beside each run (engine/run_state.hpp) is held
// to what scanning the run's history finds (the oracle, derive_run_state),
// after every effect of many seeded histories.
namespace {

std::uint64_t usage_tokens(const json& result) { return result.value("usage", json::object()).value("total_tokens", 0u); }

void check_kept_matches_history(storage::journal& reader, const std::string& run) {
  const auto kept = kept_run_state(reader, run);
  REQUIRE(kept);
  const auto now = storage::now_ms();
  const auto derived = derive_run_state(reader, run, usage_tokens, now);
  const auto at = reader.step_count(run);
  CHECK(kept->failures_at(at) == derived.failures_at(at));
  CHECK(kept->tool_attempts_at(at) == derived.tool_attempts_at(at));
  const auto kt = kept->timer_at(at), dt = derived.timer_at(at);
  CHECK(kt.has_value() == dt.has_value());
  if (kt && dt) CHECK((kt->until_ms == dt->until_ms && kt->in_past == dt->in_past));
  const auto kw = kept->wait_at(at), dw = derived.wait_at(at);
  CHECK(kw.has_value() == dw.has_value());
  if (kw && dw) CHECK((kw->signal == dw->signal && kw->deadline_ms == dw->deadline_ms));
  const auto kc = kept->tool_at(at), dc = derived.tool_at(at);
  CHECK(kc.has_value() == dc.has_value());
  if (kc && dc) CHECK((kc->tool == dc->tool && kc->idempotency == dc->idempotency && kc->args == dc->args));
  CHECK(kept->llm_tokens == derived.llm_tokens);
  CHECK(kept->agent == derived.agent);
  CHECK(kept->suspensions_since(now - 3'600'000) == derived.suspensions_since(now - 3'600'000));
  // And the readers the engine uses say the same.
  CHECK(step_failures(reader, run, at) == derived.failures_at(at));
  CHECK(tool_attempts(reader, run, at) == derived.tool_attempts_at(at));
  CHECK(suspensions_since(reader, run, now - 3'600'000) == derived.suspensions_since(now - 3'600'000));
}

}  // namespace

TEST_CASE("the kept run state equals what the run's history says, after every effect of 200 seeded histories") {
  for (std::uint32_t seed = 1; seed <= 200; ++seed) {
    INFO("seed " << seed);
    bench b;
    b.l.create_run(a_run("r"));
    REQUIRE(b.l.claim_run("r", "", "me"));
    std::mt19937 rng(seed);
    std::uint64_t seq = 0;
    for (int i = 0; i < 40; ++i) {
      INFO("effect " << i);
      auto s = a_step("r", seq);
      switch (rng() % 10) {
        case 0: b.l.apply("r", {effects::retry_due{seq, "s", 1, {"boom", "error"}, 10}}); break;
        case 1:
          b.l.apply("r", {effects::tool_started{seq, rng() % 2 ? "http.fetch" : "send_mail",
                                                rng() % 2 ? "idempotent" : "at_most_once", {{"n", i}}}});
          break;
        case 2: b.l.apply("r", {effects::timer_set{seq, 1'000 + i, rng() % 2 == 0}}); break;
        case 3:
          b.l.apply("r", {effects::wait_started{seq, "go", rng() % 2 ? std::optional<std::int64_t>(5'000 + i)
                                                                      : std::nullopt}});
          break;
        case 4: {  // a model call's result, with what it cost
          s.result.kind = protocol::step_kind::tool;
          s.result.name = "llm.chat";
          s.result.output = {{"usage", {{"total_tokens", 10 + i}}}};
          effects::step_committed c{s, std::nullopt, usage_tokens(s.result.output)};
          b.l.apply("r", {c});
          ++seq;
          break;
        }
        case 5: {  // settled by hand, with a result or to be called again
          const bool retry = rng() % 2;
          effects::tool_settled settled{seq, retry ? "retry" : "result", std::nullopt};
          if (!retry) {
            s.result.kind = protocol::step_kind::tool;
            s.result.name = "llm.chat";
            s.result.output = {{"usage", {{"total_tokens", 7}}}};
            settled.tokens = 7;
            settled.step = s;
            ++seq;
          }
          b.l.apply("r", {settled});
          break;
        }
        case 6:
          b.l.apply("r", {effects::suspended{.wait = {"timer", "", seq, storage::now_ms() + 1}}});
          REQUIRE(b.l.claim_run("r", "", "me"));
          break;
        case 7:
          b.l.apply("r", {effects::sandbox_warning{"noise"}});  // changes nothing kept
          break;
        case 8: {  // the agent identified, or replaced by `cairn resume --agent`
          effects::agent_chosen chosen;
          chosen.version.program = "/agents/a" + std::to_string(rng() % 3) + ".py";
          chosen.version.id = "sha256:" + std::to_string(i);
          chosen.replaced = rng() % 2;
          b.l.apply("r", {chosen});
          break;
        }
        default:
          b.l.apply("r", {effects::step_committed{s, std::nullopt, 0}});
          ++seq;
          break;
      }
      check_kept_matches_history(*b.reader, "r");
    }
  }
}

TEST_CASE("a failed write changes no kept state") {
  bench b;
  b.l.create_run(a_run("r"));
  REQUIRE(b.l.claim_run("r", "", "me"));
  b.l.apply("r", {effects::step_committed{a_step("r", 0), std::nullopt, 0}});
  b.l.apply("r", {effects::retry_due{1, "s", 1, {"boom", "error"}, 10}});
  const auto before = b.reader->run_state("r");
  // A write that throws part-way (a step journaled already) keeps nothing of its effects.
  CHECK_THROWS(b.l.apply("r", {effects::retry_due{1, "s", 2, {"boom", "error"}, 10},
                               effects::step_committed{a_step("r", 0), std::nullopt, 0}}));
  CHECK(b.reader->run_state("r") == before);
  CHECK(step_failures(*b.reader, "r", 1) == 1);
}

TEST_CASE("a run written before the journal kept state is read from its history, and left unkept") {
  testing::temp_dir dir;
  const auto db = dir / "cairn.db";
  ledger l(db);
  auto reader = storage::open_journal(db);
  l.create_run(a_run("r"));
  REQUIRE(l.claim_run("r", "", "me"));
  l.apply("r", {effects::retry_due{0, "s", 1, {"boom", "error"}, 10}});
  {  // as a journal migrated from schema 6 has it (storage/sqlite/schema.cpp)
    SQLite::Database raw(db.string(), SQLite::OPEN_READWRITE);
    raw.exec("UPDATE run_states SET state = NULL");
  }
  REQUIRE_FALSE(reader->run_state("r"));
  l.apply("r", {effects::retry_due{0, "s", 2, {"boom", "error"}, 10},
                effects::tool_started{0, "send_mail", "at_most_once", {{"to", "x"}}}});
  CHECK_FALSE(reader->run_state("r"));
  CHECK(step_failures(*reader, "r", 0) == 2);
  CHECK(tool_attempts(*reader, "r", 0) == 1);
  auto doubt = find_in_doubt(*reader, "r");
  REQUIRE(doubt);
  CHECK(doubt->tool == "send_mail");
  CHECK(doubt->args == json{{"to", "x"}});
}
