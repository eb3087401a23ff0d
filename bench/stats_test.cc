#include "stats.h"

#include <gtest/gtest.h>

#include <cmath>

#include <numeric>

namespace kdn::bench {
namespace {

TEST(StatsTest, NearestRankPercentiles) {
  std::vector<uint64_t> v(100);
  std::iota(v.begin(), v.end(), 1);  // 1..100
  EXPECT_EQ(percentile_sorted(v, 0.50), 50u);
  EXPECT_EQ(percentile_sorted(v, 0.99), 99u);
  EXPECT_EQ(percentile_sorted(v, 1.0), 100u);
  EXPECT_EQ(percentile_sorted(v, 0.0), 1u);
  EXPECT_EQ(percentile_sorted({}, 0.5), 0u);
  EXPECT_EQ(percentile_sorted({7}, 0.99), 7u);
}

TEST(StatsTest, SummarizeSortsAndConvertsToMicroseconds) {
  std::vector<uint64_t> ns = {5000, 1000, 3000, 2000, 4000};
  LatencySummary s = summarize_ns(ns);
  EXPECT_EQ(s.samples, 5u);
  EXPECT_DOUBLE_EQ(s.p50_us, 3.0);
  EXPECT_DOUBLE_EQ(s.p99_us, 5.0);
  EXPECT_DOUBLE_EQ(s.mean_us, 3.0);
  EXPECT_DOUBLE_EQ(s.min_us, 1.0);
  EXPECT_DOUBLE_EQ(s.max_us, 5.0);
  EXPECT_TRUE(std::is_sorted(ns.begin(), ns.end()));
}

TEST(StatsTest, EmptySummaryIsZero) {
  std::vector<uint64_t> none;
  LatencySummary s = summarize_ns(none);
  EXPECT_EQ(s.samples, 0u);
  EXPECT_EQ(s.p50_us, 0.0);
}

TEST(StatsTest, MedianAndRates) {
  EXPECT_DOUBLE_EQ(median({3, 1, 2}), 2.0);
  EXPECT_DOUBLE_EQ(median({4, 1, 2, 3}), 2.5);
  EXPECT_DOUBLE_EQ(median({}), 0.0);
  EXPECT_DOUBLE_EQ(gb_per_s(2'000'000'000, 1'000'000'000), 2.0);
  EXPECT_DOUBLE_EQ(gb_per_s(1, 0), 0.0);
}

TEST(StatsTest, MedianIntervalIsTheBinomialOrderStatistics) {
  std::vector<double> v;
  for (int i = 21; i >= 1; --i) v.push_back(i);  // 1..21, unsorted
  // n = 21: P(B <= 5) = 0.0133 <= 0.025 < P(B <= 6) = 0.0392, so [x_(6), x_(16)].
  Interval ci = median_interval(v);
  EXPECT_DOUBLE_EQ(ci.lo, 6.0);
  EXPECT_DOUBLE_EQ(ci.hi, 16.0);
  // n = 100: the textbook interval is [x_(40), x_(61)].
  v.clear();
  for (int i = 1; i <= 100; ++i) v.push_back(i);
  ci = median_interval(v);
  EXPECT_DOUBLE_EQ(ci.lo, 40.0);
  EXPECT_DOUBLE_EQ(ci.hi, 61.0);
  // Too few values for 95%: the whole range; one value: itself; none: zeros.
  ci = median_interval({5, 1, 3, 2, 4});
  EXPECT_DOUBLE_EQ(ci.lo, 1.0);
  EXPECT_DOUBLE_EQ(ci.hi, 5.0);
  ci = median_interval({7});
  EXPECT_DOUBLE_EQ(ci.lo, 7.0);
  EXPECT_DOUBLE_EQ(ci.hi, 7.0);
  ci = median_interval({});
  EXPECT_DOUBLE_EQ(ci.lo, 0.0);
  EXPECT_DOUBLE_EQ(ci.hi, 0.0);
  // A lower level narrows it.
  v.clear();
  for (int i = 1; i <= 21; ++i) v.push_back(i);
  ci = median_interval(v, 0.5);
  EXPECT_GT(ci.lo, 6.0);
  EXPECT_LT(ci.hi, 16.0);
}

TEST(StatsTest, ProportionIntervalIsWilsons) {
  // 1003 of 1024 at 95%: z = 1.95996; Wilson's bounds are 0.96885 and 0.98655.
  Interval ci = proportion_interval(1003, 1024);
  EXPECT_NEAR(ci.lo, 0.96885, 1e-4);
  EXPECT_NEAR(ci.hi, 0.98655, 1e-4);
  // 8 of 10: the textbook example, [0.4902, 0.9433].
  ci = proportion_interval(8, 10);
  EXPECT_NEAR(ci.lo, 0.4902, 1e-4);
  EXPECT_NEAR(ci.hi, 0.9433, 1e-4);
  // All hits: the upper bound is 1 and the lower one n / (n + z^2).
  ci = proportion_interval(50, 50);
  EXPECT_NEAR(ci.hi, 1.0, 1e-12);
  EXPECT_NEAR(ci.lo, 50 / (50 + 1.959964 * 1.959964), 1e-6);
  // No hits mirror it; no trials give zeros; a lower level narrows it.
  ci = proportion_interval(0, 50);
  EXPECT_NEAR(ci.hi, 1 - 50 / (50 + 1.959964 * 1.959964), 1e-6);
  EXPECT_NEAR(ci.lo, 0.0, 1e-12);
  ci = proportion_interval(0, 0);
  EXPECT_DOUBLE_EQ(ci.hi, 0.0);
  const Interval narrow = proportion_interval(1003, 1024, 0.5);
  EXPECT_GT(narrow.lo, 0.96885);
  EXPECT_LT(narrow.hi, 0.98655);
}

}  // namespace
TEST(StatsTest, BootstrapIntervalCoversTheMeanAndNarrowsWithMoreValues) {
  EXPECT_EQ(bootstrap_mean_interval({}).lo, 0.0);
  const Interval one = bootstrap_mean_interval({0.7});
  EXPECT_EQ(one.lo, 0.7);
  EXPECT_EQ(one.hi, 0.7);
  std::vector<double> few, many;
  for (int i = 0; i < 10; ++i) few.push_back(i % 2 ? 1.0 : 0.0);
  for (int i = 0; i < 400; ++i) many.push_back(i % 2 ? 1.0 : 0.0);
  const Interval a = bootstrap_mean_interval(few), b = bootstrap_mean_interval(many);
  EXPECT_LT(a.lo, 0.5);
  EXPECT_GT(a.hi, 0.5);
  EXPECT_LT(b.lo, 0.5);
  EXPECT_GT(b.hi, 0.5);
  EXPECT_LT(b.hi - b.lo, a.hi - a.lo);
  EXPECT_NEAR(b.hi - b.lo, 2 * 1.96 * 0.5 / std::sqrt(400.0), 0.02) << "close to the normal interval";
  // Reproducible: same values, same seed, same interval.
  const Interval again = bootstrap_mean_interval(few);
  EXPECT_EQ(a.lo, again.lo);
  EXPECT_EQ(a.hi, again.hi);
  // Constant values: a point.
  const Interval flat = bootstrap_mean_interval(std::vector<double>(20, 0.25));
  EXPECT_DOUBLE_EQ(flat.lo, 0.25);
  EXPECT_DOUBLE_EQ(flat.hi, 0.25);
}

}  // namespace kdn::bench
