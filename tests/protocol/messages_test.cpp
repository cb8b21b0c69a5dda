// Protocol v1 messages: the JSON mapping of every type and the rejection of
// every malformed field (protocol/PROTOCOL.md §3). Sequencing across a session
// (duplicate or skipped seq) is the engine's check, not the codec's.
#include "protocol/messages.hpp"

#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace {

namespace p = cairn::protocol;
using p::json;
using p::protocol_error;
using Catch::Matchers::Contains;

// The protocol_error message for `j`, or "<accepted>". Any other exception
// escapes and fails the test.
std::string agent_error(const json& j) {
  try {
    p::parse_agent_message(j);
  } catch (const protocol_error& e) {
    return e.what();
  }
  return "<accepted>";
}

std::string host_error(const json& j) {
  try {
    p::parse_host_message(j);
  } catch (const protocol_error& e) {
    return e.what();
  }
  return "<accepted>";
}

// Through the wire and back: to_json, frame, decode, parse, to_json.
json wire_round_trip(const p::agent_message& m) {
  p::frame_decoder d;
  d.feed(p::encode_frame(p::to_json(m)));
  auto j = d.next();
  REQUIRE(j);
  return p::to_json(p::parse_agent_message(*j));
}

json wire_round_trip(const p::host_message& m) {
  p::frame_decoder d;
  d.feed(p::encode_frame(p::to_json(m)));
  auto j = d.next();
  REQUIRE(j);
  return p::to_json(p::parse_host_message(*j));
}

json err(std::string message, std::string type = "error") {
  return {{"message", std::move(message)}, {"type", std::move(type)}};
}

// One valid example of each agent message, as it appears on the wire.
json valid_hello() { return {{"t", "hello"}, {"v", 2}, {"sdk", "test/0.1"}}; }
json valid_begin() {
  return {{"t", "begin"},         {"seq", 3},        {"name", "plan"},     {"kind", "step"},
          {"attempt", 1},        {"timeout_ms", 30000}, {"max_attempts", 3}, {"initial_delay_ms", 50},
          {"multiplier", 1.5},   {"max_delay_ms", 400}, {"jitter", 0.0}};
}
json valid_step_ok() {
  return {{"t", "step"},   {"seq", 3},         {"name", "plan"},  {"kind", "step"},
          {"status", "ok"}, {"output", {{"k", {1, "two", nullptr}}}}, {"attempt", 2}, {"duration_us", 1500}};
}
json valid_step_error() {
  return {{"t", "step"},      {"seq", 4}, {"name", "fetch"},       {"kind", "step"},
          {"status", "error"}, {"error", err("timeout", "std::runtime_error")},
          {"attempt", 3},      {"duration_us", 0}, {"terminal", true}};
}
json valid_history_request() { return {{"t", "history"}, {"from", 2}}; }
json valid_tool() { return {{"t", "tool"}, {"seq", 5}, {"name", "http.fetch"}, {"args", {{"url", "https://example.com/"}}}}; }
json valid_sleep_for() { return {{"t", "sleep"}, {"seq", 6}, {"duration_ms", 3'600'000}}; }
json valid_sleep_until() { return {{"t", "sleep"}, {"seq", 6}, {"until_ms", 1767225600000}}; }
json valid_wait() { return {{"t", "wait"}, {"seq", 7}, {"signal", "approved"}, {"timeout_ms", 86'400'000}}; }
json valid_wait_forever() { return {{"t", "wait"}, {"seq", 7}, {"signal", "approved"}}; }
json valid_child() { return {{"t", "child"}, {"seq", 8}, {"agent", "summarize"}, {"input", {{"doc", "d1"}}}}; }
json valid_join() { return {{"t", "join"}, {"seq", 9}, {"run_id", "run-00c0ffee0002"}}; }
json valid_emit() { return {{"t", "emit"}, {"data", {{"token", "hel"}}}}; }
json valid_done() { return {{"t", "done"}, {"output", {{"answer", 42}}}}; }
json valid_fail() { return {{"t", "fail"}, {"error", err("gave up", "nondeterminism")}}; }

std::vector<json> valid_agent_messages() {
  return {valid_hello(),       valid_begin(), valid_step_ok(),      valid_step_error(), valid_history_request(),
          valid_tool(),        valid_sleep_for(), valid_sleep_until(), valid_wait(),    valid_wait_forever(),
          valid_child(),       valid_join(),  valid_emit(),         valid_done(),       valid_fail()};
}

json history_entry(std::uint64_t seq, std::string name = "s") {
  return {{"seq", seq},     {"name", std::move(name)}, {"kind", "step"}, {"status", "ok"},
          {"output", seq},  {"attempt", 1},            {"duration_us", 10}};
}

json valid_start() {
  return {{"t", "start"},
          {"v", 2},
          {"run_id", "run-1"},
          {"input", {{"q", "why"}}},
          {"attempt", 2},
          {"history_steps", 2},
          {"next_step_attempt", 1}};
}

enum class field_type { integer, string, error, any };

struct field {
  const char* name;
  field_type type;
  bool required;
};

// Every field of every agent message, as PROTOCOL.md §3 lists them.
struct message_fields {
  json example;
  std::vector<field> fields;
};

