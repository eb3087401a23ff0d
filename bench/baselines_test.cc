#include "baselines.h"
#include "process.h"

#include <gtest/gtest.h>

namespace kdn::bench {
namespace {

TEST(MemcpyBaselineTest, MeasuresConcurrentCopies) {
  Result<MemcpyResult> r = memcpy_gbps(2, 8 << 20, 3);
  ASSERT_TRUE(r.ok()) << describe(r.status());
  EXPECT_GT(r->median_gbps, 0.0);
  EXPECT_GE(r->best_gbps, r->median_gbps);
  EXPECT_EQ(r->threads, 2u);
  EXPECT_EQ(r->repetitions, 3);
  // Any machine copies faster than 10 MB/s and slower than 100 TB/s: outside that, the
  // timing (not the machine) is wrong.
  EXPECT_GT(r->median_gbps, 0.01);
  EXPECT_LT(r->best_gbps, 100000.0);
}

TEST(MemcpyBaselineTest, RejectsEmptyRuns) {
  EXPECT_EQ(memcpy_gbps(0, 1 << 20).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(memcpy_gbps(1, 0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(memcpy_gbps(1, 1 << 20, 0).status().code(), Code::kInvalidArgument);
}

void expect_plausible(const LatencySummary& s, size_t samples) {
  EXPECT_EQ(s.samples, samples);
  EXPECT_GT(s.p50_us, 0.0);
  EXPECT_GE(s.p99_us, s.p50_us);
  EXPECT_LE(s.min_us, s.p50_us);
  EXPECT_GE(s.max_us, s.p99_us);
  EXPECT_LT(s.p50_us, 100000.0);  // a round trip of 0.1 s means something hung
}

TEST(UdsEchoBaselineTest, TimesRoundTripsThroughAnotherProcess) {
  Result<LatencySummary> r = uds_echo_rtt_us(2000, 100);
  ASSERT_TRUE(r.ok()) << describe(r.status());
  expect_plausible(*r, 2000);
  EXPECT_EQ(uds_echo_rtt_us(0).status().code(), Code::kInvalidArgument);
}

TEST(SpinPingPongBaselineTest, TimesRoundTripsOnASharedLine) {
  // On a busy machine a round trip can wait a scheduler slice; the budget bounds the test.
  Result<LatencySummary> r = spin_pingpong_rtt_us(2000, 200, 5.0);
  ASSERT_TRUE(r.ok()) << describe(r.status());
  ASSERT_GE(r->samples, 1u);
  expect_plausible(*r, r->samples);
  EXPECT_LE(r->samples, 2000u);
  EXPECT_EQ(spin_pingpong_rtt_us(0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(spin_pingpong_rtt_us(10, 0, 0.0).status().code(), Code::kInvalidArgument);
}

TEST(SpinPingPongBaselineTest, StopsAtTheTimeBudget) {
  Result<LatencySummary> r = spin_pingpong_rtt_us(100000000, 0, 0.05);
  ASSERT_TRUE(r.ok()) << describe(r.status());
  EXPECT_GE(r->samples, 1u);
  EXPECT_LT(r->samples, 100000000u);
}

TEST(RedisBaselineTest, SetsAndGetsThroughARealServer) {
#if !KDN_BENCH_HAVE_HIREDIS
  GTEST_SKIP() << "built without hiredis";
#endif
  if (find_on_path("redis-server").empty()) GTEST_SKIP() << "redis-server is not installed";
  RedisOptions options;
  options.value_bytes = 1 << 20;
  options.total_bytes = 8 << 20;
  options.get_passes = 2;
  Result<RedisResult> r = redis_gbps(options);
  ASSERT_TRUE(r.ok()) << describe(r.status());
  EXPECT_EQ(r->values, 8u);
  EXPECT_GT(r->set_gbps, 0.0);
  EXPECT_GT(r->get_gbps, 0.0);
  EXPECT_EQ(r->get_passes, 2);
}

TEST(RedisBaselineTest, RejectsTinyValues) {
  RedisOptions options;
  options.value_bytes = 4;
  EXPECT_EQ(redis_gbps(options).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace kdn::bench
