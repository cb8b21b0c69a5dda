// The benchmarks' positional arguments: counts, each with a default. A
// value that is not a whole number of at least 1 (or -h, --help) prints the
// usage and exits, rather than running with a count read as 0.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

namespace bench {

inline int count_arg(int argc, char** argv, int index, int fallback, const char* usage) {
  if (argc <= index) return fallback;
  const std::string text = argv[index];
  std::size_t used = 0;
  int value = 0;
  try {
    value = std::stoi(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == text.size() && value >= 1) return value;
  const bool asked = text == "-h" || text == "--help";
  std::fprintf(asked ? stdout : stderr, "%susage: %s %s\n", asked ? "" : ("not a count: '" + text + "'\n").c_str(),
               argv[0], usage);
  std::exit(asked ? 0 : 2);
}

}  // namespace bench
