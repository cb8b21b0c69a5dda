#include "storage/payloads.hpp"

#include <map>
#include <random>
#include <set>

#include <catch2/catch.hpp>

#include "storage/journal.hpp"
#include "tests/storage/journal_samples.hpp"
#include "tests/support/noise.hpp"

using namespace cairn::storage;
using namespace cairn::storage::samples;
using cairn::testing::noise;

namespace {

// The payloads table of one run, as the backends keep it.
struct store {
  std::map<std::string, std::string> bodies;
  std::uint64_t bytes = 0;  // digests and bodies, each once

  json keep(const json& value) {
    auto split = split_payloads(value);
    for (auto& p : split.pieces)
      if (bodies.emplace(p.digest, p.body).second) bytes += p.digest.size() + p.body.size();
    bytes += split.manifest.dump().size();
    return split.manifest;
  }
  payload_lookup lookup() const {
    return [this](const std::string& digest) -> std::optional<std::string> {
      auto it = bodies.find(digest);
      if (it == bodies.end()) return std::nullopt;
      return it->second;
    };
  }
  json read(const json& manifest) const { return join_payloads(manifest, lookup(), "the value"); }
};

// Bytes of every value, which no compressor shrinks.
std::string random_bytes(std::size_t bytes, unsigned seed) {
  std::mt19937 gen(seed);
  std::string s(bytes, ' ');
  for (auto& c : s) c = static_cast<char>(gen() & 0xff);
  return s;
}

std::string prose(std::size_t bytes, int n) {
  std::string s;
  while (s.size() < bytes) s += "Result " + std::to_string(n) + ": the write-ahead log is flushed before the page. ";
  return s.substr(0, bytes);
}

// A tool-calling conversation after `calls` calls.
json conversation(int calls) {
  json messages = json::array({{{"role", "system"}, {"content", "You are a research agent."}}});
  for (int i = 0; i < calls; ++i) {
    messages.push_back({{"role", "assistant"},
                        {"tool_calls", json::array({{{"id", "call_" + std::to_string(i)},
                                                     {"function", {{"name", "read"}, {"arguments", "{}"}}}}})}});
    messages.push_back({{"role", "tool"}, {"tool_call_id", "call_" + std::to_string(i)}, {"content", prose(5000, i)}});
  }
  return messages;
}

// The corrupt error `f` throws.
storage_error corrupt_error(const std::function<void()>& f) {
  auto e = error_from(f);
  REQUIRE(e);
  CHECK(e->code() == errc::corrupt);
  return *e;
}

}  // namespace

