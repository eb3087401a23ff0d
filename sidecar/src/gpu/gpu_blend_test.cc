// GPU_BLEND_SELECT's plan on the CPU: candidates from the layout's slots, the recompute count,
// the refusals, the scratch layout, and the checks of the device's answer.
#include "gpu_blend.h"

#include <kdn/kernels/blend.h>

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace kdn::sidecar::gpu {
namespace {

kernels::ChunkGeometry geo16() {
  kernels::ChunkGeometry g;
  g.layers = 4;
  g.kv_heads = 2;
  g.head_dim = 8;
  g.tokens = 16;
  g.dtype = kernels::DType::kF16;
  return g;
}

// Two chunks at layout tokens 0 and 32; the second holds 10 rows (a partial last chunk).
struct Fixture {
  std::vector<int64_t> slots = std::vector<int64_t>(48, -1);
  std::vector<ipc::GpuSegmentChunkRecord> recs = {{7, 0, ipc::kGpuSegmentStart}, {-3, 32, ipc::kGpuSegmentStart}};
  Fixture() {
    for (int t = 0; t < 16; ++t) slots[size_t(t)] = 100 + t;
    for (int t = 0; t < 10; ++t) slots[size_t(32 + t)] = 200 + t;
  }
};

TEST(GpuBlendPlan, RecomputeCountMatchesTheKernelsRule) {
  for (uint32_t n : {0u, 1u, 7u, 56u, 1000u, 65536u}) {
    for (uint32_t ppm : {0u, 1u, 80357u, 150000u, 500000u, 999999u, 1000000u}) {
      const uint32_t want = kernels::recompute_count(n, ppm / 1e6);
      const uint32_t got = recompute_count_ppm(n, ppm);
      // The kernels' double product may round a product just below an integer up; never by more.
      EXPECT_LE(want > got ? want - got : got - want, 1u) << n << " " << ppm;
      if (n > 0 && ppm > 0) {
        EXPECT_GE(got, 1u);
      }
      EXPECT_LE(got, n);
    }
  }
  EXPECT_EQ(recompute_count_ppm(56, 80357), 4u);  // floor(4.499...)
  EXPECT_EQ(recompute_count_ppm(56, 1000000), 56u);
  EXPECT_EQ(recompute_count_ppm(3, 1), 1u);  // at least one
  EXPECT_EQ(recompute_count_ppm(0, 500000), 0u);
}

TEST(GpuBlendPlan, CandidatesAreTheRowsTheLayoutNames) {
  Fixture f;
  auto p = plan_blend(geo16(), f.slots, f.recs, {2, ipc::kGpuBlendPlaneV, 250000}, 100);
  ASSERT_TRUE(p.ok()) << p.status().what();
  EXPECT_EQ(p->n_tokens, 32u);
  EXPECT_EQ(p->n_candidates, 26u);
  EXPECT_EQ(p->k, 6u);  // floor(26 / 4)
  EXPECT_EQ(p->layer.layers, 1u);
  EXPECT_EQ(p->check_layer, 2u);
  EXPECT_EQ(p->plane, ipc::kGpuBlendPlaneV);
  // Layer 2 of a canonical chunk starts after layers 0 and 1, K and V each.
  EXPECT_EQ(p->layer_offset_bytes, 2u * 2 * 16 * 2 * 8 * 2);
  EXPECT_EQ(p->layer_bytes, 2u * 16 * 2 * 8 * 2);
  for (uint32_t j = 0; j < 32; ++j)
    EXPECT_EQ(p->candidates[j], j < 26 ? 1 : 0) << j;  // 16 rows of the first chunk, 10 of the second
  EXPECT_EQ((std::vector<int64_t>{0, 32}), p->first_token);
}

TEST(GpuBlendPlan, BadQueriesAndChunksAreRefused) {
  Fixture f;
  const kernels::ChunkGeometry g = geo16();
  EXPECT_EQ(plan_blend(g, f.slots, f.recs, {4, 0, 1}, 100).status().code(), Code::kInvalidArgument);  // layer 4 of 4
  EXPECT_EQ(plan_blend(g, f.slots, f.recs, {0, 2, 1}, 100).status().code(), Code::kInvalidArgument);  // plane
  EXPECT_EQ(plan_blend(g, f.slots, f.recs, {0, 0, 1000001}, 100).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(plan_blend(g, f.slots, f.recs, {0, 0, 1000000}, 25).status().code(), Code::kLimit);  // 26 to select
  EXPECT_TRUE(plan_blend(g, f.slots, f.recs, {0, 0, 1000000}, 26).ok());
  auto overlap = f.recs;
  overlap[1].first_token = 8;
  EXPECT_EQ(plan_blend(g, f.slots, overlap, {0, 0, 1}, 100).status().code(), Code::kInvalidArgument);
  auto outside = f.recs;
  outside[1].first_token = 33;  // 33 + 16 > 48
  EXPECT_EQ(plan_blend(g, f.slots, outside, {0, 0, 1}, 100).status().code(), Code::kInvalidArgument);
  auto none = plan_blend(g, f.slots, {}, {0, 0, 500000}, 0);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->k, 0u);
}

TEST(GpuBlendPlan, ScratchIsLaidOutInsideTheBounceArea) {
  Fixture f;
  auto p = plan_blend(geo16(), f.slots, f.recs, {1, 0, 500000}, 100);
  ASSERT_TRUE(p.ok());
  BlendPlan q = *p;
  ASSERT_TRUE(place_blend(q, 5000, 64, 1 << 20).ok());
  EXPECT_GE(q.fresh_off, q.cached_off + q.layer_bytes);
  EXPECT_GE(q.dev_off, q.fresh_off + q.layer_bytes);
  EXPECT_GE(q.count_off, q.dev_off + q.n_tokens * 4);
  EXPECT_EQ(q.selected_off, q.count_off + 8);
  EXPECT_GE(q.topk_off, q.selected_off + q.n_tokens * 4);
  EXPECT_EQ(q.bounce_need, q.topk_off + 5000);
  for (uint64_t off : {q.fresh_off, q.dev_off, q.count_off, q.topk_off, q.mask_off, q.result_off})
    EXPECT_EQ(off % 256, 0u);
  EXPECT_GE(q.mask_off, 64u);
  EXPECT_GE(q.result_off, q.mask_off + q.n_tokens);
  EXPECT_EQ(q.tail_bytes, q.result_off + 8 + q.k * 4);
  BlendPlan small = *p;
  const Status st = place_blend(small, 5000, 64, q.bounce_need - 1);
  EXPECT_EQ(st.code(), Code::kLimit);
  EXPECT_NE(std::string(st.what()).find("staging_bytes"), std::string::npos);

  const std::vector<float> table(16, 0.5f);
  const std::vector<std::byte> tail = blend_tail(q, table);
  ASSERT_EQ(tail.size(), q.tail_bytes);
  EXPECT_EQ(std::memcmp(tail.data(), table.data(), 64), 0);
  EXPECT_EQ(std::memcmp(tail.data() + q.mask_off, q.candidates.data(), q.n_tokens), 0);
}

// The answer area: a u32 count, 4 bytes of padding, then the indices.
std::vector<std::byte> answer(uint32_t count, const std::vector<int32_t>& idx) {
  std::vector<std::byte> a(8 + idx.size() * 4);
  std::memcpy(a.data(), &count, 4);
  std::memcpy(a.data() + 8, idx.data(), idx.size() * 4);
  return a;
}

TEST(GpuBlendPlan, TheDevicesAnswerIsCheckedAndMappedToLayoutTokens) {
  Fixture f;
  f.recs = {f.recs[1], f.recs[0]};  // chunks out of layout order
  auto p = plan_blend(geo16(), f.slots, f.recs, {0, 0, 100000}, 100);
  ASSERT_TRUE(p.ok());
  ASSERT_EQ(p->k, 2u);  // floor(26 / 10)
  // Compared token 3 is row 3 of the chunk at 32; compared token 20 is row 4 of the chunk at 0.
  auto good = blend_answer(*p, answer(2, {3, 20}).data());
  ASSERT_TRUE(good.ok()) << good.status().what();
  EXPECT_EQ(*good, (std::vector<int32_t>{4, 35}));
  EXPECT_EQ(blend_answer(*p, answer(1, {3}).data()).status().code(), Code::kInternal);      // not k
  EXPECT_EQ(blend_answer(*p, answer(2, {20, 3}).data()).status().code(), Code::kInternal);  // descending
  EXPECT_EQ(blend_answer(*p, answer(2, {3, 3}).data()).status().code(), Code::kInternal);   // repeated
  EXPECT_EQ(blend_answer(*p, answer(2, {3, 12}).data()).status().code(), Code::kInternal);  // row 12 of 10
  EXPECT_EQ(blend_answer(*p, answer(2, {3, 32}).data()).status().code(), Code::kInternal);  // past the tokens
  EXPECT_EQ(blend_answer(*p, answer(2, {-1, 3}).data()).status().code(), Code::kInternal);
}

}  // namespace
}  // namespace kdn::sidecar::gpu
