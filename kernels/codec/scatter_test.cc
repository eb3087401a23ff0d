// kvc1_decode_scatter against the unfused path: kvc1_decode into a canonical chunk, then the
// kernels' rope_scatter (or scatter) into the same engine layout.
#include "codec_test_util.h"

#include <kdn/kernels/codec.h>
#include <kdn/kernels/ops.h>
#include <kdn/kernels/presets.h>
#include <kdn/kernels/rope.h>

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace kdn::kernels {
namespace {

using testing::config;
using testing::encode;
using testing::geometry;
using testing::geometry_bytes;
using testing::kTestFingerprint;

constexpr uint8_t kSentinel = 0xA5;

// Engine buffers of one preset layout, filled with a sentinel, and their view.
struct Engine {
  std::vector<std::vector<uint8_t>> k, v;
  std::vector<void*> kb, vb;
  std::vector<int64_t> slots;
  EngineView view;

  Engine(EngineLayoutKind kind, const PagedShape& shape, bool permute_k, uint32_t tokens) {
    const size_t bytes = static_cast<size_t>(engine_layer_elements(kind, shape)) * dtype_size(shape.dtype);
    const bool split = engine_layout_splits_kv(kind);
    k.assign(shape.layers, std::vector<uint8_t>(bytes, kSentinel));
    v.assign(split ? shape.layers : 0, std::vector<uint8_t>(bytes, kSentinel));
    for (auto& b : k) kb.push_back(b.data());
    for (auto& b : v) vb.push_back(b.data());
    EXPECT_TRUE(preset_view(kind, shape, kb.data(), split ? vb.data() : nullptr, permute_k, &view).ok());
    // Tokens on blocks in reverse order, every seventh token skipped (slot -1).
    const int64_t blocks = shape.num_blocks;
    for (uint32_t t = 0; t < tokens; ++t) {
      const int64_t blk = blocks - 1 - static_cast<int64_t>(t) / shape.block_size;
      slots.push_back(t % 7 == 3 ? -1 : blk * shape.block_size + t % shape.block_size);
    }
    view.slot_mapping = slots.data();
  }
};

struct RopeFixture {
  std::vector<float> inv_freq, table;
  RopeTable rt;

  RopeFixture(RopeStyle style, uint32_t head_dim, uint32_t rotary_dim, int64_t delta) {
    RopeConfig c;
    c.style = style;
    c.head_dim = head_dim;
    c.rotary_dim = rotary_dim;
    c.theta = 100000.0;
    inv_freq.resize(rotary_dim / 2);
    EXPECT_TRUE(compute_inv_freq(c, inv_freq.data(), inv_freq.size()).ok());
    table.resize(rope_table_floats(1, rotary_dim));
    EXPECT_TRUE(build_rope_table(inv_freq.data(), rotary_dim, &delta, 1, table.data(), table.size()).ok());
    rt.style = style;
    rt.rotary_dim = rotary_dim;
    rt.cos_sin = table.data();
  }
};

// Engine contents as f32 chunks (gathered back), to compare with a tolerance.
std::vector<float> gathered(const Engine& e, ChunkGeometry g) {
  g.dtype = DType::kF32;
  std::vector<float> out(geometry_bytes(g) / 4, 0.0f);
  EXPECT_TRUE(gather(e.view, out.data(), g, Executor::cpu(1)).ok());
  return out;
}

struct Case {
  EngineLayoutKind layout;
  bool permute_k;
  DType chunk_dtype, engine_dtype;
  RopeStyle style;
  uint32_t rotary_dim;
};

void check_case(const Case& c, CodecMode mode, bool rotate = false) {
  SCOPED_TRACE(::testing::Message() << engine_layout_name(c.layout) << " " << codec_mode_name(mode)
                                    << (rotate ? " rotated" : "") << " chunk " << static_cast<int>(c.chunk_dtype)
                                    << " engine " << static_cast<int>(c.engine_dtype));
  const ChunkGeometry g = geometry(2, 2, 64, 40, c.chunk_dtype);
  PagedShape shape;
  shape.layers = g.layers;
  shape.kv_heads = g.kv_heads;
  shape.head_dim = g.head_dim;
  shape.num_blocks = 6;
  shape.block_size = 8;
  shape.dtype = c.engine_dtype;
  const std::vector<uint8_t> chunk = testing::synthetic_chunk(g, 4);
  CodecConfig cfg = config(mode);
  cfg.rotate = rotate;
  cfg.ends_context = true;  // sink rows first, recent rows last, quantized rows between
  const std::vector<uint8_t> blob = encode(g, chunk.data(), cfg);
  const RopeFixture rope(c.style, g.head_dim, c.rotary_dim, 777);

  Engine fused(c.layout, shape, c.permute_k, g.tokens), reference(c.layout, shape, c.permute_k, g.tokens);
  ASSERT_TRUE(kvc1_decode_scatter(blob.data(), blob.size(), g, kTestFingerprint, fused.view, &rope.rt).ok());
  std::vector<uint8_t> decoded(geometry_bytes(g));
  ASSERT_TRUE(kvc1_decode(blob.data(), blob.size(), g, kTestFingerprint, decoded.data(), decoded.size()).ok());
  ASSERT_TRUE(rope_scatter(decoded.data(), g, reference.view, rope.rt, Executor::cpu(1)).ok());

  // Exact unless the unfused path rounds dequantized values to a narrower chunk dtype first.
  const bool exact = mode == CodecMode::kRaw || mode == CodecMode::kLossless || c.chunk_dtype == DType::kF32;
  if (exact) {
    EXPECT_TRUE(fused.k == reference.k && fused.v == reference.v);
    return;
  }
  // A rotated value mixes its pair, so the rounding difference scales with the row, not the
  // element: allow a few ulps of the chunk dtype at the row's largest magnitude.
  const std::vector<float> a = gathered(fused, g), b = gathered(reference, g);
  const int mant = c.chunk_dtype == DType::kBF16 ? 7 : 10;
  for (size_t row = 0; row < a.size() / g.head_dim; ++row) {
    float mx = 1e-3f;
    for (uint32_t d = 0; d < g.head_dim; ++d) mx = std::max(mx, std::fabs(b[row * g.head_dim + d]));
    const float tol = std::ldexp(4.0f, std::ilogb(mx) - mant);
    for (uint32_t d = 0; d < g.head_dim; ++d)
      ASSERT_LE(std::fabs(a[row * g.head_dim + d] - b[row * g.head_dim + d]), tol) << row << " " << d;
  }
}

TEST(DecodeScatter, MatchesDecodeThenRopeScatter) {
  const Case cases[] = {
      {EngineLayoutKind::kVllmFlashNhd, false, DType::kF32, DType::kF16, RopeStyle::kNeox, 64},
      {EngineLayoutKind::kFlashinferHnd, false, DType::kF32, DType::kBF16, RopeStyle::kGptj, 32},
      {EngineLayoutKind::kLlamaCppVTrans, true, DType::kF16, DType::kF16, RopeStyle::kGptj, 64},
      {EngineLayoutKind::kSglangTokenPool, false, DType::kF16, DType::kF32, RopeStyle::kNeox, 48},
      {EngineLayoutKind::kVllmFlashHnd, false, DType::kBF16, DType::kBF16, RopeStyle::kNeox, 64},
  };
  for (const Case& c : cases) {
    for (CodecMode m : testing::kAllModes) check_case(c, m);
    for (CodecMode m : {CodecMode::kInt8, CodecMode::kKivi4, CodecMode::kKivi2}) check_case(c, m, true);
  }
}

TEST(DecodeScatter, WithoutRopeEqualsDecodeThenScatter) {
  const ChunkGeometry g = geometry(2, 2, 64, 40);
  PagedShape shape{2, 2, 64, 6, 8, DType::kF16};
  const std::vector<uint8_t> chunk = testing::synthetic_chunk(g, 5);
  for (CodecMode m : testing::kAllModes) {
    const std::vector<uint8_t> blob = encode(g, chunk.data(), config(m));
    Engine fused(EngineLayoutKind::kVllmFlashNhd, shape, false, g.tokens);
    Engine reference(EngineLayoutKind::kVllmFlashNhd, shape, false, g.tokens);
    ASSERT_TRUE(kvc1_decode_scatter(blob.data(), blob.size(), g, kTestFingerprint, fused.view, nullptr).ok());
    std::vector<uint8_t> decoded(geometry_bytes(g));
    ASSERT_TRUE(kvc1_decode(blob.data(), blob.size(), g, kTestFingerprint, decoded.data(), decoded.size()).ok());
    ASSERT_TRUE(scatter(decoded.data(), g, reference.view, Executor::cpu(1)).ok());
    EXPECT_TRUE(fused.k == reference.k) << codec_mode_name(m);
  }
}

TEST(DecodeScatter, RefusesBadDestinationsBeforeWriting) {
  const ChunkGeometry g = geometry(1, 2, 64, 16);
  PagedShape shape{1, 2, 64, 2, 8, DType::kF16};
  const std::vector<uint8_t> blob = encode(g, testing::synthetic_chunk(g).data(), config(CodecMode::kKivi4));
  Engine e(EngineLayoutKind::kVllmFlashNhd, shape, false, g.tokens);
  const std::vector<uint8_t> before = e.k[0];
  e.slots[9] = 16;  // == slot_limit
  EXPECT_EQ(kvc1_decode_scatter(blob.data(), blob.size(), g, kTestFingerprint, e.view, nullptr).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(e.k[0], before);
  e.slots[9] = 9;
  RopeFixture rope(RopeStyle::kNeox, 64, 64, 3);
  rope.rt.rotary_dim = 66;
  EXPECT_EQ(kvc1_decode_scatter(blob.data(), blob.size(), g, kTestFingerprint, e.view, &rope.rt).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(kvc1_decode_scatter(blob.data(), blob.size(), g, kdn_key{5, 6}, e.view, nullptr).code(),
            Code::kModelMismatch);
  EXPECT_EQ(e.k[0], before);
  std::vector<uint8_t> bad = blob;
  bad[bad.size() / 2] ^= 1;
  EXPECT_EQ(kvc1_decode_scatter(bad.data(), bad.size(), g, kTestFingerprint, e.view, nullptr).code(), Code::kCorrupt);
  EXPECT_EQ(e.k[0], before);
}

TEST(DecodeScatter, ParallelEqualsSerial) {
  const ChunkGeometry g = geometry(3, 2, 64, 40);
  PagedShape shape{3, 2, 64, 6, 8, DType::kF16};
  const std::vector<uint8_t> blob = encode(g, testing::synthetic_chunk(g, 9).data(), config(CodecMode::kKivi2));
  const RopeFixture rope(RopeStyle::kNeox, 64, 64, -300);
  Engine a(EngineLayoutKind::kFlashinferNhd, shape, false, g.tokens),
      b(EngineLayoutKind::kFlashinferNhd, shape, false, g.tokens);
  DecodeOptions par;
  par.cpu_threads = 0;
  ASSERT_TRUE(kvc1_decode_scatter(blob.data(), blob.size(), g, kTestFingerprint, a.view, &rope.rt).ok());
  ASSERT_TRUE(kvc1_decode_scatter(blob.data(), blob.size(), g, kTestFingerprint, b.view, &rope.rt, par).ok());
  EXPECT_TRUE(a.k == b.k);
}

}  // namespace
}  // namespace kdn::kernels
