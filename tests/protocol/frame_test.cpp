// The frame codec against well-formed and hostile byte streams
// (protocol/PROTOCOL.md §1 and §5).
#include "protocol/frame.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "protocol/messages.hpp"

namespace {

using cairn::protocol::frame_decoder;
using cairn::protocol::json;
using cairn::protocol::protocol_error;
using Catch::Matchers::Contains;

std::string header(std::uint32_t n) {
  return {static_cast<char>(n >> 24), static_cast<char>(n >> 16), static_cast<char>(n >> 8),
          static_cast<char>(n)};
}

// A frame around arbitrary payload bytes, bypassing encode_frame's checks.
std::string raw_frame(const std::string& payload) {
  return header(static_cast<std::uint32_t>(payload.size())) + payload;
}

// The protocol_error message of decoding one frame with `payload`, or "" if
// it decoded.
std::string decode_error(const std::string& payload) {
  frame_decoder d;
  try {
    d.feed(raw_frame(payload));
    auto m = d.next();
    if (!m) return "<incomplete>";
  } catch (const protocol_error& e) {
    return e.what();
  }
  return "";
}

// An object whose compact serialization is exactly `size` bytes (size >= 12).
json object_of_size(std::size_t size) {
  json j = {{"t", "emit"}, {"data", ""}};
  std::size_t base = j.dump().size();
  REQUIRE(size >= base);
  j["data"] = std::string(size - base, 'x');
  REQUIRE(j.dump().size() == size);
  return j;
}

std::vector<json> sample_messages() {
  return {
      json{{"t", "hello"}, {"v", 1}, {"sdk", "test/1"}},
      json{{"t", "step"}, {"seq", 0}, {"name", "plan"}, {"kind", "step"}, {"status", "ok"},
           {"output", {{"text", "h\xc3\xa9llo \xe2\x9c\x93"}, {"n", {1, 2.5, nullptr, true}}}},
           {"attempt", 1}},
      json{{"t", "emit"}, {"data", json::object()}},
  };
}

}  // namespace

TEST_CASE("encode then decode returns the same message", "[frame]") {
  for (const auto& m : sample_messages()) {
    std::string f = cairn::protocol::encode_frame(m);
    REQUIRE(f.size() == 4 + m.dump().size());
    CHECK(f.substr(0, 4) == header(static_cast<std::uint32_t>(m.dump().size())));
    frame_decoder d;
    d.feed(f);
    auto out = d.next();
    REQUIRE(out);
    CHECK(*out == m);
    CHECK_FALSE(d.next());
    CHECK_FALSE(d.has_partial());
  }
}

TEST_CASE("the length prefix is big-endian", "[frame]") {
  json m = object_of_size(0x010203);
  std::string f = cairn::protocol::encode_frame(m);
  CHECK(static_cast<unsigned char>(f[0]) == 0x00);
  CHECK(static_cast<unsigned char>(f[1]) == 0x01);
  CHECK(static_cast<unsigned char>(f[2]) == 0x02);
  CHECK(static_cast<unsigned char>(f[3]) == 0x03);
  frame_decoder d;
  d.feed(f);
  auto out = d.next();
  REQUIRE(out);
  CHECK(*out == m);
}

TEST_CASE("frames fed one byte at a time are reassembled", "[frame]") {
  std::string stream;
  for (const auto& m : sample_messages()) stream += cairn::protocol::encode_frame(m);
  frame_decoder d;
  std::vector<json> got;
  for (char c : stream) {
    d.feed(std::string_view(&c, 1));
    while (auto m = d.next()) got.push_back(*m);
  }
  CHECK(got == sample_messages());
  CHECK_FALSE(d.has_partial());
}

TEST_CASE("two frames split at every possible point are reassembled", "[frame]") {
  auto msgs = sample_messages();
  std::string stream = cairn::protocol::encode_frame(msgs[0]) + cairn::protocol::encode_frame(msgs[1]);
  for (std::size_t cut = 0; cut <= stream.size(); ++cut) {
    INFO("cut at " << cut);
    frame_decoder d;
    std::vector<json> got;
    d.feed(std::string_view(stream).substr(0, cut));
    while (auto m = d.next()) got.push_back(*m);
    d.feed(std::string_view(stream).substr(cut));
    while (auto m = d.next()) got.push_back(*m);
    REQUIRE(got == std::vector<json>{msgs[0], msgs[1]});
    REQUIRE_FALSE(d.has_partial());
  }
}

TEST_CASE("two frames in one feed come out in order", "[frame]") {
  auto msgs = sample_messages();
  frame_decoder d;
  d.feed(cairn::protocol::encode_frame(msgs[0]) + cairn::protocol::encode_frame(msgs[2]));
  auto a = d.next();
  auto b = d.next();
  REQUIRE(a);
  REQUIRE(b);
  CHECK(*a == msgs[0]);
  CHECK(*b == msgs[2]);
  CHECK_FALSE(d.next());
  CHECK_FALSE(d.has_partial());
}

