// Latency summaries shared by every benchmark: nearest-rank percentiles of raw samples.
#pragma once

#include <kdn/common/median.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kdn::bench {

struct LatencySummary {
  double p50_us = 0;
  double p99_us = 0;
  double mean_us = 0;
  double min_us = 0;
  double max_us = 0;
  size_t samples = 0;
};

// Nearest-rank percentile (q in [0, 1]) of ascending samples; 0 for an empty set.
uint64_t percentile_sorted(const std::vector<uint64_t>& sorted, double q) noexcept;

// Summarizes nanosecond samples (sorts them in place) in microseconds.
LatencySummary summarize_ns(std::vector<uint64_t>& samples_ns) noexcept;

// Bytes over nanoseconds in GB/s (1e9 bytes per second); 0 when no time elapsed.
inline double gb_per_s(uint64_t bytes, uint64_t ns) noexcept {
  return ns == 0 ? 0.0 : static_cast<double>(bytes) / static_cast<double>(ns);
}

// Median of a small set of values (kdn/common/median.h).
using kdn::median;

// A distribution-free confidence interval for the median of the population `values` were drawn
// from (independent draws): the order statistics [x_(k), x_(n+1-k)] of the sorted values with
// the largest k for which P(Binomial(n, 1/2) < k) <= (1 - level) / 2, so the interval covers
// the median with probability >= level whatever the distribution. With too few values for
// that (n < 6 at 0.95) it is [min, max]. {0, 0} for an empty set.
struct Interval {
  double lo = 0, hi = 0;
};
Interval median_interval(std::vector<double> values, double level = 0.95) noexcept;

// The Wilson score interval for a proportion: `hits` of `n` independent trials. It stays inside
// [0, 1] and keeps its coverage near 0 and 1, where the normal approximation does not.
// {0, 0} for n = 0.
Interval proportion_interval(uint64_t hits, uint64_t n, double level = 0.95) noexcept;

// A percentile-bootstrap interval for the mean of `values` (independent draws, e.g. one figure
// per prompt): the (1 - level) / 2 and (1 + level) / 2 quantiles of the means of `reps`
// resamples with replacement, drawn from a fixed seed so a report is reproducible. {v, v} for
// one value, {0, 0} for none.
Interval bootstrap_mean_interval(const std::vector<double>& values, double level = 0.95, uint32_t reps = 2000,
                                 uint64_t seed = 1) noexcept;

}  // namespace kdn::bench