TEST_CASE("every value reads back as it was split, whatever strings it holds") {
  const std::string nul(1, '\0');
  const json values[] = {
      nullptr, 1, "short", json::array(), json::object(), noise(300, 1), prose(10'000, 2),
      // Strings an agent could send that look like what a manifest holds: they stay strings.
      nul + "sha256:" + std::string(64, '0'), nul + "zstd:" + std::string(64, '0'), nul + "list", nul + nul + "x",
      json::array({nul + "list", nul + "sha256:" + std::string(64, '0'), prose(3000, 3)}),
      json::array({nul + "list"}),
      // Long arrays of small items, nested arrays, lists of lists.
      json(std::vector<int>(2000, 7)), json::array({conversation(3), conversation(10)}), conversation(40),
      json::array({json::array({json::array({std::string(600, 'q')})})})};
  for (const auto& v : values) {
    store s;
    INFO(v.dump().substr(0, 200));
    CHECK(s.read(s.keep(v)) == v);
  }
}

TEST_CASE("a conversation that grows stores what each request adds, not the conversation again") {
  store s;
  std::vector<json> manifests;
  std::vector<std::uint64_t> bytes_after;
  for (int calls = 0; calls <= 100; ++calls) {
    manifests.push_back(s.keep({{"messages", conversation(calls)}, {"max_tokens", 4096}}));
    bytes_after.push_back(s.bytes);
  }
  for (int calls = 0; calls <= 100; calls += 7)
    CHECK(s.read(manifests[calls]) == json({{"messages", conversation(calls)}, {"max_tokens", 4096}}));
  // Each request holds a reference and a short tail, however long the conversation.
  CHECK(manifests[100].dump().size() < 2 * chunk_min_bytes);
  // Linear: the last 50 calls cost about what the first 50 did, not three times as much.
  const double first = static_cast<double>(bytes_after[50] - bytes_after[0]);
  const double last = static_cast<double>(bytes_after[100] - bytes_after[50]);
  CHECK(last < 1.3 * first);
  // The 500 KB of tool outputs, compressed, with every request: less than the conversation.
  CHECK(s.bytes < conversation(100).dump().size());
}

TEST_CASE("a body is compressed when that saves bytes, and kept as it is when not") {
  const auto text = prose(5000, 1), random = random_bytes(5000, 2);
  auto split = split_payloads(json::array({text, random}));
  REQUIRE(split.pieces.size() == 2);
  CHECK(split.pieces[0].digest.starts_with("zstd:"));
  CHECK(split.pieces[0].body.size() < text.size() / 4);
  CHECK(split.pieces[1].digest.starts_with("sha256:"));
  CHECK(split.pieces[1].body == random);
  // The same string names the same payload wherever it is: a step's output and a later request.
  CHECK(split_payloads(json{{"content", text}}).pieces.at(0).digest == split.pieces[0].digest);
}

TEST_CASE("a manifest written before chunks and compression reads as it did") {
  const std::string body = prose(1000, 4);
  std::map<std::string, std::string> bodies{{"sha256:abc", body}};
  const json old = {{"text", std::string(1, '\0') + "sha256:abc"}, {"kept", std::string(2, '\0') + "x"}};
  const auto read = join_payloads(
      old, [&](const std::string& d) -> std::optional<std::string> { return bodies.at(d); }, "old");
  CHECK(read == json({{"text", body}, {"kept", std::string(1, '\0') + "x"}}));
}

TEST_CASE("a step's output is its JSON text unless it names payloads") {
  CHECK(encode_output({{"n", 1}}).text == R"({"n":1})");
  CHECK(encode_output({{"n", 1}}).pieces.empty());
  const auto long_output = encode_output(prose(2000, 5));
  CHECK(is_output_manifest(long_output.text));
  CHECK(long_output.pieces.size() == 1);
  CHECK(long_output.text.size() < 100);
  // Text an older cairn wrote, a string starting with NUL included, is JSON as it is.
  const std::string old = json(std::string(1, '\0') + "sha256:abc").dump();
  CHECK_FALSE(is_output_manifest(old));
  CHECK(output_json(old) == old);
}

TEST_CASE("a damaged or forged journal cannot make decoding loop, recurse or allocate without bound") {
  const std::string nul(1, '\0');
  std::map<std::string, std::string> bodies;
  const auto lookup = [&](const std::string& d) -> std::optional<std::string> {
    auto it = bodies.find(d);
    if (it == bodies.end()) return std::nullopt;
    return it->second;
  };
  SECTION("a chain of chunks that comes back to itself") {
    bodies["sha256:a"] = json::array({nul + "sha256:b", 1}).dump();
    bodies["sha256:b"] = json::array({nul + "sha256:a", 2}).dump();
    auto e = corrupt_error([&] { join_payloads(json::array({nul + "list", nul + "sha256:a"}), lookup, "ev 1"); });
    CHECK(e.code() == errc::corrupt);
    CHECK_THAT(e.what(), Catch::StartsWith("ev 1 takes more than"));
  }
  SECTION("a chunk that holds its own list") {
    bodies["sha256:a"] = json::array({nullptr, json::array({nul + "list", nul + "sha256:a"})}).dump();
    auto e = corrupt_error([&] { join_payloads(json::array({nul + "list", nul + "sha256:a"}), lookup, "ev 2"); });
    CHECK(e.code() == errc::corrupt);
    CHECK_THAT(e.what(), Catch::Contains("too deep"));
  }
  SECTION("a frame that records more than decoding may read is refused before it is inflated") {
    auto split = split_payloads(std::string(decode_max_bytes / 2 + 1, 'z'));
    REQUIRE(split.pieces.at(0).digest.starts_with("zstd:"));
    bodies[split.pieces[0].digest] = split.pieces[0].body;
    const json twice = json::array({split.manifest, split.manifest});
    auto e = corrupt_error([&] { join_payloads(twice, lookup, "ev 3"); });
    CHECK_THAT(e.what(), Catch::Contains("takes more than"));
    CHECK(join_payloads(split.manifest, lookup, "ev 3").get_ref<const std::string&>().size() ==
          decode_max_bytes / 2 + 1);
  }
  SECTION("a compressed body that is not a frame, a missing body, a malformed chunk") {
    bodies["zstd:x"] = "not a frame";
    bodies["sha256:c"] = "[1]";
    CHECK_THAT(corrupt_error([&] { join_payloads(nul + "zstd:x", lookup, "ev 4"); }).what(),
               Catch::Contains("not a zstd frame"));
    CHECK_THAT(corrupt_error([&] { join_payloads(nul + "sha256:gone", lookup, "ev 5"); }).what(),
               Catch::Contains("does not hold"));
    CHECK_THAT(corrupt_error([&] { join_payloads(json::array({nul + "list", nul + "sha256:c"}), lookup, "ev 6"); })
                   .what(),
               Catch::Contains("malformed stored list"));
    CHECK_THAT(corrupt_error([&] { join_payloads(nul + "md5:x", lookup, "ev 7"); }).what(),
               Catch::Contains("malformed payload reference"));
  }
}
