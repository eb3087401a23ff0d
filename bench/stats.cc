#include "stats.h"

#include <algorithm>
#include <cmath>
#include <random>

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

Interval median_interval(std::vector<double> values, double level) noexcept {
  if (values.empty()) return {};
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  const double tail = (1.0 - std::clamp(level, 0.0, 1.0)) / 2;
  // The largest k with P(B <= k - 1) <= tail, B ~ Binomial(n, 1/2); the terms are built in
  // log space (n may be hundreds).
  size_t k = 1;
  double cdf = 0;  // P(B <= j)
  for (size_t j = 0; j < n / 2; ++j) {
    cdf += std::exp(std::lgamma(n + 1.0) - std::lgamma(j + 1.0) - std::lgamma(n - j + 1.0) - n * std::log(2.0));
    if (cdf > tail) break;
    k = j + 1;
  }
  k = std::min(k - 1, (n - 1) / 2);  // 0-based index of x_(k)
  return {values[k], values[n - 1 - k]};
}

Interval proportion_interval(uint64_t hits, uint64_t n, double level) noexcept {
  if (n == 0) return {};
  hits = std::min(hits, n);
  // z with P(|N(0, 1)| <= z) = level, by bisection on erfc (monotone; 60 halvings of [0, 40]).
  const double tail = 1.0 - std::clamp(level, 0.0, 1.0 - 1e-15);
  double lo = 0, hi = 40;
  for (int i = 0; i < 60; ++i) {
    const double mid = (lo + hi) / 2;
    (std::erfc(mid / std::sqrt(2.0)) > tail ? lo : hi) = mid;
  }
  const double z = (lo + hi) / 2, nn = static_cast<double>(n), p = static_cast<double>(hits) / nn;
  const double centre = (p + z * z / (2 * nn)) / (1 + z * z / nn);
  const double half = z / (1 + z * z / nn) * std::sqrt(p * (1 - p) / nn + z * z / (4 * nn * nn));
  return {std::max(0.0, centre - half), std::min(1.0, centre + half)};
}

Interval bootstrap_mean_interval(const std::vector<double>& values, double level, uint32_t reps,
                                 uint64_t seed) noexcept {
  if (values.empty()) return {};
  if (values.size() == 1 || reps == 0) return {values[0], values[0]};
  try {
    std::mt19937_64 rng(seed);
    std::vector<double> means(reps);
    for (double& m : means) {
      double sum = 0;
      for (size_t i = 0; i < values.size(); ++i) sum += values[rng() % values.size()];
      m = sum / double(values.size());
    }
    std::sort(means.begin(), means.end());
    const auto at = [&](double q) {
      const double x = q * double(reps - 1);
      const size_t i = size_t(x);
      return i + 1 < reps ? means[i] + (x - double(i)) * (means[i + 1] - means[i]) : means[reps - 1];
    };
    return {at((1 - level) / 2), at((1 + level) / 2)};
  } catch (...) {
    return {};
  }
}

}  // namespace kdn::bench
