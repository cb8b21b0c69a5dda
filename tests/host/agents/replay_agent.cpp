// A run whose history is what a replay must carry back exactly. input:
//   "blobs": N, "blob_bytes": B   N steps returning B random bytes each (as
//                                 text), each followed by a step journaling
//                                 that text's hash as the first execution saw it
//   "small": S                    S steps returning their index
//   "park_ms": P                  then a step that, in the run's first
//                                 sandbox only, sleeps P ms (time to kill the host)
//   "sleep_ms": T                 then a durable sleep (time to suspend the run)
// Then a live step hashes what replay returned and compares; the output is
// {"blobs_verified": n, "small_verified": s, "attempt": the sandbox's attempt}.
#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <thread>

#include <cairn/cairn.hpp>

namespace {

std::uint64_t fnv1a(const std::string& bytes) {
  std::uint64_t h = 14695981039346656037ull;
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string random_text(std::size_t size) {
  static constexpr char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::mt19937_64 rng{std::random_device{}()};
  std::string text(size, ' ');
  for (auto& c : text) c = alphabet[rng() % 64];
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  return cairn::main(argc, argv, [](cairn::context& ctx, const cairn::json& input) -> cairn::json {
    const int blobs = input.value("blobs", 0), small = input.value("small", 0);
    const auto blob_bytes = input.value("blob_bytes", std::size_t{0});
    std::vector<std::string> texts;
    std::vector<std::uint64_t> hashes;
    for (int i = 0; i < blobs; ++i) {
      texts.push_back(ctx.step("blob " + std::to_string(i), [&] { return random_text(blob_bytes); }));
      hashes.push_back(ctx.step("hash " + std::to_string(i), [&] { return fnv1a(texts.back()); }));
    }
    std::vector<int> indexes;
    for (int i = 0; i < small; ++i) indexes.push_back(ctx.step("small " + std::to_string(i), [i] { return i; }));
    if (input.contains("park_ms"))
      ctx.step("park", [&] {
        if (ctx.attempt() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(input["park_ms"].get<int>()));
      });
    if (input.contains("sleep_ms")) ctx.sleep(std::chrono::milliseconds(input["sleep_ms"].get<int>()));
    return ctx.step("verify", [&] {
      int blobs_verified = 0, small_verified = 0;
      for (std::size_t i = 0; i < texts.size(); ++i)
        blobs_verified += texts[i].size() == blob_bytes && fnv1a(texts[i]) == hashes[i];
      for (int i = 0; i < small; ++i) small_verified += indexes[i] == i;
      return cairn::json{{"blobs_verified", blobs_verified}, {"small_verified", small_verified},
                         {"attempt", ctx.attempt()}};
    });
  });
}
