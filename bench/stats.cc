#include "stats.h"

#include <algorithm>
#include <cmath>

namespace kdn::bench {

uint64_t percentile_sorted(const std::vector<uint64_t>& sorted, double q) noexcept {
  if (sorted.empty()) return 0;
  q = std::clamp(q, 0.0, 1.0);
  // Nearest rank: the smallest sample with at least q of the samples at or below it.
  size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(sorted.size())));
  return sorted[rank == 0 ? 0 : rank - 1];
}

LatencySummary summarize_ns(std::vector<uint64_t>& samples_ns) noexcept {
  LatencySummary s;
  if (samples_ns.empty()) return s;
  std::sort(samples_ns.begin(), samples_ns.end());
  double sum = 0;
  for (uint64_t v : samples_ns) sum += static_cast<double>(v);
  s.samples = samples_ns.size();
  s.p50_us = static_cast<double>(percentile_sorted(samples_ns, 0.50)) / 1e3;
  s.p99_us = static_cast<double>(percentile_sorted(samples_ns, 0.99)) / 1e3;
  s.mean_us = sum / static_cast<double>(s.samples) / 1e3;
  s.min_us = static_cast<double>(samples_ns.front()) / 1e3;
  s.max_us = static_cast<double>(samples_ns.back()) / 1e3;
  return s;
}

double median(std::vector<double> values) noexcept {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

}  // namespace kdn::bench
