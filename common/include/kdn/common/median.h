// The median of a small set of values, shared by the benchmarks and the engine's quality
// measurements.
#pragma once

#include <algorithm>
#include <vector>

namespace kdn {

// Sorts a copy; for an even count the mean of the two middle values; 0 for an empty set.
inline double median(std::vector<double> values) noexcept {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

}  // namespace kdn