std::vector<message_fields> agent_fields() {
  using ft = field_type;
  return {
      {valid_hello(), {{"v", ft::integer, true}, {"sdk", ft::string, true}}},
      {valid_begin(),
       {{"seq", ft::integer, true},
        {"name", ft::string, true},
        {"kind", ft::string, true},
        {"attempt", ft::integer, true},
        {"timeout_ms", ft::integer, false},
        {"max_attempts", ft::integer, false},
        {"initial_delay_ms", ft::integer, false},
        {"max_delay_ms", ft::integer, false}}},
      {valid_step_ok(),
       {{"seq", ft::integer, true},
        {"name", ft::string, true},
        {"kind", ft::string, true},
        {"status", ft::string, true},
        {"output", ft::any, true},
        {"attempt", ft::integer, true},
        {"duration_us", ft::integer, false}}},
      {valid_step_error(),
       {{"seq", ft::integer, true},
        {"name", ft::string, true},
        {"kind", ft::string, true},
        {"status", ft::string, true},
        {"error", ft::error, true},
        {"attempt", ft::integer, true},
        {"duration_us", ft::integer, false}}},
      {valid_history_request(), {{"from", ft::integer, true}}},
      {valid_tool(), {{"seq", ft::integer, true}, {"name", ft::string, true}, {"args", ft::any, true}}},
      // Either timer field alone is required: without it the message has neither.
      {valid_sleep_for(), {{"seq", ft::integer, true}, {"duration_ms", ft::integer, true}}},
      {valid_sleep_until(), {{"seq", ft::integer, true}, {"until_ms", ft::integer, true}}},
      {valid_wait(), {{"seq", ft::integer, true}, {"signal", ft::string, true}, {"timeout_ms", ft::integer, false}}},
      {valid_child(), {{"seq", ft::integer, true}, {"agent", ft::string, true}, {"input", ft::any, true}}},
      {valid_join(), {{"seq", ft::integer, true}, {"run_id", ft::string, true}}},
      {valid_emit(), {{"data", ft::any, true}}},
      {valid_done(), {{"output", ft::any, true}}},
      {valid_fail(), {{"error", ft::error, true}}},
  };
}

std::vector<json> wrong_values(field_type t) {
  switch (t) {
    case field_type::integer: return {"1", 1.5, 1.0, true, nullptr, json::array({1}), json::object()};
    case field_type::string: return {1, 1.5, true, nullptr, json::array({"a"}), json::object()};
    case field_type::error: return {"oops", 1, true, nullptr, json::array({"oops"})};
    case field_type::any: return {};
  }
  return {};
}

}  // namespace

TEST_CASE("every agent message maps to the documented JSON and back", "[messages]") {
  SECTION("typed values give the wire shape") {
    CHECK(p::to_json(p::agent_message{p::hello_msg{2, "test/0.1"}}) == valid_hello());
    CHECK(p::to_json(p::agent_message{p::begin_msg{3, "plan", p::step_kind::step, 1, 30000, {3, 50, 1.5, 400, 0.0}}}) ==
          valid_begin());

    p::step_result ok;
    ok.seq = 3;
    ok.name = "plan";
    ok.output = {{"k", {1, "two", nullptr}}};
    ok.attempt = 2;
    ok.duration_us = 1500;
    CHECK(p::to_json(p::agent_message{p::step_msg{ok}}) == valid_step_ok());

    p::step_result failed;
    failed.seq = 4;
    failed.name = "fetch";
    failed.ok = false;
    failed.error = {"timeout", "std::runtime_error"};
    failed.attempt = 3;
    CHECK(p::to_json(p::agent_message{p::step_msg{failed, true}}) == valid_step_error());

    CHECK(p::to_json(p::agent_message{p::history_msg{2}}) == valid_history_request());
    CHECK(p::to_json(p::agent_message{p::tool_msg{5, "http.fetch", {{"url", "https://example.com/"}}}}) ==
          valid_tool());
    CHECK(p::to_json(p::agent_message{p::sleep_msg{6, 3'600'000, std::nullopt}}) == valid_sleep_for());
    CHECK(p::to_json(p::agent_message{p::sleep_msg{6, std::nullopt, 1767225600000}}) == valid_sleep_until());
    CHECK(p::to_json(p::agent_message{p::wait_msg{7, "approved", 86'400'000}}) == valid_wait());
    CHECK(p::to_json(p::agent_message{p::wait_msg{7, "approved", std::nullopt}}) == valid_wait_forever());
    CHECK(p::to_json(p::agent_message{p::child_msg{8, "summarize", {{"doc", "d1"}}}}) == valid_child());
    CHECK(p::to_json(p::agent_message{p::join_msg{9, "run-00c0ffee0002"}}) == valid_join());
    CHECK(p::to_json(p::agent_message{p::emit_msg{{{"token", "hel"}}}}) == valid_emit());
    CHECK(p::to_json(p::agent_message{p::done_msg{{{"answer", 42}}}}) == valid_done());
    CHECK(p::to_json(p::agent_message{p::fail_msg{{"gave up", "nondeterminism"}}}) == valid_fail());
  }

  SECTION("the wire shape parses to the typed values") {
    for (const auto& j : valid_agent_messages()) {
      INFO(j.dump());
      p::agent_message m = p::parse_agent_message(j);
      CHECK(p::type_name(m) == j["t"].get<std::string>());
      CHECK(p::to_json(m) == j);
      CHECK(wire_round_trip(m) == j);
    }

    auto s = std::get<p::step_msg>(p::parse_agent_message(valid_step_error())).result;
    CHECK(s.seq == 4);
    CHECK(s.name == "fetch");
    CHECK(s.kind == p::step_kind::step);
    CHECK_FALSE(s.ok);
    CHECK(s.error.message == "timeout");
    CHECK(s.error.type == "std::runtime_error");
    CHECK(s.attempt == 3);

    CHECK(std::get<p::step_msg>(p::parse_agent_message(valid_step_error())).terminal);
    CHECK(std::get<p::history_msg>(p::parse_agent_message(valid_history_request())).from == 2);

    auto h = std::get<p::hello_msg>(p::parse_agent_message(valid_hello()));
    CHECK(h.version == 2);
    CHECK(h.sdk == "test/0.1");

    auto b = std::get<p::begin_msg>(p::parse_agent_message(valid_begin()));
    CHECK(b.timeout_ms == 30000);
    CHECK(b.retry.max_attempts == 3);
    CHECK(b.retry.initial_delay_ms == 50);
    CHECK(b.retry.multiplier == 1.5);
    CHECK(b.retry.max_delay_ms == 400);
    CHECK(b.retry.jitter == 0.0);

    auto sf = std::get<p::sleep_msg>(p::parse_agent_message(valid_sleep_for()));
    CHECK(sf.seq == 6);
    CHECK(sf.duration_ms == 3'600'000);
    CHECK_FALSE(sf.until_ms);
    auto su = std::get<p::sleep_msg>(p::parse_agent_message(valid_sleep_until()));
    CHECK_FALSE(su.duration_ms);
    CHECK(su.until_ms == 1767225600000);

    auto w = std::get<p::wait_msg>(p::parse_agent_message(valid_wait()));
    CHECK(w.seq == 7);
    CHECK(w.signal == "approved");
    CHECK(w.timeout_ms == 86'400'000);
    CHECK_FALSE(std::get<p::wait_msg>(p::parse_agent_message(valid_wait_forever())).timeout_ms);

    auto c = std::get<p::child_msg>(p::parse_agent_message(valid_child()));
    CHECK(c.seq == 8);
    CHECK(c.agent == "summarize");
    CHECK(c.input == json{{"doc", "d1"}});

    auto jn = std::get<p::join_msg>(p::parse_agent_message(valid_join()));
    CHECK(jn.seq == 9);
    CHECK(jn.run_id == "run-00c0ffee0002");
  }

  SECTION("every kind round-trips") {
    for (auto kind : {p::step_kind::step, p::step_kind::now, p::step_kind::random, p::step_kind::tool,
                      p::step_kind::sleep, p::step_kind::signal, p::step_kind::child, p::step_kind::join}) {
      p::step_result r;
      r.seq = 0;
      r.name = "k";
      r.kind = kind;
      r.output = kind == p::step_kind::now ? json(1767225600000) : json(0.25);
      auto back = std::get<p::step_msg>(p::parse_agent_message(p::to_json(p::agent_message{p::step_msg{r}})));
      CHECK(back.result.kind == kind);
      CHECK(back.result.output == r.output);
    }
    CHECK(p::to_string(p::step_kind::sleep) == "sleep");
    CHECK(p::to_string(p::step_kind::signal) == "signal");
    CHECK(p::to_string(p::step_kind::child) == "child");
    CHECK(p::to_string(p::step_kind::join) == "join");
  }

  SECTION("any JSON value is a valid output, data or done output, including null") {
    for (json v : {json(nullptr), json(false), json(0), json(-7), json(1.5), json(""), json::array(),
                   json::object(), json("h\xc3\xa9")}) {
      json step = valid_step_ok();
      step["output"] = v;
      CHECK(std::get<p::step_msg>(p::parse_agent_message(step)).result.output == v);
      CHECK(std::get<p::emit_msg>(p::parse_agent_message({{"t", "emit"}, {"data", v}})).data == v);
      CHECK(std::get<p::done_msg>(p::parse_agent_message({{"t", "done"}, {"output", v}})).output == v);
      json child = valid_child();
      child["input"] = v;
      CHECK(std::get<p::child_msg>(p::parse_agent_message(child)).input == v);
    }
  }
}

