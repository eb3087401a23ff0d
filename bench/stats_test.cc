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

}  // namespace
}  // namespace kdn::bench
