// Segments as chunks: partial last chunks, token offsets, the fused rotation, bad input.
#include <kdn/common/model.h>
#include <kdn/kernels/segment.h>

#include <gtest/gtest.h>

#include <vector>

#include "test_support.h"

namespace kdn::kernels {
namespace {

using testing::EngineBuffers;

constexpr uint32_t kT = 8;  // tokens per chunk

struct SegmentFixture {
  ChunkGeometry g{3, 2, 16, kT, DType::kF16};
  PagedShape shape{3, 2, 16, 64, 1, DType::kF16};  // 64 cells of llama.cpp rows
  EngineBuffers engine;
  std::vector<float> inv;
  SegmentRope rope;

  SegmentFixture() {
    EXPECT_TRUE(engine.init(EngineLayoutKind::kLlamaCppVTrans, shape, false).ok());
    RopeConfig cfg;
    cfg.style = RopeStyle::kGptj;
    cfg.head_dim = 16;
    cfg.theta = 100000.0;
    inv.resize(8);
    EXPECT_TRUE(compute_inv_freq(cfg, inv.data(), inv.size()).ok());
    rope = SegmentRope{RopeStyle::kGptj, 16, inv.data()};
  }
  std::vector<std::vector<uint8_t>> chunks(size_t n) const {
    return std::vector<std::vector<uint8_t>>(n, std::vector<uint8_t>(chunk_bytes(g), 0xEE));
  }
};

std::vector<const void*> ptrs(const std::vector<std::vector<uint8_t>>& c) {
  std::vector<const void*> p;
  for (auto& x : c) p.push_back(x.data());
  return p;
}
std::vector<void*> ptrs(std::vector<std::vector<uint8_t>>& c) {
  std::vector<void*> p;
  for (auto& x : c) p.push_back(x.data());
  return p;
}

TEST(Segment, GatherThenScatterRoundTripsAPartialLastChunk) {
  SegmentFixture f;
  CounterRng rng(7);
  for (auto& b : f.engine.k) testing::fill_random(b.data(), b.size() / 2, DType::kF16, rng);
  for (auto& b : f.engine.v) testing::fill_random(b.data(), b.size() / 2, DType::kF16, rng);
  const uint64_t n = 2 * kT + 3;  // two whole chunks and 3 tokens
  EngineView src = f.engine.view;
  src.first_token = 5;  // the segment sits at cells 5 .. 5 + n
  auto c = f.chunks(3);
  ASSERT_TRUE(gather_segment(src, ptrs(c), n, f.g, Executor::cpu()).ok());
  // The partial chunk's rows past the segment are zero, whatever the slot held before.
  for (uint32_t l = 0; l < f.g.layers; ++l)
    for (uint32_t p = 0; p < 2; ++p)
      for (uint32_t t = 3; t < kT; ++t)
        for (uint32_t d = 0; d < 2 * 16 * 2; ++d)
          ASSERT_EQ(c[2][chunk_offset(f.g, l, p, t, 0, 0) * 2 + d], 0) << l << " " << p << " " << t;

  EngineBuffers out;
  ASSERT_TRUE(out.init(EngineLayoutKind::kLlamaCppVTrans, f.shape, false).ok());
  EngineView dst = out.view;
  dst.first_token = 5;
  ASSERT_TRUE(scatter_segment(ptrs(std::as_const(c)), n, f.g, dst, f.rope, 0, Executor::cpu()).ok());
  // Cells 5 .. 5 + n equal the source; every other cell is untouched (sentinel).
  const uint32_t row = 2 * 16;
  for (uint32_t l = 0; l < f.g.layers; ++l)
    for (int64_t cell = 0; cell < 64; ++cell) {
      const bool in = cell >= 5 && cell < 5 + int64_t(n);
      for (uint32_t e = 0; e < row; ++e) {
        const uint16_t* ks = reinterpret_cast<const uint16_t*>(f.engine.k[l].data());
        const uint16_t* kd = reinterpret_cast<const uint16_t*>(out.k[l].data());
        const uint16_t* vs = reinterpret_cast<const uint16_t*>(f.engine.v[l].data());
        const uint16_t* vd = reinterpret_cast<const uint16_t*>(out.v[l].data());
        const int64_t ki = cell * row + e, vi = int64_t(e) * 64 + cell;  // V transposed: (H*D, cells)
        if (in) {
          ASSERT_EQ(kd[ki], ks[ki]);
          ASSERT_EQ(vd[vi], vs[vi]);
        } else {
          ASSERT_EQ(kd[ki], 0xA5A5);
          ASSERT_EQ(vd[vi], 0xA5A5);
        }
      }
    }
}

TEST(Segment, ScatterRotatesKByTheDeltaInTheSamePass) {
  SegmentFixture f;
  auto c = f.chunks(2);
  for (size_t i = 0; i < c.size(); ++i) c[i] = testing::random_chunk(f.g, 11 + i);
  const uint64_t n = kT + 5;
  const int64_t delta = 1234;
  // Reference: rotate copies of the chunks with rope_chunk, then scatter them unrotated.
  auto rotated = c;
  std::vector<float> table(rope_table_floats(1, 16));
  ASSERT_TRUE(build_rope_table(f.inv.data(), 16, &delta, 1, table.data(), table.size()).ok());
  const RopeTable rt{RopeStyle::kGptj, 16, table.data(), 0};
  for (auto& x : rotated) ASSERT_TRUE(rope_chunk(x.data(), f.g, rt, Executor::cpu()).ok());
  EngineBuffers a, b;
  ASSERT_TRUE(a.init(EngineLayoutKind::kLlamaCppRows, f.shape, false).ok());
  ASSERT_TRUE(b.init(EngineLayoutKind::kLlamaCppRows, f.shape, false).ok());
  std::vector<int64_t> slots(64);
  for (int64_t i = 0; i < 64; ++i) slots[i] = 63 - i;  // any mapping: reversed cells
  a.view.slot_mapping = slots.data();
  b.view.slot_mapping = slots.data();
  a.view.first_token = b.view.first_token = 20;
  ASSERT_TRUE(scatter_segment(ptrs(std::as_const(c)), n, f.g, a.view, f.rope, delta, Executor::cpu()).ok());
  ASSERT_TRUE(scatter_segment(ptrs(std::as_const(rotated)), n, f.g, b.view, f.rope, 0, Executor::cpu()).ok());
  EXPECT_TRUE(a == b);
  // A leading part of a longer segment: its whole chunks alone.
  ASSERT_TRUE(scatter_segment(std::span<const void* const>(ptrs(std::as_const(c))).first(1), kT, f.g, a.view, f.rope,
                              delta, Executor::cpu())
                  .ok());
}

TEST(Segment, RefusesBadInput) {
  SegmentFixture f;
  auto c = f.chunks(2);
  const auto p = ptrs(std::as_const(c));
  const Executor cpu = Executor::cpu();
  EngineView v = f.engine.view;
  EXPECT_EQ(scatter_segment(p, 2 * kT + 1, f.g, v, f.rope, 0, cpu).code(), Code::kInvalidArgument)
      << "more tokens than chunks";
  EXPECT_EQ(scatter_segment(p, kT, f.g, v, f.rope, 0, cpu).code(), Code::kInvalidArgument) << "a chunk too many";
  EXPECT_EQ(scatter_segment(p, 0, f.g, v, f.rope, 0, cpu).code(), Code::kInvalidArgument);
  EXPECT_EQ(scatter_segment(p, kT + 1, f.g, v, f.rope, kdn::kMaxPosition + 1, cpu).code(), Code::kInvalidArgument);
  EXPECT_EQ(scatter_segment(p, kT + 1, f.g, v, SegmentRope{}, 5, cpu).code(), Code::kInvalidArgument) << "no RoPE";
  std::vector<const void*> with_null = {c[0].data(), nullptr};
  EXPECT_EQ(scatter_segment(with_null, kT + 1, f.g, v, f.rope, 0, cpu).code(), Code::kInvalidArgument);
  // A slot past the engine's cells fails the whole op before a byte moves.
  std::vector<int64_t> slots(64, 0);
  slots[9] = 64;
  v.slot_mapping = slots.data();
  EngineBuffers untouched;
  ASSERT_TRUE(untouched.init(EngineLayoutKind::kLlamaCppVTrans, f.shape, false).ok());
  EXPECT_FALSE(scatter_segment(p, kT + 2, f.g, v, f.rope, 0, cpu).ok());
  EXPECT_TRUE(f.engine == untouched);
}

}  // namespace
}  // namespace kdn::kernels