TEST_CASE("a truncated frame yields nothing and is reported as partial", "[frame]") {
  std::string f = cairn::protocol::encode_frame(sample_messages()[1]);
  frame_decoder fresh;
  CHECK_FALSE(fresh.has_partial());

  SECTION("part of the header") {
    frame_decoder d;
    d.feed(f.substr(0, 2));
    CHECK_FALSE(d.next());
    CHECK(d.has_partial());
  }
  SECTION("the header and part of the payload") {
    frame_decoder d;
    d.feed(f.substr(0, f.size() - 1));
    CHECK_FALSE(d.next());
    CHECK(d.has_partial());
    d.feed(f.substr(f.size() - 1));
    CHECK(d.next());
    CHECK_FALSE(d.has_partial());
  }
  SECTION("a complete frame then a partial one") {
    frame_decoder d;
    d.feed(f + f.substr(0, 7));
    CHECK(d.next());
    CHECK_FALSE(d.next());
    CHECK(d.has_partial());
  }
}

TEST_CASE("a zero length prefix is rejected", "[frame][hostile]") {
  SECTION("at the start of the stream") {
    frame_decoder d;
    REQUIRE_THROWS_WITH(d.feed(header(0)), Contains("zero"));
  }
  SECTION("after a valid frame") {
    frame_decoder d;
    d.feed(cairn::protocol::encode_frame(sample_messages()[0]));
    REQUIRE(d.next());
    REQUIRE_THROWS_AS(d.feed(header(0)), protocol_error);
  }
}

TEST_CASE("a 2 GiB length prefix is rejected as soon as the header is complete", "[frame][hostile]") {
  for (std::uint32_t n : {0x80000000u, 0xFFFFFFFFu, static_cast<std::uint32_t>((16u << 20) + 1)}) {
    INFO("prefix " << n);
    frame_decoder d;
    std::string h = header(n);
    // Three header bytes say nothing yet.
    REQUIRE_NOTHROW(d.feed(h.substr(0, 1)));
    REQUIRE_NOTHROW(d.feed(h.substr(1, 1)));
    REQUIRE_NOTHROW(d.feed(h.substr(2, 1)));
    // The fourth completes the header: rejected before any payload byte.
    REQUIRE_THROWS_WITH(d.feed(h.substr(3, 1)), Contains("exceeds the limit"));
  }
}

TEST_CASE("a prefix above max_frame is rejected, exactly max_frame is accepted", "[frame][hostile]") {
  constexpr std::size_t max = 64;

  SECTION("max + 1 is rejected at the header") {
    frame_decoder d(max);
    REQUIRE_THROWS_AS(d.feed(header(max + 1)), protocol_error);
  }
  SECTION("max + 1 is rejected even when the whole frame arrives at once") {
    frame_decoder d(max);
    REQUIRE_THROWS_AS(d.feed(raw_frame(object_of_size(max + 1).dump())), protocol_error);
  }
  SECTION("exactly max is accepted") {
    json m = object_of_size(max);
    frame_decoder d(max);
    REQUIRE_NOTHROW(d.feed(raw_frame(m.dump())));
    auto out = d.next();
    REQUIRE(out);
    CHECK(*out == m);
  }
  SECTION("the default limit is 16 MiB") {
    CHECK(cairn::protocol::default_max_frame == 16u * 1024 * 1024);
    frame_decoder d;
    CHECK(d.max_frame() == 16u * 1024 * 1024);
    REQUIRE_NOTHROW(d.feed(header(16u << 20)));
    CHECK_FALSE(d.next());
    CHECK(d.has_partial());
  }
}

TEST_CASE("a payload that is not valid JSON is rejected", "[frame][hostile]") {
  for (std::string p : {std::string("{not json}"), std::string("{\"a\":1"), std::string("{\"a\":1} trailing"),
                        std::string("{}{}"), std::string("{\"a\":1e400}"), std::string("{/*c*/}"),
                        std::string("\0\0\0\0", 4), std::string(" "), std::string("{}\0{}", 5),
                        std::string("{\"t\":\"done\"}\0 trailing", 22)}) {
    INFO("payload " << json(p).dump(-1, ' ', false, json::error_handler_t::replace));
    CHECK_THAT(decode_error(p), Contains("not valid JSON"));
  }
}

TEST_CASE("a payload that is JSON but not an object is rejected", "[frame][hostile]") {
  for (std::string p : {"[1,2]", "[]", "42", "-1.5", "\"s\"", "null", "true"}) {
    INFO("payload " << p);
    CHECK_THAT(decode_error(p), Contains("not an object"));
  }
}

