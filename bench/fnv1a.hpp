// FNV-1a, 64 bits, as 16 hex digits: a digest that tells byte strings apart
// (the conversation bench compares requests and replies by it).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace bench {

inline std::string fnv1a(const std::string& bytes) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ULL;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

}  // namespace bench
