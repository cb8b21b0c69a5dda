// The benchmarks' positional arguments: counts, each with a default. A
// value that is not a whole number of at least 1 (or -h, --help) prints the
// usage and exits, rather than running with a count read as 0.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

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

// Removes a benchmark's folder once its figures are printed (flushed
// first). A workspace image the host deletes in the background (a
// ".NAME.img.doomed") may vanish under the walk: the walk is tried again,
// and a folder that still will not go is left with a note, not a crash
// that loses the figures.
inline void remove_bench_folder(const std::filesystem::path& dir) {
  std::fflush(stdout);
  std::error_code ec;
  for (int tries = 0; tries < 5; ++tries) {
    std::filesystem::remove_all(dir, ec);
    if (!ec) return;
  }
  std::fprintf(stderr, "left %s: %s\n", dir.c_str(), ec.message().c_str());
}

}  // namespace bench
