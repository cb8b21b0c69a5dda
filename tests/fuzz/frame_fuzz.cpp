// The frame decoder (protocol/frame.hpp) on any byte stream. The first input
// byte picks how the stream is split into reads (1 to 8 bytes each) and the
// receiver's limit (16 MiB or 64 bytes); the rest is the stream. Beyond not
// crashing, it asserts:
// - only protocol_error escapes feed() and next();
// - the stream split into reads yields the same messages, refusal and partial
//   frame as the stream fed in one read (PROTOCOL.md §1.2);
// - every message is a JSON object no deeper than max_depth;
// - decode(encode(m)) == m for every message m, in one frame, nothing left.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "protocol/bounded_json.hpp"
#include "protocol/frame.hpp"
#include "tests/fuzz/contract.hpp"

namespace {

using cairn::fuzz::require;
using namespace cairn::protocol;

struct decoded {
  std::vector<json> messages;
  bool refused = false;
  bool partial = false;
};

// Feeds `stream` in reads of `read` bytes (0: one read), taking every message
// after each read, until the end or the first refusal.
decoded decode(std::string_view stream, std::size_t read, std::size_t max_frame) {
  frame_decoder decoder(max_frame);
  decoded out;
  try {
    do {
      const std::size_t n = read == 0 ? stream.size() : std::min(read, stream.size());
      decoder.feed(stream.substr(0, n));
      stream.remove_prefix(n);
      while (auto message = decoder.next()) out.messages.push_back(std::move(*message));
    } while (!stream.empty());
    out.partial = decoder.has_partial();
  } catch (const protocol_error&) {
    out.refused = true;
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::size_t read = (data[0] & 0x07) + 1;
  const std::size_t max_frame = (data[0] & 0x80) != 0 ? 64 : default_max_frame;
  const std::string_view stream(reinterpret_cast<const char*>(data) + 1, size - 1);

  const decoded whole = decode(stream, 0, max_frame);
  const decoded pieces = decode(stream, read, max_frame);
  require(whole.messages == pieces.messages, "the messages depend on how the stream was split into reads");
  require(whole.refused == pieces.refused, "the refusal depends on how the stream was split into reads");
  require(whole.partial == pieces.partial, "the partial frame depends on how the stream was split into reads");
  for (const auto& message : whole.messages) {
    require(message.is_object(), "a message is not a JSON object");
    require(nesting_depth(message) <= max_depth, "a message nests deeper than max_depth");
    frame_decoder again;
    again.feed(encode_frame(message));
    const auto back = again.next();
    require(back && *back == message, "decode(encode(m)) != m");
    require(!again.has_partial() && !again.next(), "encode(m) is more than one frame");
  }
  return 0;
}
