#include "runtime/channel.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include <catch2/catch.hpp>

namespace cairn::runtime {
namespace {

using namespace std::chrono_literals;

// A connected pair: the channel under test and the raw peer end.
struct socket_pair {
  int host = -1, peer = -1;
  socket_pair() {
    int fds[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
    host = fds[0];
    peer = fds[1];
  }
  ~socket_pair() { close_peer(); }
  void close_peer() {
    if (peer >= 0) ::close(peer);
    peer = -1;
  }
  void write_peer(std::string_view bytes) const {
    REQUIRE(::write(peer, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
  }
};

}  // namespace

TEST_CASE("channel reassembles frames split at every byte boundary") {
  std::vector<json> messages = {{{"t", "hello"}, {"v", 1}},
                                {{"t", "step"}, {"seq", 0}, {"out", std::string(300, 'x')}},
                                {{"t", "done"}, {"text", "\xc3\xa9t\xc3\xa9"}}};
  std::string stream;
  for (const auto& m : messages) stream += protocol::encode_frame(m);

  for (std::size_t split = 0; split <= stream.size(); ++split) {
    socket_pair pair;
    channel ch(pair.host);
    std::vector<json> received;
    pair.write_peer(std::string_view(stream).substr(0, split));
    while (auto m = ch.receive(0ms)) received.push_back(*m);
    pair.write_peer(std::string_view(stream).substr(split));
    while (received.size() < messages.size()) {
      auto m = ch.receive(1s);
      REQUIRE(m);
      received.push_back(*m);
    }
    INFO("split at byte " << split);
    REQUIRE(received == messages);
    CHECK_FALSE(ch.receive(0ms));
  }
}

TEST_CASE("channel sends frames the peer can decode, including ones larger than the socket buffer") {
  socket_pair pair;
  channel ch(pair.host);
  json big = {{"t", "start"}, {"history", std::string(4u << 20, 'h')}};
  std::string received;
  std::thread reader([&] {
    char buffer[65536];
    ssize_t n;
    while ((n = ::read(pair.peer, buffer, sizeof buffer)) > 0)
      received.append(buffer, static_cast<std::size_t>(n));
  });
  ch.send({{"t", "ack"}, {"seq", 7}});
  ch.send(big);
  ::shutdown(pair.host, SHUT_WR);
  reader.join();
  protocol::frame_decoder decoder;
  decoder.feed(received);
  CHECK(decoder.next() == json{{"t", "ack"}, {"seq", 7}});
  CHECK(decoder.next() == big);
  CHECK_FALSE(decoder.has_partial());
}

TEST_CASE("channel reports EOF, and whether it cut a frame") {
  SECTION("between frames") {
    socket_pair pair;
    channel ch(pair.host);
    pair.write_peer(protocol::encode_frame({{"t", "done"}}));
    pair.close_peer();
    REQUIRE(ch.receive(1s) == json{{"t", "done"}});
    try {
      ch.receive(1s);
      FAIL("no channel_closed");
    } catch (const channel_closed& e) {
      CHECK_FALSE(e.truncated());
    }
  }
  SECTION("in the middle of a frame") {
    socket_pair pair;
    channel ch(pair.host);
    std::string frame = protocol::encode_frame({{"t", "step"}, {"seq", 1}});
    pair.write_peer(frame.substr(0, frame.size() - 3));
    pair.close_peer();
    try {
      ch.receive(1s);
      FAIL("no channel_closed");
    } catch (const channel_closed& e) {
      CHECK(e.truncated());
    }
  }
}

TEST_CASE("channel rejects a 2 GiB length prefix at the header") {
  socket_pair pair;
  channel ch(pair.host);
  // Only the header is sent: a decoder that waited for the payload would time out instead.
  pair.write_peer(std::string("\x80\x00\x00\x00", 4));
  CHECK_THROWS_AS(ch.receive(2s), protocol::protocol_error);
}

TEST_CASE("channel enforces its own frame limit") {
  socket_pair pair;
  channel ch(pair.host, 1024);
  pair.write_peer(protocol::encode_frame({{"t", "x"}, {"pad", std::string(2000, 'p')}}));
  CHECK_THROWS_AS(ch.receive(1s), protocol::protocol_error);
  CHECK_THROWS_AS(ch.send({{"t", "x"}, {"pad", std::string(2000, 'p')}}), protocol::protocol_error);
}

TEST_CASE("channel receive times out with nullopt") {
  socket_pair pair;
  channel ch(pair.host);
  auto start = std::chrono::steady_clock::now();
  CHECK_FALSE(ch.receive(100ms));
  auto waited = std::chrono::steady_clock::now() - start;
  CHECK(waited >= 100ms);
  CHECK(waited < 2s);
  // A partial frame is not a message either.
  pair.write_peer(std::string("\x00\x00\x00\x10{", 5));
  CHECK_FALSE(ch.receive(50ms));
}

TEST_CASE("channel send to a closed peer throws channel_closed") {
  socket_pair pair;
  channel ch(pair.host);
  pair.close_peer();
  CHECK_THROWS_AS(ch.send({{"t", "ack"}}), channel_closed);
}

}  // namespace cairn::runtime