TEST_CASE("a payload with invalid UTF-8 is rejected", "[frame][hostile]") {
  for (std::string p : {
           std::string("{\"a\":\"\xff\"}"),              // never valid in UTF-8
           std::string("{\"a\":\"\xc0\xaf\"}"),          // overlong '/'
           std::string("{\"a\":\"\xed\xa0\x80\"}"),      // encoded surrogate U+D800
           std::string("{\"a\":\"\xe2\x82\"}"),          // truncated sequence
           std::string("{\"a\":\"\\ud800\"}"),           // lone surrogate escape
           std::string("{\"\xfe\":1}"),                  // in a key
           std::string("{\"a\":1}\xff"),                 // after the object
       }) {
    INFO("payload " << json(p).dump(-1, ' ', false, json::error_handler_t::replace));
    CHECK_THAT(decode_error(p), Contains("not valid JSON"));
  }
  // Valid multi-byte UTF-8 is fine.
  CHECK(decode_error("{\"a\":\"\xc3\xa9\xe2\x9c\x93\xf0\x9f\x98\x80\"}").empty());
}

TEST_CASE("encode_frame rejects a message above the limit and non-objects", "[frame]") {
  constexpr std::size_t max = 64;
  REQUIRE_NOTHROW(cairn::protocol::encode_frame(object_of_size(max), max));
  REQUIRE_THROWS_WITH(cairn::protocol::encode_frame(object_of_size(max + 1), max), Contains("exceeds"));

  json big = {{"t", "emit"}, {"data", std::string(16u << 20, 'x')}};
  REQUIRE_THROWS_AS(cairn::protocol::encode_frame(big), protocol_error);

  REQUIRE_THROWS_AS(cairn::protocol::encode_frame(json::array({1})), protocol_error);
  REQUIRE_THROWS_AS(cairn::protocol::encode_frame(json(5)), protocol_error);
}

TEST_CASE("encode_frame replaces invalid UTF-8 instead of throwing", "[frame]") {
  json m = {{"t", "emit"}, {"data", {{"text", "a\xff" "b\xc3"}}}};
  std::string f;
  REQUIRE_NOTHROW(f = cairn::protocol::encode_frame(m));
  frame_decoder d;
  d.feed(f);
  auto out = d.next();
  REQUIRE(out);
  CHECK((*out)["data"]["text"] == "a\xef\xbf\xbd" "b\xef\xbf\xbd");
}

TEST_CASE("a complete frame before a bad header is still delivered", "[frame][hostile]") {
  // Messages that arrived intact are delivered in order; the violation is
  // reported when the decoder reaches the bad header, not one message early.
  json first = sample_messages()[0];
  frame_decoder d;
  // feed() may or may not throw here (the bad header is not first in line);
  // what it must not do is lose `first`.
  d.feed(cairn::protocol::encode_frame(first) + header(0x80000000u));
  std::optional<json> got;
  REQUIRE_NOTHROW(got = d.next());
  REQUIRE(got);
  CHECK(*got == first);
  REQUIRE_THROWS_AS(d.next(), protocol_error);
}

TEST_CASE("deeply nested JSON cannot crash the receiver", "[frame][hostile]") {
  // 1,000,000 nested arrays is a 2 MB frame, well under the 16 MiB limit. The
  // receiver must either reject it with protocol_error or handle it; it must
  // not overflow the stack (PROTOCOL.md §1 limits nesting to 128 levels for
  // senders). Run in a child process so a crash fails this test only.
  constexpr std::size_t depth = 1'000'000;
  std::string payload =
      "{\"t\":\"emit\",\"data\":" + std::string(depth, '[') + std::string(depth, ']') + "}";
  std::string frame = raw_frame(payload);

  std::fflush(nullptr);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // Die quietly on a crash: Catch's handlers would report it as a test run of its own.
    for (int sig : {SIGSEGV, SIGBUS, SIGABRT, SIGILL, SIGFPE}) std::signal(sig, SIG_DFL);
    int code = 0;
    try {
      frame_decoder d;
      d.feed(frame);
      if (auto j = d.next()) {
        auto m = cairn::protocol::parse_agent_message(*j);
        json back = cairn::protocol::to_json(m);
        (void)cairn::protocol::encode_frame(back);
      }
    } catch (const protocol_error&) {
      code = 0;
    } catch (...) {
      code = 3;
    }
    _exit(code);
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  INFO("child " << (WIFSIGNALED(status) ? "killed by signal " + std::to_string(WTERMSIG(status))
                                        : "exited with " + std::to_string(WEXITSTATUS(status))));
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("moderately nested JSON is accepted", "[frame]") {
  json data = json::array();
  for (int i = 0; i < 100; ++i) data = json::array({data});
  json m = {{"t", "emit"}, {"data", data}};
  frame_decoder d;
  d.feed(cairn::protocol::encode_frame(m));
  auto out = d.next();
  REQUIRE(out);
  CHECK(*out == m);
}
