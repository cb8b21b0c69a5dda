// Percentiles of a sample, for the benchmarks' reports.
#pragma once

#include <algorithm>
#include <vector>

struct summary {
  double p50 = 0, p99 = 0;
};

inline summary summarize(std::vector<double> v) {
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v[std::min(v.size() - 1, static_cast<std::size_t>(q * v.size()))]; };
  return {at(0.50), at(0.99)};
}
