#include "stats.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace kdn::bench
