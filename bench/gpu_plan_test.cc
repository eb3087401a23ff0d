#include "gpu_plan.h"

#include <gtest/gtest.h>

namespace kdn::bench {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kLlamaChunk = 32 * kMiB;  // llama3-8b, 256 tokens, fp16

TEST(GpuPlan, DefaultsMoveTwoGiBPerFigureAndReadEightGiBPerDecodeStep) {
  const GpuPlan p = plan_gpu_bench({}, kLlamaChunk, 256);
  EXPECT_EQ(p.bulk_chunks, 64u);
  EXPECT_EQ(p.bulk_bytes, 2048 * kMiB);
  EXPECT_EQ(p.reps, 3u);
  EXPECT_EQ(p.engine_kv_bytes, 8192 * kMiB);
  EXPECT_GE(p.host_arena_bytes, 2 * p.reps * p.bulk_bytes);
  EXPECT_GE(p.t0_bytes, p.reps * p.bulk_bytes);
  EXPECT_EQ(p.latency_samples, 64u);
}

TEST(GpuPlan, QuickIsSmallerAndOverridesWin) {
  GpuBenchSizes s;
  s.quick = true;
  const GpuPlan q = plan_gpu_bench(s, kLlamaChunk, 256);
  EXPECT_EQ(q.bulk_chunks, 8u);
  EXPECT_EQ(q.engine_kv_bytes, 2048 * kMiB);
  EXPECT_EQ(q.reps, 2u);
  s.bulk_mib = 10;  // less than a chunk: one chunk
  s.reps = 5;
  s.decode_mib = 1;  // the cache still holds two bulk sets
  const GpuPlan o = plan_gpu_bench(s, kLlamaChunk, 256);
  EXPECT_EQ(o.bulk_chunks, 1u);
  EXPECT_EQ(o.reps, 5u);
  EXPECT_EQ(o.engine_kv_bytes, 2 * kLlamaChunk);
}

TEST(GpuPlan, RatiosAndBarsFollowTheFigures) {
  Report r;
  r.set("baselines.h2d_pinned_gbps", 50.0);
  r.set("baselines.d2d_gbps", 1000.0);
  r.set("kdn.t1_to_engine_gbps", 45.0);
  r.set("kdn.t0_to_engine_gbps", 600.0);
  r.set("kdn.engine_to_t0_gbps", 800.0);
  r.set_null("kdn.decode_to_engine_gbps");
  r.set("kdn.decode_step_slowdown", 1.3);
  add_gpu_ratios_and_bars(r);
  EXPECT_DOUBLE_EQ(*r.number("ratios.t1_to_engine_vs_h2d"), 0.9);
  EXPECT_DOUBLE_EQ(*r.number("ratios.t0_to_engine_vs_d2d"), 0.6);
  EXPECT_DOUBLE_EQ(*r.number("ratios.engine_to_t0_vs_d2d"), 0.8);
  EXPECT_FALSE(r.number("ratios.decode_to_engine_vs_d2d").has_value());
  EXPECT_EQ((*r.find("bars.t1_to_engine_vs_h2d"))["pass"], true);
  EXPECT_EQ((*r.find("bars.t0_to_engine_vs_d2d"))["pass"], false);
  EXPECT_TRUE((*r.find("bars.decode_to_engine_gbps"))["pass"].is_null());
  EXPECT_EQ((*r.find("bars.decode_step_slowdown"))["pass"], false);
  EXPECT_FALSE(r.all_bars_pass("bars"));
}

TEST(GpuPlan, MissingFiguresBecomeNullWithAReason) {
  Report r;
  r.set("kdn.t1_to_engine_gbps", 40.0);
  fill_missing_gpu_figures(r, "kdnd did not start");
  EXPECT_DOUBLE_EQ(*r.number("kdn.t1_to_engine_gbps"), 40.0);
  EXPECT_EQ(r.find("kdn.t1_to_engine_gbps_reason"), nullptr);
  ASSERT_NE(r.find("kdn.peer_gbps"), nullptr);
  EXPECT_TRUE(r.find("kdn.peer_gbps")->is_null());
  EXPECT_EQ(*r.find("kdn.peer_gbps_reason"), "kdnd did not start");
  EXPECT_TRUE(r.find("baselines.d2d_gbps")->is_null());
}

}  // namespace
}  // namespace kdn::bench
