// Printable text that never repeats (xorshift64, 64 characters: 6 bits of
// each byte), so the journal, which stores a string once and compresses it,
// keeps about 3/4 of it: what a hostile agent sends to fill a journal, and
// what a test stores to occupy one.
#pragma once

#include <cstdint>
#include <string>

namespace cairn::testing {

inline std::string noise(std::size_t bytes, std::uint64_t seed) {
  // base64url's: nothing JSON escapes, so the text is as long in a frame.
  constexpr char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
  std::string s(bytes, ' ');
  for (auto& c : s) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    c = alphabet[x % 64];
  }
  return s;
}

}  // namespace cairn::testing