TEST_CASE("optional fields take their defaults", "[messages]") {
  json step = valid_step_ok();
  step.erase("duration_us");
  CHECK(std::get<p::step_msg>(p::parse_agent_message(step)).result.duration_us == 0);

  json failed = valid_fail();
  failed["error"].erase("type");
  CHECK(std::get<p::fail_msg>(p::parse_agent_message(failed)).error.type == "error");

  json failure = valid_step_error();
  failure.erase("terminal");
  CHECK_FALSE(std::get<p::step_msg>(p::parse_agent_message(failure)).terminal);

  // A begin that asks for no timeout and no retries.
  json begin = valid_begin();
  for (const char* f : {"timeout_ms", "max_attempts", "initial_delay_ms", "multiplier", "max_delay_ms", "jitter"})
    begin.erase(f);
  auto b = std::get<p::begin_msg>(p::parse_agent_message(begin));
  CHECK(b.timeout_ms == 0);
  CHECK(b.retry.max_attempts == 1);
  CHECK(b.retry.initial_delay_ms == 100);
  CHECK(b.retry.multiplier == 2.0);
  CHECK(b.retry.max_delay_ms == 10'000);
  CHECK(b.retry.jitter == 0.2);
}

TEST_CASE("unknown fields are ignored", "[messages]") {
  for (auto j : valid_agent_messages()) {
    j["future_field"] = {{"x", 1}};
    j["zz"] = nullptr;
    INFO(j.dump());
    CHECK(agent_error(j) == "<accepted>");
  }
  json step = valid_step_ok();
  step["error"] = "ignored when status is ok";
  CHECK(agent_error(step) == "<accepted>");
  json start = valid_start();
  start["extra"] = 1;
  CHECK(host_error(start) == "<accepted>");
}

TEST_CASE("a missing required field is named in the error", "[messages][hostile]") {
  for (const auto& m : agent_fields()) {
    for (const auto& f : m.fields) {
      json j = m.example;
      j.erase(f.name);
      INFO(j.dump());
      if (f.required)
        CHECK_THAT(agent_error(j), Contains(std::string("'") + f.name + "'") && Contains("missing"));
      else
        CHECK(agent_error(j) == "<accepted>");
    }
  }
}

TEST_CASE("a field of the wrong JSON type is named in the error", "[messages][hostile]") {
  for (const auto& m : agent_fields()) {
    for (const auto& f : m.fields) {
      for (const auto& v : wrong_values(f.type)) {
        json j = m.example;
        j[f.name] = v;
        INFO(j.dump());
        CHECK_THAT(agent_error(j), Contains(std::string("'") + f.name + "'"));
      }
    }
  }
}

TEST_CASE("the fields of an error object are checked", "[messages][hostile]") {
  for (const json& base : {valid_step_error(), valid_fail()}) {
    INFO(base.dump());
    json j = base;
    j["error"].erase("message");
    CHECK_THAT(agent_error(j), Contains("'message'") && Contains("missing"));
    for (json v : {json(1), json(nullptr), json::array(), json::object()}) {
      j = base;
      j["error"]["message"] = v;
      CHECK_THAT(agent_error(j), Contains("'message'"));
      j = base;
      j["error"]["type"] = v;
      CHECK_THAT(agent_error(j), Contains("'type'"));
    }
    j = base;
    j["error"]["type"] = std::string(1025, 't');
    CHECK_THAT(agent_error(j), Contains("'type'"));
    j = base;
    j["error"]["type"] = std::string(1024, 't');
    CHECK(agent_error(j) == "<accepted>");
  }
}

TEST_CASE("seq must be an integer from 0 to 2^63-1", "[messages][hostile]") {
  for (const json& base : {valid_begin(), valid_step_ok(), valid_tool(), valid_sleep_for(),
                           valid_wait(), valid_child(), valid_join()}) {
    INFO(base.dump());
    auto with_seq = [&](json v) {
      json j = base;
      j["seq"] = std::move(v);
      return agent_error(j);
    };
    CHECK_THAT(with_seq(-1), Contains("'seq'") && Contains("out of range"));
    CHECK_THAT(with_seq(std::numeric_limits<std::int64_t>::min()), Contains("'seq'"));
    CHECK_THAT(with_seq(1.0), Contains("'seq'") && Contains("integer"));
    CHECK_THAT(with_seq(0.5), Contains("'seq'"));
    CHECK_THAT(with_seq(std::uint64_t{1} << 63), Contains("'seq'") && Contains("out of range"));
    CHECK_THAT(with_seq(std::numeric_limits<std::uint64_t>::max()), Contains("'seq'"));
    CHECK_THAT(with_seq("0"), Contains("'seq'"));
    CHECK(with_seq(0) == "<accepted>");
    CHECK(with_seq(std::numeric_limits<std::int64_t>::max()) == "<accepted>");
  }

  // Integers beyond 64 bits parse as floating point: still rejected by name.
  json j = json::parse(R"({"t":"ack","seq":100000000000000000000000})");
  CHECK_THAT(host_error(j), Contains("'seq'"));
  j = json::parse(R"({"t":"begin","seq":18446744073709551616,"name":"a","kind":"step","attempt":1})");
  CHECK_THAT(agent_error(j), Contains("'seq'"));
  j = json::parse(R"({"t":"begin","seq":1e2,"name":"a","kind":"step","attempt":1})");
  CHECK_THAT(agent_error(j), Contains("'seq'"));
  j = json::parse(R"({"t":"begin","seq":-0,"name":"a","kind":"step","attempt":1})");
  CHECK(agent_error(j) == "<accepted>");
}

TEST_CASE("numeric fields are range-checked", "[messages][hostile]") {
  auto with = [](json j, const char* field, json v) {
    j[field] = std::move(v);
    return agent_error(j);
  };
  for (const json& base : {valid_begin(), valid_step_ok()}) {
    INFO(base.dump());
    CHECK_THAT(with(base, "attempt", 0), Contains("'attempt'"));
    CHECK_THAT(with(base, "attempt", -1), Contains("'attempt'"));
    CHECK_THAT(with(base, "attempt", 1'000'001), Contains("'attempt'"));
    CHECK(with(base, "attempt", 1'000'000) == "<accepted>");
  }
  CHECK_THAT(with(valid_step_ok(), "duration_us", -1), Contains("'duration_us'"));
  CHECK(with(valid_step_ok(), "duration_us", std::numeric_limits<std::int64_t>::max()) == "<accepted>");
  for (const char* f : {"initial_delay_ms", "max_delay_ms"}) {
    CHECK_THAT(with(valid_begin(), f, -1), Contains(f));
    CHECK(with(valid_begin(), f, 0) == "<accepted>");
    CHECK_THAT(with(valid_begin(), f, p::max_duration_ms + 1), Contains("100 years"));
  }
  CHECK_THAT(with(valid_begin(), "multiplier", -0.5), Contains("'multiplier'"));
  CHECK_THAT(with(valid_begin(), "multiplier", 1000.5), Contains("'multiplier'"));
  CHECK_THAT(with(valid_begin(), "multiplier", "2"), Contains("'multiplier'"));
  CHECK(with(valid_begin(), "multiplier", 1000) == "<accepted>");
  CHECK_THAT(with(valid_begin(), "jitter", 1.5), Contains("'jitter'"));
  CHECK_THAT(with(valid_begin(), "jitter", nullptr), Contains("'jitter'"));
  CHECK(with(valid_begin(), "jitter", 1) == "<accepted>");
  CHECK_THAT(with(valid_step_error(), "terminal", 1), Contains("'terminal'"));
  CHECK_THAT(with(valid_history_request(), "from", -1), Contains("'from'"));
  CHECK_THAT(with(valid_begin(), "timeout_ms", -1), Contains("'timeout_ms'"));
  CHECK(with(valid_begin(), "timeout_ms", 0) == "<accepted>");
  CHECK_THAT(with(valid_begin(), "max_attempts", 0), Contains("'max_attempts'"));
  CHECK_THAT(with(valid_begin(), "max_attempts", 1'000'001), Contains("'max_attempts'"));
  CHECK(with(valid_begin(), "max_attempts", 1'000'000) == "<accepted>");
  CHECK_THAT(with(valid_sleep_for(), "duration_ms", -1), Contains("'duration_ms'"));
  CHECK(with(valid_sleep_for(), "duration_ms", 0) == "<accepted>");
  CHECK(with(valid_sleep_for(), "duration_ms", p::max_duration_ms) == "<accepted>");
  CHECK_THAT(with(valid_sleep_for(), "duration_ms", p::max_duration_ms + 1), Contains("100 years"));
  CHECK_THAT(with(valid_sleep_for(), "duration_ms", std::numeric_limits<std::int64_t>::max()), Contains("100 years"));
  CHECK_THAT(with(valid_wait(), "timeout_ms", 9'200'000'000'000'000'000ll), Contains("100 years"));
  CHECK_THAT(with(valid_begin(), "timeout_ms", 10'000'000'000'000ll), Contains("100 years"));
  CHECK_THAT(with(valid_sleep_for(), "duration_ms", std::uint64_t{1} << 63), Contains("'duration_ms'"));
  CHECK_THAT(with(valid_sleep_until(), "until_ms", -1), Contains("'until_ms'"));
  CHECK(with(valid_sleep_until(), "until_ms", 0) == "<accepted>");
  CHECK_THAT(with(valid_wait(), "timeout_ms", -1), Contains("'timeout_ms'"));
  CHECK(with(valid_wait(), "timeout_ms", 0) == "<accepted>");
  CHECK_THAT(with(valid_hello(), "v", -1), Contains("'v'"));
  CHECK_THAT(with(valid_hello(), "v", std::int64_t{1} << 31), Contains("'v'"));
  // Another version is a valid hello; refusing it is the host's decision (reject).
  CHECK(std::get<p::hello_msg>(p::parse_agent_message(json{{"t", "hello"}, {"v", 1}, {"sdk", "x"}})).version == 1);
}

TEST_CASE("name must be 1 to 1024 bytes", "[messages][hostile]") {
  // signal, agent and run_id become the step's name.
  std::vector<std::pair<json, std::string>> cases = {{valid_begin(), "name"}, {valid_step_ok(), "name"},
                                                     {valid_tool(), "name"},
                                                     {valid_wait(), "signal"}, {valid_child(), "agent"},
                                                     {valid_join(), "run_id"}};
  for (const auto& [base, field] : cases) {
    INFO(base.dump());
    const std::string quoted = "'" + field + "'";
    json j = base;
    j[field] = "";
    CHECK_THAT(agent_error(j), Contains(quoted) && Contains("empty"));
    j[field] = std::string(1024, 'n');
    CHECK(agent_error(j) == "<accepted>");
    j[field] = std::string(1025, 'n');
    CHECK_THAT(agent_error(j), Contains(quoted) && Contains("1024"));
    // Bytes, not characters: 512 two-byte characters fit, 513 do not.
    std::string e_acute = "\xc3\xa9";
    std::string s;
    for (int i = 0; i < 512; ++i) s += e_acute;
    j[field] = s;
    CHECK(agent_error(j) == "<accepted>");
    j[field] = s + e_acute;
    CHECK_THAT(agent_error(j), Contains(quoted));
  }
  json h = valid_hello();
  h["sdk"] = std::string(1025, 's');
  CHECK_THAT(agent_error(h), Contains("'sdk'"));
}

TEST_CASE("kind must be one of the nine kinds", "[messages][hostile]") {
  for (const json& base : {valid_begin(), valid_step_ok()}) {
    // The codec accepts every kind; refusing a begin or step of a kind only the
    // host records is the engine's check.
    for (const char* k : {"step", "now", "random", "patch", "tool", "sleep", "signal", "child", "join"}) {
      json j = base;
      j["kind"] = k;
      CHECK(agent_error(j) == "<accepted>");
    }
    for (const char* k : {"", "STEP", "TOOL", "step ", " now", "tools", "wait", "timer", "Sleep", "cancel", "patched"}) {
      json j = base;
      j["kind"] = k;
      INFO(j.dump());
      CHECK_THAT(agent_error(j), Contains("'kind'"));
    }
    json j = base;
    j["kind"] = std::string("now\0", 4);
    CHECK_THAT(agent_error(j), Contains("'kind'"));
  }
}

TEST_CASE("status must be ok or error, with output or error to match", "[messages][hostile]") {
  for (const char* s : {"", "OK", "failed", "ok ", "errors"}) {
    json j = valid_step_ok();
    j["status"] = s;
    INFO(j.dump());
    CHECK_THAT(agent_error(j), Contains("'status'"));
  }
  json j = valid_step_ok();
  j.erase("output");
  CHECK_THAT(agent_error(j), Contains("'output'"));
  j = valid_step_ok();
  j["status"] = "error";  // has output, no error
  CHECK_THAT(agent_error(j), Contains("'error'"));
  j = valid_step_error();
  j["error"] = "not an object";
  CHECK_THAT(agent_error(j), Contains("'error'") && Contains("object"));
  j = valid_step_error();
  j["error"] = json::array({"timeout", "std::runtime_error"});
  CHECK_THAT(agent_error(j), Contains("'error'"));
}

TEST_CASE("the message type is checked", "[messages][hostile]") {
  CHECK_THAT(agent_error({{"t", "bogus"}}), Contains("unknown message type") && Contains("bogus"));
  CHECK_THAT(agent_error({{"t", "Hello"}, {"v", 1}, {"sdk", "x"}}), Contains("unknown message type"));
  CHECK_THAT(agent_error({{"t", ""}}), Contains("unknown message type"));
  // Host messages are not agent messages and vice versa.
  CHECK_THAT(agent_error({{"t", "ack"}, {"seq", 0}}), Contains("unknown message type"));
  CHECK_THAT(host_error(valid_hello()), Contains("unknown message type"));
  for (const char* t : {"cancel", "result", "start"})
    CHECK_THAT(agent_error({{"t", t}, {"reason", "x"}}), Contains("unknown message type"));
  for (const json& j : {valid_sleep_for(), valid_wait(), valid_child(), valid_join(), valid_tool()})
    CHECK_THAT(host_error(j), Contains("unknown message type"));

  CHECK_THAT(agent_error({{"seq", 0}}), Contains("'t'"));
  CHECK_THAT(agent_error({{"t", 1}}), Contains("'t'"));
  CHECK_THAT(agent_error({{"t", nullptr}}), Contains("'t'"));
  CHECK_THAT(host_error({{"t", json::array({"ack"})}}), Contains("'t'"));
  CHECK_THAT(agent_error(json::array({"hello"})), Contains("object"));
  CHECK_THAT(host_error(json(42)), Contains("object"));
}

TEST_CASE("errors about agent data are valid UTF-8 and short", "[messages][hostile]") {
  // The error becomes the run's error, is logged and journaled as JSON; a
  // hostile agent must not be able to make it invalid UTF-8 or megabytes long.
  auto check_message = [](const std::string& what) {
    INFO("error: " << what.substr(0, 200));
    CHECK(what != "<accepted>");
    CHECK(what.size() <= 512);
    CHECK_NOTHROW(json(what).dump());
  };
  // A multi-byte character straddling any truncation point of the type name.
  for (std::size_t prefix = 0; prefix < 80; ++prefix)
    check_message(agent_error({{"t", std::string(prefix, 'a') + "\xe2\x9c\x93\xe2\x9c\x93"}}));
  check_message(agent_error({{"t", std::string(1 << 20, 'x')}}));

  json j = valid_step_ok();
  j["kind"] = std::string(1 << 20, 'k');
  check_message(agent_error(j));
  j = valid_step_ok();
  j["status"] = std::string(1 << 20, 's');
  check_message(agent_error(j));
  j = valid_step_ok();
  j["name"] = std::string(1 << 20, 'n');
  check_message(agent_error(j));
}

TEST_CASE("tool calls and their results map to the documented JSON and back", "[messages]") {
  json call = {{"t", "tool"}, {"seq", 5}, {"name", "http.fetch"}, {"args", {{"url", "https://example.com/"}}}};
  auto m = std::get<p::tool_msg>(p::parse_agent_message(call));
  CHECK(m.seq == 5);
  CHECK(m.name == "http.fetch");
  CHECK(m.args["url"] == "https://example.com/");
  CHECK(p::to_json(p::agent_message{m}) == call);
  CHECK(wire_round_trip(p::agent_message{m}) == call);
  CHECK(p::type_name(p::agent_message{m}) == "tool");
  for (const char* f : {"seq", "name", "args"}) {
    json j = call;
    j.erase(f);
    CHECK_THAT(agent_error(j), Contains(std::string("'") + f + "'"));
  }

  p::step_result r;
  r.seq = 5;
  r.name = "http.fetch";
  r.kind = p::step_kind::tool;
  r.ok = false;
  r.error = {"host 'evil.example' is not allowed", "refused"};
  json wire = {{"t", "result"}, {"seq", 5}, {"name", "http.fetch"}, {"kind", "tool"}, {"status", "error"},
               {"error", err("host 'evil.example' is not allowed", "refused")}, {"attempt", 1}, {"duration_us", 0}};
  CHECK(p::to_json(p::host_message{p::result_msg{r}}) == wire);
  CHECK(wire_round_trip(p::host_message{p::result_msg{r}}) == wire);
  auto back = std::get<p::result_msg>(p::parse_host_message(wire)).result;
  CHECK(back.error.type == "refused");
  json not_tool = wire;
  not_tool["kind"] = "step";
  CHECK_THROWS_WITH(p::parse_host_message(not_tool), Contains("'kind'"));
}

TEST_CASE("host messages map to the documented JSON and back", "[messages]") {
  p::start_msg s;
  s.run_id = "run-1";
  s.input = {{"q", "why"}};
  s.attempt = 2;
  p::step_result r0;
  r0.seq = 0;
  r0.name = "ctx.now";
  r0.kind = p::step_kind::now;
  r0.output = 1767225600000;
  p::step_result r1;
  r1.seq = 1;
  r1.name = "fetch";
  r1.ok = false;
  r1.error = {"timeout", "std::runtime_error"};
  r1.attempt = 3;
  r1.duration_us = 77;
  p::step_result r2;
  r2.seq = 2;
  r2.name = "ctx.random";
  r2.kind = p::step_kind::random;
  r2.output = 0.5;
  s.history_steps = 3;
  s.next_step_attempt = 4;
  s.host = "cairn/0.1.0";

  json expected = {{"t", "start"},    {"v", 2},           {"run_id", "run-1"},        {"input", {{"q", "why"}}},
                   {"attempt", 2},    {"history_steps", 3}, {"next_step_attempt", 4}, {"host", "cairn/0.1.0"}};
  CHECK(p::to_json(p::host_message{s}) == expected);
  CHECK(wire_round_trip(p::host_message{s}) == expected);

  auto back = std::get<p::start_msg>(p::parse_host_message(expected));
  CHECK(back.version == 2);
  CHECK(back.run_id == "run-1");
  CHECK(back.attempt == 2);
  CHECK(back.history_steps == 3);
  CHECK(back.next_step_attempt == 4);
  CHECK(back.host == "cairn/0.1.0");
  // A host from before 0.1.0 sent no host: the agent reads its start all the same.
  json older = expected;
  older.erase("host");
  CHECK(std::get<p::start_msg>(p::parse_host_message(older)).host.empty());

  json chunk = {
      {"t", "history"},
      {"from", 0},
      {"steps",
       {{{"seq", 0}, {"name", "ctx.now"}, {"kind", "now"}, {"status", "ok"}, {"output", 1767225600000},
         {"attempt", 1}, {"duration_us", 0}},
        {{"seq", 1}, {"name", "fetch"}, {"kind", "step"}, {"status", "error"},
         {"error", err("timeout", "std::runtime_error")}, {"attempt", 3}, {"duration_us", 77}},
        {{"seq", 2}, {"name", "ctx.random"}, {"kind", "random"}, {"status", "ok"}, {"output", 0.5},
         {"attempt", 1}, {"duration_us", 0}}}}};
  CHECK(p::to_json(p::host_message{p::history_chunk{0, {r0, r1, r2}}}) == chunk);
  CHECK(wire_round_trip(p::host_message{p::history_chunk{0, {r0, r1, r2}}}) == chunk);
  auto steps = std::get<p::history_chunk>(p::parse_host_message(chunk)).steps;
  REQUIRE(steps.size() == 3);
  CHECK(steps[1].error.type == "std::runtime_error");
  CHECK(steps[2].kind == p::step_kind::random);

  json retry = {{"t", "retry"}, {"seq", 4}, {"attempt", 2}, {"delay_ms", 150}};
  CHECK(p::to_json(p::host_message{p::retry_msg{4, 2, 150}}) == retry);
  CHECK(wire_round_trip(p::host_message{p::retry_msg{4, 2, 150}}) == retry);
  auto r = std::get<p::retry_msg>(p::parse_host_message(retry));
  CHECK(r.seq == 4);
  CHECK(r.attempt == 2);
  CHECK(r.delay_ms == 150);

  json ack = {{"t", "ack"}, {"seq", 7}};
  CHECK(p::to_json(p::host_message{p::ack_msg{7}}) == ack);
  CHECK(std::get<p::ack_msg>(p::parse_host_message(ack)).seq == 7);
  CHECK(wire_round_trip(p::host_message{p::ack_msg{7}}) == ack);
  CHECK_FALSE(std::get<p::ack_msg>(p::parse_host_message(ack)).alone);
  json alone_ack = {{"t", "ack"}, {"seq", 7}, {"alone", true}};
  CHECK(p::to_json(p::host_message{p::ack_msg{7, true}}) == alone_ack);
  CHECK(wire_round_trip(p::host_message{p::ack_msg{7, true}}) == alone_ack);
  CHECK(std::get<p::ack_msg>(p::parse_host_message(alone_ack)).alone);

  json reject = {{"t", "reject"}, {"error", "protocol version 2 is not supported"}};
  CHECK(p::to_json(p::host_message{p::reject_msg{"protocol version 2 is not supported"}}) == reject);
  CHECK(wire_round_trip(p::host_message{p::reject_msg{"protocol version 2 is not supported"}}) == reject);
}

TEST_CASE("host message fields are checked", "[messages][hostile]") {
  for (const char* f : {"v", "run_id", "input", "attempt", "history_steps", "next_step_attempt"}) {
    json j = valid_start();
    j.erase(f);
    CHECK_THAT(host_error(j), Contains(std::string("'") + f + "'"));
  }
  auto with = [](const char* f, json v) {
    json j = valid_start();
    j[f] = std::move(v);
    return host_error(j);
  };
  CHECK_THAT(with("v", "1"), Contains("'v'"));
  CHECK_THAT(with("run_id", 1), Contains("'run_id'"));
  CHECK_THAT(with("attempt", 0), Contains("'attempt'"));
  CHECK_THAT(with("next_step_attempt", 0), Contains("'next_step_attempt'"));
  CHECK_THAT(with("next_step_attempt", 1.0), Contains("'next_step_attempt'"));
  CHECK_THAT(with("history_steps", -1), Contains("'history_steps'"));
  CHECK_THAT(with("history_steps", json::array()), Contains("'history_steps'"));
  CHECK_THAT(host_error({{"t", "retry"}, {"seq", 1}, {"attempt", 2}}), Contains("'delay_ms'"));
  CHECK_THAT(host_error({{"t", "retry"}, {"seq", 1}, {"attempt", 0}, {"delay_ms", 0}}), Contains("'attempt'"));

  CHECK_THAT(host_error({{"t", "ack"}}), Contains("'seq'"));
  CHECK_THAT(host_error({{"t", "ack"}, {"seq", -1}}), Contains("'seq'"));
  CHECK_THAT(host_error({{"t", "ack"}, {"seq", "0"}}), Contains("'seq'"));
  CHECK_THAT(host_error({{"t", "ack"}, {"seq", 0}, {"alone", 1}}), Contains("'alone'"));
  CHECK_THAT(host_error({{"t", "reject"}}), Contains("'error'"));
  CHECK_THAT(host_error({{"t", "reject"}, {"error", err("x")}}), Contains("'error'"));
}

json history_chunk(std::uint64_t from, json steps) { return {{"t", "history"}, {"from", from}, {"steps", steps}}; }

TEST_CASE("a history chunk holds at least one step, from 'from' on, in order", "[messages][hostile]") {
  CHECK(host_error(history_chunk(0, {history_entry(0), history_entry(1), history_entry(2)})) == "<accepted>");
  CHECK(host_error(history_chunk(5, {history_entry(5), history_entry(6)})) == "<accepted>");
  CHECK_THAT(host_error(history_chunk(0, json::array())), Contains("'steps'"));
  CHECK_THAT(host_error(history_chunk(0, {history_entry(1), history_entry(0)})), Contains("'steps'"));
  CHECK_THAT(host_error(history_chunk(0, {history_entry(1)})), Contains("'steps'"));
  CHECK_THAT(host_error(history_chunk(5, {history_entry(0)})), Contains("'steps'"));
  CHECK_THAT(host_error(history_chunk(0, {history_entry(0), history_entry(2)})), Contains("'steps'"));
  CHECK_THAT(host_error(history_chunk(0, {history_entry(0), history_entry(0)})), Contains("'steps'"));
  CHECK_THAT(host_error(history_chunk(0, json::object())), Contains("'steps'"));
  CHECK_THAT(host_error({{"t", "history"}, {"steps", {history_entry(0)}}}), Contains("'from'"));
}

TEST_CASE("a history chunk with a bad entry is rejected", "[messages][hostile]") {
  auto with_entry = [](json e) {
    json j = history_chunk(0, {history_entry(0), history_entry(1)});
    j["steps"][1] = std::move(e);
    return host_error(j);
  };
  json e = history_entry(1);
  e.erase("name");
  CHECK_THAT(with_entry(e), Contains("'name'"));
  e = history_entry(1, "");
  CHECK_THAT(with_entry(e), Contains("'name'"));
  e = history_entry(1);
  e["kind"] = "tools";
  CHECK_THAT(with_entry(e), Contains("'kind'"));
  e = history_entry(1);
  e["status"] = "maybe";
  CHECK_THAT(with_entry(e), Contains("'status'"));
  e = history_entry(1);
  e.erase("output");
  CHECK_THAT(with_entry(e), Contains("'output'"));
  e = history_entry(1);
  e["seq"] = "1";
  CHECK_THAT(with_entry(e), Contains("'seq'"));
  e = history_entry(1);
  e["attempt"] = 0;
  CHECK_THAT(with_entry(e), Contains("'attempt'"));
  e = history_entry(1);
  e["status"] = "error";
  e["error"] = "boom";
  CHECK_THAT(with_entry(e), Contains("'error'"));
  CHECK_THAT(with_entry(5), Contains("missing"));
  CHECK_THAT(with_entry(nullptr), Contains("missing"));
  CHECK_THAT(with_entry(json::array({0, "s"})), Contains("missing"));
}

TEST_CASE("sleep needs exactly one of duration_ms and until_ms", "[messages][hostile]") {
  json both = valid_sleep_for();
  both["until_ms"] = 1767225600000;
  CHECK_THAT(agent_error(both), Contains("'duration_ms'") && Contains("'until_ms'") && Contains("both"));
  json neither = {{"t", "sleep"}, {"seq", 6}};
  CHECK_THAT(agent_error(neither), Contains("'duration_ms'") && Contains("'until_ms'") && Contains("missing"));
  // null is not "absent": the field is there with the wrong type.
  json null_until = valid_sleep_for();
  null_until["until_ms"] = nullptr;
  CHECK_THAT(agent_error(null_until), Contains("'until_ms'") && Contains("integer"));
  for (json v : {json("60000"), json(1.5), json(true), json::array({1})}) {
    json j = valid_sleep_for();
    j["duration_ms"] = v;
    CHECK_THAT(agent_error(j), Contains("'duration_ms'") && Contains("integer"));
  }
}

TEST_CASE("wait, child and join fields are checked", "[messages][hostile]") {
  CHECK_THAT(agent_error({{"t", "wait"}, {"seq", 7}}), Contains("'signal'") && Contains("missing"));
  CHECK_THAT(agent_error({{"t", "wait"}, {"seq", 7}, {"signal", 1}}), Contains("'signal'") && Contains("string"));
  CHECK_THAT(agent_error({{"t", "wait"}, {"seq", 7}, {"signal", "s"}, {"timeout_ms", "1"}}),
             Contains("'timeout_ms'") && Contains("integer"));
  CHECK_THAT(agent_error({{"t", "wait"}, {"seq", 7}, {"signal", "s"}, {"timeout_ms", nullptr}}),
             Contains("'timeout_ms'"));
  CHECK_THAT(agent_error({{"t", "child"}, {"seq", 8}, {"agent", "a"}}), Contains("'input'") && Contains("missing"));
  CHECK_THAT(agent_error({{"t", "child"}, {"seq", 8}, {"agent", json::array()}, {"input", 1}}), Contains("'agent'"));
  CHECK_THAT(agent_error({{"t", "join"}, {"seq", 9}}), Contains("'run_id'") && Contains("missing"));
  CHECK_THAT(agent_error({{"t", "join"}, {"seq", 9}, {"run_id", 42}}), Contains("'run_id'") && Contains("string"));
  CHECK_THAT(agent_error({{"t", "join"}, {"seq", "9"}, {"run_id", "r"}}), Contains("'seq'"));
}

TEST_CASE("only the host records tool, sleep, signal, child and join steps", "[messages]") {
  for (auto kind : {p::step_kind::step, p::step_kind::now, p::step_kind::random}) CHECK_FALSE(p::host_recorded(kind));
  for (auto kind : {p::step_kind::tool, p::step_kind::sleep, p::step_kind::signal, p::step_kind::child,
                    p::step_kind::join})
    CHECK(p::host_recorded(kind));
}

TEST_CASE("results of every host-recorded kind map to the documented JSON and back", "[messages]") {
  auto result = [](p::step_kind kind, std::string name, json output) {
    p::step_result r;
    r.seq = 6;
    r.name = std::move(name);
    r.kind = kind;
    r.output = std::move(output);
    return r;
  };
  std::vector<p::step_result> results = {
      result(p::step_kind::sleep, "sleep", {{"until_ms", 1767225600000}, {"fired_at_ms", 1767225600004}}),
      result(p::step_kind::signal, "approved", {{"signal", "approved"}, {"timed_out", false}, {"payload", {{"by", "ann"}}}}),
      result(p::step_kind::signal, "approved", {{"signal", "approved"}, {"timed_out", true}}),
      result(p::step_kind::child, "summarize", {{"run_id", "run-00c0ffee0002"}}),
      result(p::step_kind::join, "run-00c0ffee0002", {{"summary", "short"}}),
  };
  p::step_result failed_child = result(p::step_kind::join, "run-00c0ffee0002", nullptr);
  failed_child.ok = false;
  failed_child.error = {"step 'fetch' failed: HTTP 503", "child_failed"};
  results.push_back(failed_child);
  p::step_result refused = result(p::step_kind::child, "nope", nullptr);
  refused.ok = false;
  refused.error = {"no agent 'nope' is installed", "no_such_agent"};
  results.push_back(refused);

  for (const auto& r : results) {
    json wire = p::to_json(r);
    wire["t"] = "result";
    INFO(wire.dump());
    CHECK(p::to_json(p::host_message{p::result_msg{r}}) == wire);
    CHECK(wire_round_trip(p::host_message{p::result_msg{r}}) == wire);
    auto back = std::get<p::result_msg>(p::parse_host_message(wire)).result;
    CHECK(back.kind == r.kind);
    CHECK(back.name == r.name);
    CHECK(back.ok == r.ok);
    CHECK(back.output == r.output);
    CHECK(back.error.type == r.error.type);
  }

  // The agent records these kinds itself; the host never answers with them.
  for (const char* kind : {"step", "now", "random"}) {
    json j = p::to_json(results[0]);
    j["t"] = "result";
    j["kind"] = kind;
    CHECK_THAT(host_error(j), Contains("'kind'"));
  }

  // Journaled host-recorded steps come back in history like any other.
  json chunk = history_chunk(0, json::array());
  for (std::size_t i = 0; i < results.size(); ++i) {
    json e = p::to_json(results[i]);
    e["seq"] = i;
    chunk["steps"].push_back(e);
  }
  auto steps = std::get<p::history_chunk>(p::parse_host_message(chunk)).steps;
  REQUIRE(steps.size() == results.size());
  CHECK(steps[3].kind == p::step_kind::child);
  CHECK(steps[4].kind == p::step_kind::join);
}

TEST_CASE("cancel maps to the documented JSON and back", "[messages]") {
  json cancel = {{"t", "cancel"}, {"reason", "cancelled by ann with `cairn cancel`"}};
  CHECK(p::to_json(p::host_message{p::cancel_msg{"cancelled by ann with `cairn cancel`"}}) == cancel);
  CHECK(wire_round_trip(p::host_message{p::cancel_msg{"cancelled by ann with `cairn cancel`"}}) == cancel);
  CHECK(std::get<p::cancel_msg>(p::parse_host_message(cancel)).reason == "cancelled by ann with `cairn cancel`");
  json extra = cancel;
  extra["future_field"] = 1;
  CHECK(host_error(extra) == "<accepted>");
  CHECK(std::get<p::cancel_msg>(p::parse_host_message({{"t", "cancel"}, {"reason", ""}})).reason.empty());

  CHECK_THAT(host_error({{"t", "cancel"}}), Contains("'reason'") && Contains("missing"));
  for (json v : {json(1), json(nullptr), json::object(), json::array({"x"})})
    CHECK_THAT(host_error({{"t", "cancel"}, {"reason", v}}), Contains("'reason'"));
}
