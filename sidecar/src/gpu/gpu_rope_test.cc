// GPU_SEGMENT_RETRIEVE's pure parts, on the CPU: which chunks are copied (leading cached chunks
// per segment, as on the host), delta grouping, and the RoPE tables kdnd stages on the device.
#include "gpu/gpu_rope.h"

#include <kdn/common/model.h>
#include <kdn/kernels/segment.h>

#include <gtest/gtest.h>

#include <cstring>

namespace kdn::sidecar::gpu {
namespace {

using Rec = ipc::GpuSegmentChunkRecord;
constexpr uint32_t kStart = ipc::kGpuSegmentStart;

kdn_model_desc rope_model(uint32_t style = KDN_ROPE_NEOX) {
  kdn_model_desc d{};
  d.struct_size = sizeof d;
  std::strcpy(d.name, "rope-test");
  d.num_layers = 2;
  d.num_kv_heads = 2;
  d.head_dim = 8;
  d.dtype = KDN_DTYPE_F16;
  d.chunk_tokens = 16;
  d.rope_style = style;
  d.rope_theta = 10000.0;
  return d;
}

TEST(LeadingChunks, StopAtTheFirstMissOfEachSegment) {
  // Two segments: [0, 3) and [3, 6).
  const std::vector<Rec> r = {{5, 0, kStart}, {5, 16, 0}, {5, 32, 0}, {-2, 48, kStart}, {-2, 64, 0}, {-2, 80, 0}};
  EXPECT_EQ(leading_chunks(r, std::vector<uint8_t>{1, 1, 1, 1, 1, 1}), (std::vector<uint8_t>{1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(leading_chunks(r, std::vector<uint8_t>{1, 0, 1, 1, 1, 0}), (std::vector<uint8_t>{1, 0, 0, 1, 1, 0}));
  EXPECT_EQ(leading_chunks(r, std::vector<uint8_t>{0, 1, 1, 0, 1, 1}), (std::vector<uint8_t>{0, 0, 0, 0, 0, 0}));
  // A miss ends only its own segment: the next start begins a new run.
  EXPECT_EQ(leading_chunks(r, std::vector<uint8_t>{1, 1, 0, 1, 1, 1}), (std::vector<uint8_t>{1, 1, 0, 1, 1, 1}));
}

TEST(LeadingChunks, AFirstRecordWithoutStartContinuesASegment) {
  const std::vector<Rec> r = {{1, 0, 0}, {1, 16, 0}, {0, 32, kStart}};
  EXPECT_EQ(leading_chunks(r, std::vector<uint8_t>{1, 1, 1}), (std::vector<uint8_t>{1, 1, 1}));
  EXPECT_EQ(leading_chunks(r, std::vector<uint8_t>{0, 1, 1}), (std::vector<uint8_t>{0, 0, 1}));
  // Fewer cached entries than records (never sent by kdnd itself): the rest count as misses.
  EXPECT_EQ(leading_chunks(r, std::vector<uint8_t>{1}), (std::vector<uint8_t>{1, 0, 0}));
}

TEST(GroupDeltas, OneRowPerDistinctNonzeroDelta) {
  const std::vector<int64_t> d = {0, 7, 7, -3, 0, 7, -3, 12};
  const RopeRows r = group_deltas(d);
  EXPECT_EQ(r.distinct, (std::vector<int64_t>{7, -3, 12}));
  EXPECT_EQ(r.row, (std::vector<int32_t>{-1, 0, 0, 1, -1, 0, 1, 2}));
  EXPECT_TRUE(group_deltas(std::vector<int64_t>{0, 0}).distinct.empty());
}

TEST(PlaceSegmentChunks, TableRowsMatchTheHostRotation) {
  const kdn_model_desc m = rope_model();
  const std::vector<Rec> r = {{100, 0, kStart}, {100, 16, 0}, {0, 32, kStart}, {-40, 48, kStart}};
  auto p = place_segment_chunks(m, r);
  ASSERT_TRUE(p.ok()) << p.status().what();
  EXPECT_EQ(p->first_token, (std::vector<int64_t>{0, 16, 32, 48}));
  EXPECT_EQ(p->row, (std::vector<int32_t>{0, 0, -1, 1}));
  EXPECT_EQ(p->rotary_dim, 8u);
  EXPECT_EQ(p->rows(), 2u);
  ASSERT_EQ(p->table.size(), kernels::rope_table_floats(2, 8));
  // Row r is exactly what the host path builds for that delta (bit for bit).
  float inv[kMaxHeadDim / 2];
  kernels::SegmentRope rope;
  ASSERT_TRUE(kernels::segment_rope_from_desc(m, inv, kMaxHeadDim / 2, &rope).ok());
  for (int64_t delta : {int64_t{100}, int64_t{-40}}) {
    float row[8];
    ASSERT_TRUE(kernels::build_rope_table(inv, 8, &delta, 1, row, 8).ok());
    const size_t at = delta == 100 ? 0 : 8;
    EXPECT_EQ(std::memcmp(row, p->table.data() + at, sizeof row), 0) << delta;
  }
}

TEST(PlaceSegmentChunks, DeltaZeroNeedsNoTableNorRope) {
  const std::vector<Rec> r = {{0, 0, kStart}, {0, 16, 0}};
  auto p = place_segment_chunks(rope_model(KDN_ROPE_NONE), r);
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->table.empty());
  EXPECT_EQ(p->rows(), 0u);
  EXPECT_EQ(p->row, (std::vector<int32_t>{-1, -1}));
}

TEST(PlaceSegmentChunks, RefusesMovesWithoutRopeAndDeltasOutOfRange) {
  std::vector<Rec> r = {{3, 0, kStart}};
  EXPECT_EQ(place_segment_chunks(rope_model(KDN_ROPE_NONE), r).status().code(), Code::kUnsupported);
  r[0].delta = KDN_MAX_POSITION + 1;
  EXPECT_EQ(place_segment_chunks(rope_model(), r).status().code(), Code::kInvalidArgument);
  r[0].delta = -KDN_MAX_POSITION;
  EXPECT_TRUE(place_segment_chunks(rope_model(), r).ok());
}

TEST(PlaceSegmentChunks, GptjRotaryDimIsTheModels) {
  kdn_model_desc m = rope_model(KDN_ROPE_GPTJ);
  m.rotary_dim = 4;
  const std::vector<Rec> r = {{9, 0, kStart}};
  auto p = place_segment_chunks(m, r);
  ASSERT_TRUE(p.ok()) << p.status().what();
  EXPECT_EQ(p->style, kernels::RopeStyle::kGptj);
  EXPECT_EQ(p->rotary_dim, 4u);
  EXPECT_EQ(p->table.size(), 4u);
}

}  // namespace
}  // namespace kdn::sidecar::gpu
