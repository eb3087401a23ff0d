#include "baselines.h"
#include "process.h"

#include <gtest/gtest.h>
#include <kdn/common/testing/require.h>

#include <algorithm>
#include <cstdint>

namespace kdn::bench {
namespace {

// Any machine copies faster than 10 MB/s and slower than 100 TB/s: outside that, the timing
// (not the machine) is wrong.
void expect_plausible(const RateSpread& r) {
  EXPECT_GT(r.min_gbps, 0.01);
  EXPECT_LE(r.min_gbps, r.median_gbps);
  EXPECT_LE(r.median_gbps, r.max_gbps);
  EXPECT_LT(r.max_gbps, 100000.0);
}

TEST(MemcpyBaselineTest, MeasuresConcurrentCopies) {
  Result<MemcpyResult> r = memcpy_gbps(2, 8 << 20, 3);
  ASSERT_TRUE(r.ok()) << describe(r.status());
  expect_plausible(*r);
  EXPECT_EQ(r->threads, 2u);
  EXPECT_EQ(r->repetitions, 3);
}

TEST(MemcpyBaselineTest, RejectsEmptyRuns) {
  EXPECT_EQ(memcpy_gbps(0, 1 << 20).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(memcpy_gbps(1, 0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(memcpy_gbps(1, 1 << 20, 0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(copy_gbps(0, 1 << 20).status().code(), Code::kInvalidArgument);
}

TEST(CopyBaselineTest, MeasuresMemcpyAndStreamingCopyInTheSameRun) {
  // An odd size: the streaming copy's unaligned tail is copied (and verified) too.
  Result<CopyComparison> r = copy_gbps(2, (4 << 20) + 77, 3);
  ASSERT_TRUE(r.ok()) << describe(r.status());
  expect_plausible(r->memcpy);
  expect_plausible(r->stream);
  EXPECT_EQ(r->stream.threads, 2u);
  EXPECT_EQ(r->stream.bytes_per_thread, (4u << 20) + 77);
  EXPECT_EQ(r->stream.repetitions, 3);
  const CopyResult& best = r->best();
  EXPECT_EQ(best.median_gbps, std::max(r->memcpy.median_gbps, r->stream.median_gbps));
  EXPECT_EQ(&best, r->faster() == CopyMethod::kStream ? &r->stream : &r->memcpy);
  EXPECT_STREQ(copy_method_name(CopyMethod::kStream), "stream");
  EXPECT_STREQ(copy_method_name(CopyMethod::kMemcpy), "memcpy");
}

IntegrityOptions small_integrity(unsigned threads) {
  IntegrityOptions o;
  o.threads = threads;
  o.chunk_bytes = (256 << 10) + 4096 + 48;  // the last block is short, and not 64-byte sized
  o.chunks_per_thread = 4;
  o.block_bytes = 64 << 10;
  o.repetitions = 3;
  return o;
}

TEST(IntegrityBaselineTest, EveryMethodIsVerifiedAndMeasured) {
  for (unsigned threads : {1u, 2u}) {
    Result<IntegrityResult> r = integrity_gbps(small_integrity(threads));
    ASSERT_TRUE(r.ok()) << describe(r.status());  // a wrong copy or hash is kInternal
    for (int m = 0; m < kIntegrityMethods; ++m) {
      SCOPED_TRACE(integrity_method_name(static_cast<IntegrityMethod>(m)));
      expect_plausible(r->rate[m]);
      EXPECT_GT(r->vs_copy[m], 0.0);
    }
    EXPECT_TRUE(r->verify_read == IntegrityMethod::kVerifyReadStream ||
                r->verify_read == IntegrityMethod::kVerifyReadCached);
    EXPECT_GE(r->of(r->verify_read).median_gbps, r->of(IntegrityMethod::kVerifyReadStream).median_gbps);
    EXPECT_GE(r->of(r->verify_read).median_gbps, r->of(IntegrityMethod::kVerifyReadCached).median_gbps);
    // The copy's paired ratio against itself is exactly 1.
    EXPECT_DOUBLE_EQ(r->ratio(IntegrityMethod::kCopy), 1.0);
  }
}

TEST(IntegrityBaselineTest, HandlesChunksSmallerThanABlock) {
  IntegrityOptions o = small_integrity(1);
  o.chunk_bytes = 1000;
  o.block_bytes = 4096;
  Result<IntegrityResult> r = integrity_gbps(o);
  ASSERT_TRUE(r.ok()) << describe(r.status());
  EXPECT_GT(r->of(IntegrityMethod::kHashedStore).median_gbps, 0.0);
}

TEST(IntegrityBaselineTest, RejectsEmptyRuns) {
  for (auto edit : {+[](IntegrityOptions& o) { o.threads = 0; }, +[](IntegrityOptions& o) { o.chunk_bytes = 0; },
                    +[](IntegrityOptions& o) { o.chunks_per_thread = 0; },
                    +[](IntegrityOptions& o) { o.block_bytes = 0; }, +[](IntegrityOptions& o) { o.repetitions = 0; },
                    +[](IntegrityOptions& o) { o.chunks_per_thread = SIZE_MAX; }}) {
    IntegrityOptions o = small_integrity(1);
    edit(o);
    EXPECT_EQ(integrity_gbps(o).status().code(), Code::kInvalidArgument);
  }
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
  KDN_SKIP_OR_FAIL("HIREDIS", "built without hiredis");
#endif
  if (find_on_path("redis-server").empty()) KDN_SKIP_OR_FAIL("REDIS", "redis-server is not installed");
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
