// Layouts: every preset against its engine's offset formula, scatter/gather round trips on random
// block tables, CPU launchers against the element bodies, and validation of untrusted views.
#include <kdn/common/model.h>
#include <kdn/common/model_presets.h>
#include <kdn/kernels/layout.h>
#include <kdn/kernels/ops.h>
#include <kdn/kernels/presets.h>

#include <gtest/gtest.h>

#include "test_support.h"

namespace kdn::kernels {
namespace {

using testing::EngineBuffers;
using testing::random_chunk;
using testing::random_slots;

constexpr PagedShape kShape{
    .layers = 3, .kv_heads = 3, .head_dim = 16, .num_blocks = 9, .block_size = 4, .dtype = DType::kF16};

// The engines' own element formulas (reference §4), independent of EngineView's arithmetic.
int64_t engine_formula(EngineLayoutKind kind, int64_t kv, int64_t blk, int64_t off, int64_t h, int64_t d) {
  const int64_t NB = kShape.num_blocks, BS = kShape.block_size, H = kShape.kv_heads, D = kShape.head_dim;
  const int64_t cell = blk * BS + off, cells = NB * BS;
  switch (kind) {
    case EngineLayoutKind::kVllmFlashNhd:
      return kv * NB * BS * H * D + blk * BS * H * D + off * H * D + h * D + d;
    case EngineLayoutKind::kVllmFlashHnd:
      return kv * NB * H * BS * D + blk * H * BS * D + h * BS * D + off * D + d;
    case EngineLayoutKind::kFlashinferNhd:
      return blk * 2 * BS * H * D + kv * BS * H * D + off * H * D + h * D + d;
    case EngineLayoutKind::kFlashinferHnd:
      return blk * 2 * H * BS * D + kv * H * BS * D + h * BS * D + off * D + d;
    case EngineLayoutKind::kSglangTokenPool:
    case EngineLayoutKind::kLlamaCppRows:
      return cell * H * D + h * D + d;
    case EngineLayoutKind::kLlamaCppVTrans:
      return kv == 0 ? cell * H * D + h * D + d : (h * D + d) * cells + cell;
  }
  return -1;
}

TEST(Layout, PresetsMatchEngineFormulas) {
  std::vector<uint8_t> dummy(16);
  void* bases[3] = {dummy.data(), dummy.data(), dummy.data()};
  for (EngineLayoutKind kind : kAllEngineLayouts) {
    SCOPED_TRACE(engine_layout_name(kind));
    EngineView v;
    ASSERT_TRUE(preset_view(kind, kShape, bases, bases, false, &v).ok());
    for (int64_t slot = 0; slot < kShape.num_blocks * kShape.block_size; ++slot)
      for (uint32_t p = 0; p < 2; ++p)
        for (uint32_t h = 0; h < kShape.kv_heads; ++h)
          for (uint32_t d = 0; d < kShape.head_dim; ++d) {
            const int64_t want = engine_formula(kind, p, slot / kShape.block_size, slot % kShape.block_size, h, d);
            ASSERT_EQ(engine_element(v, p, slot, h, d), want) << "slot " << slot << " plane " << p;
          }
  }
}

struct DtypePair {
  DType chunk, engine;
  bool lossless;  // chunk -> engine -> chunk returns the same bytes
};

constexpr DtypePair kPairs[] = {
    {DType::kF16, DType::kF16, true},         {DType::kBF16, DType::kBF16, true}, {DType::kF32, DType::kF32, true},
    {DType::kFP8E4M3, DType::kFP8E4M3, true}, {DType::kF16, DType::kF32, true},   {DType::kBF16, DType::kF32, true},
    {DType::kF32, DType::kF16, false},        {DType::kF16, DType::kBF16, false}, {DType::kF16, DType::kFP8E4M3, false},
};

ChunkGeometry chunk_geometry(DType t, uint32_t tokens) {
  return ChunkGeometry{kShape.layers, kShape.kv_heads, kShape.head_dim, tokens, t};
}

// Runs `body` for every layout x dtype pair x K permutation (llama.cpp kinds only).
template <class Fn>
void for_each_case(const Fn& body) {
  for (EngineLayoutKind kind : kAllEngineLayouts)
    for (const DtypePair& pair : kPairs)
      for (bool permute : {false, true}) {
        if (permute && kind != EngineLayoutKind::kLlamaCppRows && kind != EngineLayoutKind::kLlamaCppVTrans) continue;
        SCOPED_TRACE(::testing::Message() << engine_layout_name(kind) << " chunk " << static_cast<int>(pair.chunk)
                                          << " engine " << static_cast<int>(pair.engine) << " permute " << permute);
        body(kind, pair, permute);
      }
}

TEST(Layout, ScatterThenGatherReturnsTheSource) {
  uint64_t seed = 100;
  for_each_case([&](EngineLayoutKind kind, const DtypePair& pair, bool permute) {
    if (!pair.lossless) return;
    CounterRng rng(++seed);
    const uint32_t tokens = 4 * 7 + 3;  // partial last block
    const ChunkGeometry g = chunk_geometry(pair.chunk, tokens);
    const std::vector<uint8_t> src = random_chunk(g, seed);
    const std::vector<int64_t> slots = random_slots(rng, tokens, kShape.num_blocks, kShape.block_size, 10);
    PagedShape shape = kShape;
    shape.dtype = pair.engine;
    EngineBuffers eng;
    ASSERT_TRUE(eng.init(kind, shape, permute).ok());
    eng.view.slot_mapping = slots.data();
    ASSERT_TRUE(scatter(src.data(), g, eng.view, Executor::cpu()).ok());
    std::vector<uint8_t> back(src.size(), testing::kSentinel);
    ASSERT_TRUE(gather(eng.view, back.data(), g, Executor::cpu()).ok());
    const size_t row = size_t{g.kv_heads} * g.head_dim * dtype_size(g.dtype);
    for (uint32_t l = 0; l < g.layers; ++l)
      for (uint32_t p = 0; p < 2; ++p)
        for (uint32_t t = 0; t < tokens; ++t) {
          const size_t at = chunk_offset(g, l, p, t, 0, 0) * dtype_size(g.dtype);
          if (slots[t] < 0) {
            ASSERT_EQ(std::vector<uint8_t>(row, testing::kSentinel),
                      std::vector<uint8_t>(back.begin() + at, back.begin() + at + row))
                << "skipped token " << t;
          } else {
            ASSERT_EQ(0, memcmp(src.data() + at, back.data() + at, row)) << "l " << l << " p " << p << " t " << t;
          }
        }
  });
}

TEST(Layout, LaunchersEqualElementBodies) {
  uint64_t seed = 200;
  for_each_case([&](EngineLayoutKind kind, const DtypePair& pair, bool permute) {
    CounterRng rng(++seed);
    const uint32_t tokens = 29;
    const ChunkGeometry g = chunk_geometry(pair.chunk, tokens);
    const std::vector<uint8_t> src = random_chunk(g, seed);
    const std::vector<int64_t> slots = random_slots(rng, tokens, kShape.num_blocks, kShape.block_size, 15);
    PagedShape shape = kShape;
    shape.dtype = pair.engine;
    EngineBuffers fast, ref;
    ASSERT_TRUE(fast.init(kind, shape, permute).ok());
    ASSERT_TRUE(ref.init(kind, shape, permute).ok());
    fast.view.slot_mapping = ref.view.slot_mapping = slots.data();
    fast.view.scale[0] = ref.view.scale[0] = 0.5f;  // fp8 scales; ignored by other dtypes
    fast.view.scale[1] = ref.view.scale[1] = 2.0f;
    ASSERT_TRUE(scatter(src.data(), g, fast.view, Executor::cpu()).ok());
    testing::reference_scatter(src.data(), g, ref.view);
    ASSERT_TRUE(fast == ref);  // also proves nothing outside the mapped rows was written
    std::vector<uint8_t> got(src.size(), 0), want(src.size(), 0);
    ASSERT_TRUE(gather(fast.view, got.data(), g, Executor::cpu()).ok());
    testing::reference_gather(ref.view, want.data(), g);
    ASSERT_EQ(got, want);
  });
}

TEST(Layout, ThreadCountDoesNotChangeTheResult) {
  const ChunkGeometry g{4, 8, 128, 256, DType::kBF16};
  const std::vector<uint8_t> src = random_chunk(g, 5);
  PagedShape shape{4, 8, 128, 80, 16, DType::kF16};
  CounterRng rng(6);
  const std::vector<int64_t> slots = random_slots(rng, g.tokens, shape.num_blocks, shape.block_size, 5);
  EngineBuffers one, many;
  ASSERT_TRUE(one.init(EngineLayoutKind::kVllmFlashHnd, shape, false).ok());
  ASSERT_TRUE(many.init(EngineLayoutKind::kVllmFlashHnd, shape, false).ok());
  one.view.slot_mapping = many.view.slot_mapping = slots.data();
  ASSERT_TRUE(scatter(src.data(), g, one.view, Executor::cpu(1)).ok());
  ASSERT_TRUE(scatter(src.data(), g, many.view, Executor::cpu(0)).ok());
  EXPECT_TRUE(one == many);
}

// Ops of 4 MiB and more write with streaming stores; odd row sizes exercise the unaligned
// heads and tails of those copies.
TEST(Layout, StreamingStoresWriteTheSameBytes) {
  const ChunkGeometry g{2, 4, 130, 2048, DType::kF16};
  ASSERT_GE(chunk_bytes(g), 4u << 20);
  const std::vector<uint8_t> src = random_chunk(g, 13);
  CounterRng rng(14);
  const PagedShape shape{2, 4, 130, 140, 16, DType::kF16};
  const std::vector<int64_t> slots = random_slots(rng, g.tokens, shape.num_blocks, shape.block_size, 5);
  for (EngineLayoutKind kind : {EngineLayoutKind::kVllmFlashNhd, EngineLayoutKind::kFlashinferHnd}) {
    SCOPED_TRACE(engine_layout_name(kind));
    EngineBuffers fast, ref;
    ASSERT_TRUE(fast.init(kind, shape, false).ok());
    ASSERT_TRUE(ref.init(kind, shape, false).ok());
    fast.view.slot_mapping = ref.view.slot_mapping = slots.data();
    ASSERT_TRUE(scatter(src.data(), g, fast.view, Executor::cpu()).ok());
    testing::reference_scatter(src.data(), g, ref.view);
    ASSERT_TRUE(fast == ref);
    std::vector<uint8_t> got(src.size(), 1), want(src.size(), 1);
    ASSERT_TRUE(gather(fast.view, got.data(), g, Executor::cpu()).ok());
    testing::reference_gather(ref.view, want.data(), g);
    ASSERT_EQ(got, want);
  }
}

TEST(Layout, PermutedKFollowsLlamaCppChannelOrder) {
  const ChunkGeometry g = chunk_geometry(DType::kF16, 5);
  const std::vector<uint8_t> src = random_chunk(g, 7);
  EngineBuffers eng;
  ASSERT_TRUE(eng.init(EngineLayoutKind::kLlamaCppVTrans, kShape, true).ok());
  ASSERT_TRUE(scatter(src.data(), g, eng.view, Executor::cpu()).ok());  // identity slots: cell = token
  const auto* chunk = reinterpret_cast<const uint16_t*>(src.data());
  const uint32_t D = g.head_dim, H = g.kv_heads, cells = kShape.num_blocks * kShape.block_size;
  for (uint32_t l = 0; l < g.layers; ++l) {
    const auto* k = reinterpret_cast<const uint16_t*>(eng.k[l].data());
    const auto* v = reinterpret_cast<const uint16_t*>(eng.v[l].data());
    for (uint32_t t = 0; t < g.tokens; ++t)
      for (uint32_t h = 0; h < H; ++h)
        for (uint32_t i = 0; i < D / 2; ++i)
          for (uint32_t c = 0; c < 2; ++c) {
            // llama.cpp K channel 2i + c holds Hugging Face channel c * D/2 + i.
            ASSERT_EQ(k[t * H * D + h * D + 2 * i + c], chunk[chunk_offset(g, l, 0, t, h, c * D / 2 + i)]);
            // V is not permuted; transposed: channel-major with stride = cells.
            const uint32_t d = 2 * i + c;
            ASSERT_EQ(v[(h * D + d) * cells + t], chunk[chunk_offset(g, l, 1, t, h, d)]);
          }
  }
}

kdn_engine_layout nhd_abi(void* const* bases, const PagedShape& s) {
  kdn_engine_layout a{};
  a.struct_size = sizeof a;
  a.engine_dtype = static_cast<uint32_t>(s.dtype);
  a.layer_base = bases;
  const int64_t H = s.kv_heads, D = s.head_dim;
  a.stride_kv = s.num_blocks * s.block_size * H * D;
  a.stride_block = s.block_size * H * D;
  a.stride_offset = H * D;
  a.stride_head = D;
  a.stride_dim = 1;
  a.block_size = s.block_size;
  return a;
}

TEST(Layout, ViewFromAbiEqualsPreset) {
  const ChunkGeometry g = chunk_geometry(DType::kF16, 30);
  const std::vector<uint8_t> src = random_chunk(g, 8);
  CounterRng rng(9);
  const std::vector<int64_t> slots = random_slots(rng, g.tokens, kShape.num_blocks, kShape.block_size, 10);
  EngineBuffers via_abi, via_preset;
  ASSERT_TRUE(via_abi.init(EngineLayoutKind::kVllmFlashNhd, kShape, false).ok());
  ASSERT_TRUE(via_preset.init(EngineLayoutKind::kVllmFlashNhd, kShape, false).ok());
  kdn_engine_layout abi = nhd_abi(via_abi.k_bases.data(), kShape);
  abi.slot_mapping = slots.data();
  EngineView v;
  ViewOptions opt;
  opt.slot_limit = kShape.num_blocks * kShape.block_size;
  ASSERT_TRUE(view_from_abi(abi, g, opt, &v).ok());
  via_preset.view.slot_mapping = slots.data();
  ASSERT_TRUE(scatter(src.data(), g, v, Executor::cpu()).ok());
  ASSERT_TRUE(scatter(src.data(), g, via_preset.view, Executor::cpu()).ok());
  EXPECT_TRUE(via_abi == via_preset);
}

TEST(Layout, ViewFromAbiSplitVEqualsSglangPreset) {
  const ChunkGeometry g = chunk_geometry(DType::kBF16, 17);
  const std::vector<uint8_t> src = random_chunk(g, 10);
  PagedShape shape = kShape;
  shape.dtype = DType::kBF16;
  EngineBuffers via_abi, via_preset;
  ASSERT_TRUE(via_abi.init(EngineLayoutKind::kSglangTokenPool, shape, false).ok());
  ASSERT_TRUE(via_preset.init(EngineLayoutKind::kSglangTokenPool, shape, false).ok());
  kdn_engine_layout a{};
  a.struct_size = sizeof a;
  a.engine_dtype = KDN_DTYPE_BF16;
  a.layer_base = via_abi.k_bases.data();
  a.v_layer_base = via_abi.v_bases.data();
  a.block_size = 1;  // a token pool: slot = loc
  a.stride_block = a.v_stride_block = g.kv_heads * g.head_dim;
  a.stride_head = a.v_stride_head = g.head_dim;
  a.stride_dim = a.v_stride_dim = 1;
  EngineView v;
  ViewOptions opt;
  opt.first_token = 3;  // chunk token t -> engine token 3 + t
  ASSERT_TRUE(view_from_abi(a, g, opt, &v).ok());
  via_preset.view.first_token = 3;
  ASSERT_TRUE(scatter(src.data(), g, v, Executor::cpu()).ok());
  ASSERT_TRUE(scatter(src.data(), g, via_preset.view, Executor::cpu()).ok());
  EXPECT_TRUE(via_abi == via_preset);
}

TEST(Layout, ViewFromAbiRejectsBadLayouts) {
  const ChunkGeometry g = chunk_geometry(DType::kF16, 8);
  std::vector<uint8_t> buf(64);
  void* bases[3] = {buf.data(), buf.data(), buf.data()};
  const kdn_engine_layout good = nhd_abi(bases, kShape);
  EngineView v;
  ASSERT_TRUE(view_from_abi(good, g, {}, &v).ok());
  auto expect_rejected = [&](kdn_engine_layout a, ViewOptions opt = {}) {
    EXPECT_FALSE(view_from_abi(a, g, opt, &v).ok());
  };
  kdn_engine_layout a = good;
  a.struct_size = 8;
  expect_rejected(a);
  a = good, a.engine_dtype = 9, expect_rejected(a);
  a = good, a.layer_base = nullptr, expect_rejected(a);
  a = good, a.stride_dim = 0, expect_rejected(a);
  a = good, a.stride_head = -16, expect_rejected(a);
  a = good, a.block_size = 0, expect_rejected(a);
  a = good, a.stride_kv = 0, expect_rejected(a);  // K and V would alias
  a = good, a.stride_block = int64_t{1} << 62, expect_rejected(a);
  ViewOptions odd_permute;
  odd_permute.permute_k = true;
  EXPECT_FALSE(view_from_abi(good, ChunkGeometry{3, 3, 15, 8, DType::kF16}, odd_permute, &v).ok());
  ViewOptions bad_scale;
  bad_scale.k_scale = 0.0f;
  expect_rejected(good, bad_scale);
  ViewOptions overflow;
  overflow.slot_limit = int64_t{1} << 40;
  a = good, a.stride_block = int64_t{1} << 40, expect_rejected(a, overflow);
}

TEST(Layout, SlotBeyondLimitFailsBeforeWriting) {
  const ChunkGeometry g = chunk_geometry(DType::kF16, 8);
  const std::vector<uint8_t> src = random_chunk(g, 11);
  EngineBuffers eng, untouched;
  ASSERT_TRUE(eng.init(EngineLayoutKind::kVllmFlashNhd, kShape, false).ok());
  ASSERT_TRUE(untouched.init(EngineLayoutKind::kVllmFlashNhd, kShape, false).ok());
  std::vector<int64_t> slots = {0, 1, 2, 3, 4, 5, 6, kShape.num_blocks * kShape.block_size};
  eng.view.slot_mapping = slots.data();
  const Status st = scatter(src.data(), g, eng.view, Executor::cpu());
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_TRUE(eng == untouched);
  std::vector<uint8_t> out(src.size());
  EXPECT_EQ(gather(eng.view, out.data(), g, Executor::cpu()).code(), Code::kInvalidArgument);
}

TEST(Layout, LayerRangeTouchesOnlyThoseLayers) {
  const ChunkGeometry g = chunk_geometry(DType::kF16, 8);
  const std::vector<uint8_t> src = random_chunk(g, 12);
  EngineBuffers eng;
  ASSERT_TRUE(eng.init(EngineLayoutKind::kFlashinferNhd, kShape, false).ok());
  ASSERT_TRUE(scatter(src.data(), g, eng.view, Executor::cpu(), LayerRange{1, 2}).ok());
  const std::vector<uint8_t> blank(eng.k[0].size(), testing::kSentinel);
  EXPECT_EQ(eng.k[0], blank);
  EXPECT_NE(eng.k[1], blank);
  EXPECT_EQ(eng.k[2], blank);
  EXPECT_FALSE(scatter(src.data(), g, eng.view, Executor::cpu(), LayerRange{2, 2}).ok());
  EXPECT_FALSE(scatter(src.data(), g, eng.view, Executor::cpu(), LayerRange{0, 4}).ok());
}

TEST(Layout, GeometryMismatchIsRefused) {
  const ChunkGeometry g{2, 3, 16, 8, DType::kF16};  // the view has 3 layers
  const std::vector<uint8_t> src(chunk_bytes(g));
  EngineBuffers eng;
  ASSERT_TRUE(eng.init(EngineLayoutKind::kVllmFlashNhd, kShape, false).ok());
  EXPECT_EQ(scatter(src.data(), g, eng.view, Executor::cpu()).code(), Code::kModelMismatch);
}

TEST(Layout, GeometryOfARegisteredModel) {
  kdn_model_desc d = preset_desc(*find_model_preset("smollm2-135m"), "");
  d.dtype = KDN_DTYPE_BF16;  // the chunk geometry follows the model's dtype
  Result<ModelInfo> m = ModelInfo::from_desc(d);
  ASSERT_TRUE(m.ok()) << m.status().what();
  const ChunkGeometry g = chunk_geometry_of(*m);
  EXPECT_EQ(g.layers, 30u);
  EXPECT_EQ(g.kv_heads, 3u);
  EXPECT_EQ(g.head_dim, 64u);
  EXPECT_EQ(g.tokens, m->chunk_tokens);
  EXPECT_EQ(g.dtype, DType::kBF16);
  EXPECT_EQ(chunk_bytes(g), m->chunk_bytes);
}

TEST(Layout, CudaExecutorWithoutCudaIsUnsupported) {
  if (cuda_built()) GTEST_SKIP() << "this build has CUDA";
  const ChunkGeometry g = chunk_geometry(DType::kF16, 8);
  const std::vector<uint8_t> src(chunk_bytes(g));
  EngineBuffers eng;
  ASSERT_TRUE(eng.init(EngineLayoutKind::kVllmFlashNhd, kShape, false).ok());
  EXPECT_EQ(scatter(src.data(), g, eng.view, Executor::cuda(nullptr)).code(), Code::kUnsupported);
}

}  // namespace
}  // namespace kdn::kernels
