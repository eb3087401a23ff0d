#include "paged_kv.h"

#include <kdn/kdn.h>

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <set>
#include <vector>

namespace kdn::python {
namespace {

// A small cache: 3 layers, 2 heads, head_dim 16, 32-token blocks, 64-token chunks, 8 blocks.
PagedGeometry small(BlockLayout layout, uint32_t dtype = KDN_DTYPE_BF16) {
  PagedGeometry g;
  g.layers = 3;
  g.kv_heads = 2;
  g.head_dim = 16;
  g.block_tokens = 32;
  g.chunk_tokens = 64;
  g.dtype = dtype;
  g.elem_bytes = dtype == KDN_DTYPE_F32 ? 4 : 2;
  g.num_blocks = 8;
  g.stride_head = 2 * g.block_tokens * g.head_dim;
  g.stride_block = g.kv_heads * g.stride_head;
  g.layout = layout;
  return g;
}

struct Cache {
  explicit Cache(const PagedGeometry& g, uint32_t threads = 0)
      : g(g), bytes(g.num_blocks * g.stride_block * g.elem_bytes), mem(g.layers, std::vector<uint8_t>(bytes, 0xAB)) {
    std::vector<uint8_t*> bases;
    for (auto& m : mem) bases.push_back(m.data());
    kv = std::move(*PagedKV::create(g, bases, threads));
  }
  PagedGeometry g;
  size_t bytes;
  std::vector<std::vector<uint8_t>> mem;
  std::unique_ptr<PagedKV> kv;
};

// A chunk of finite random values (bf16/f16 with exponents below all-ones; f32 likewise).
std::vector<uint8_t> random_chunk(const PagedKV& kv, uint32_t seed) {
  std::mt19937 rng(seed);
  const PagedGeometry& g = kv.geometry();
  std::vector<uint8_t> c(kv.chunk_bytes());
  if (g.elem_bytes == 2) {
    auto* p = reinterpret_cast<uint16_t*>(c.data());
    for (size_t i = 0; i < c.size() / 2; ++i) p[i] = uint16_t(rng() & 0x3FFF);
  } else {
    auto* p = reinterpret_cast<uint32_t*>(c.data());
    for (size_t i = 0; i < c.size() / 4; ++i) p[i] = rng() & 0x3FFFFFFF;
  }
  return c;
}

// Element (layer, plane, token, head, d) of a canonical chunk, as raw bits.
uint32_t chunk_elem(const PagedGeometry& g, const std::vector<uint8_t>& c, uint32_t l, uint32_t p, uint32_t t,
                    uint32_t h, uint32_t d) {
  const size_t i = ((size_t(l) * 2 + p) * g.chunk_tokens + t) * g.kv_heads * g.head_dim + size_t(h) * g.head_dim + d;
  uint32_t v = 0;
  std::memcpy(&v, c.data() + i * g.elem_bytes, g.elem_bytes);
  return v;
}

uint32_t cache_elem(const Cache& k, uint32_t l, int64_t block, uint32_t h, uint64_t off) {
  const size_t i = size_t(block * k.g.stride_block + h * k.g.stride_head + off);
  uint32_t v = 0;
  std::memcpy(&v, k.mem[l].data() + i * k.g.elem_bytes, k.g.elem_bytes);
  return v;
}

TEST(BlockElement, IsAPermutationOfTheRegion) {
  for (BlockLayout layout : {BlockLayout::kColumnsRows, BlockLayout::kAmx}) {
    const uint32_t B = 32, D = 64;
    std::set<uint64_t> seen;
    for (uint32_t p = 0; p < 2; ++p)
      for (uint32_t t = 0; t < B; ++t)
        for (uint32_t d = 0; d < D; ++d) {
          const uint64_t e = block_element(layout, p, t, d, B, D);
          ASSERT_LT(e, 2ull * B * D);
          ASSERT_TRUE(seen.insert(e).second);
        }
  }
}

TEST(BlockElement, ColumnsRowsIsKColumnMajorVRowMajor) {
  EXPECT_EQ(block_element(BlockLayout::kColumnsRows, 0, 5, 3, 128, 64), 3u * 128 + 5);
  EXPECT_EQ(block_element(BlockLayout::kColumnsRows, 1, 5, 3, 128, 64), 128u * 64 + 5 * 64 + 3);
}

TEST(BlockElement, AmxPairsChannelsOfKAndTokensOfV) {
  // K: token 17 is token 1 of the second 16-token group; channels 6 and 7 share a word.
  EXPECT_EQ(block_element(BlockLayout::kAmx, 0, 17, 6, 128, 64), 1u * 16 * 64 + 3 * 32 + 1 * 2 + 0);
  EXPECT_EQ(block_element(BlockLayout::kAmx, 0, 17, 7, 128, 64), 1u * 16 * 64 + 3 * 32 + 1 * 2 + 1);
  // V: tokens 10 and 11 share a word; channel 20 is channel 4 of the second 16-channel group.
  EXPECT_EQ(block_element(BlockLayout::kAmx, 1, 10, 20, 128, 64), 128u * 64 + 16 * 128 + 5 * 32 + 4 * 2 + 0);
  EXPECT_EQ(block_element(BlockLayout::kAmx, 1, 11, 20, 128, 64), 128u * 64 + 16 * 128 + 5 * 32 + 4 * 2 + 1);
}

TEST(BlockLayoutName, KnowsTheVllmIsaNames) {
  BlockLayout l;
  EXPECT_TRUE(block_layout_from_isa("vec", &l));
  EXPECT_EQ(l, BlockLayout::kColumnsRows);
  EXPECT_TRUE(block_layout_from_isa("vec16", &l));
  EXPECT_TRUE(block_layout_from_isa("amx", &l));
  EXPECT_EQ(l, BlockLayout::kAmx);
  EXPECT_FALSE(block_layout_from_isa("neon", &l));
  EXPECT_FALSE(block_layout_from_isa(nullptr, &l));
}

class PagedCopy : public ::testing::TestWithParam<std::tuple<BlockLayout, uint32_t, uint32_t>> {};

// Every element lands where block_element says, and gather gives the chunk back.
TEST_P(PagedCopy, ScatterPlacesEveryElementAndGatherReturnsIt) {
  const auto [layout, dtype, threads] = GetParam();
  if (layout == BlockLayout::kAmx && dtype == KDN_DTYPE_F32) GTEST_SKIP() << "AMX holds 2-byte types only";
  Cache k(small(layout, dtype), threads);
  const auto c0 = random_chunk(*k.kv, 1), c1 = random_chunk(*k.kv, 2);
  const std::vector<int64_t> b0 = {5, 2}, b1 = {7, 0};
  const ChunkCopy copies[] = {{c0.data(), b0}, {c1.data(), b1}};
  uint8_t ok[2] = {0, 0};
  ASSERT_TRUE(k.kv->scatter(copies, ok).ok());
  EXPECT_EQ(ok[0], 1);
  EXPECT_EQ(ok[1], 1);
  const PagedGeometry& g = k.g;
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t p = 0; p < 2; ++p)
      for (uint32_t t = 0; t < g.chunk_tokens; ++t)
        for (uint32_t h = 0; h < g.kv_heads; ++h)
          for (uint32_t d = 0; d < g.head_dim; ++d) {
            const uint64_t off = block_element(layout, p, t % g.block_tokens, d, g.block_tokens, g.head_dim);
            ASSERT_EQ(cache_elem(k, l, b1[t / g.block_tokens], h, off), chunk_elem(g, c1, l, p, t, h, d));
          }
  std::vector<uint8_t> back0(k.kv->chunk_bytes()), back1(k.kv->chunk_bytes());
  const std::span<const int64_t> blocks[] = {b0, b1};
  uint8_t* outs[] = {back0.data(), back1.data()};
  ASSERT_TRUE(k.kv->gather(blocks, outs).ok());
  EXPECT_EQ(back0, c0);
  EXPECT_EQ(back1, c1);
}

INSTANTIATE_TEST_SUITE_P(Layouts, PagedCopy,
                         ::testing::Combine(::testing::Values(BlockLayout::kColumnsRows, BlockLayout::kAmx),
                                            ::testing::Values(uint32_t(KDN_DTYPE_BF16), uint32_t(KDN_DTYPE_F16),
                                                              uint32_t(KDN_DTYPE_F32)),
                                            ::testing::Values(0u, 3u)));

TEST(PagedKV, NegativeBlocksAreSkipped) {
  Cache k(small(BlockLayout::kColumnsRows));
  const auto c = random_chunk(*k.kv, 3);
  const std::vector<int64_t> b = {-1, 4};
  const ChunkCopy copies[] = {{c.data(), b}};
  uint8_t ok[1];
  ASSERT_TRUE(k.kv->scatter(copies, ok).ok());
  for (uint32_t l = 0; l < k.g.layers; ++l)
    for (size_t i = 0; i < k.bytes; ++i) {
      if (i / (k.g.stride_block * 2) == 4) continue;  // block 4 was written
      ASSERT_EQ(k.mem[l][i], 0xAB) << "layer " << l << " byte " << i;
    }
}

TEST(PagedKV, NonFiniteChunkIsReportedAndItsBlocksZeroed) {
  for (uint32_t dtype : {uint32_t(KDN_DTYPE_BF16), uint32_t(KDN_DTYPE_F16), uint32_t(KDN_DTYPE_F32)}) {
    for (uint32_t plane : {0u, 1u}) {
      Cache k(small(BlockLayout::kColumnsRows, dtype), 2);
      auto good = random_chunk(*k.kv, 4), bad = random_chunk(*k.kv, 5);
      // One Inf in layer 2, token 40, head 1, channel 9 of the chosen plane.
      const size_t i = ((size_t(2) * 2 + plane) * 64 + 40) * 2 * 16 + 16 + 9;
      if (dtype == KDN_DTYPE_F32) {
        const uint32_t inf = 0x7F800000u;
        std::memcpy(bad.data() + i * 4, &inf, 4);
      } else {
        const uint16_t inf = dtype == KDN_DTYPE_BF16 ? 0x7F80 : 0x7C00;
        std::memcpy(bad.data() + i * 2, &inf, 2);
      }
      const std::vector<int64_t> b0 = {0, 1}, b1 = {2, 3};
      const ChunkCopy copies[] = {{good.data(), b0}, {bad.data(), b1}};
      uint8_t ok[2];
      ASSERT_TRUE(k.kv->scatter(copies, ok).ok());
      EXPECT_EQ(ok[0], 1);
      EXPECT_EQ(ok[1], 0);
      const size_t block_bytes = k.g.stride_block * k.g.elem_bytes;
      for (uint32_t l = 0; l < k.g.layers; ++l)
        for (size_t j = 2 * block_bytes; j < 4 * block_bytes; ++j) ASSERT_EQ(k.mem[l][j], 0) << "dtype " << dtype;
      std::vector<uint8_t> back(k.kv->chunk_bytes());
      const std::span<const int64_t> blocks[] = {b0};
      uint8_t* outs[] = {back.data()};
      ASSERT_TRUE(k.kv->gather(blocks, outs).ok());
      EXPECT_EQ(back, good);
    }
  }
}

TEST(PagedKV, BlockBeyondTheCacheIsRefusedBeforeAnyWrite) {
  Cache k(small(BlockLayout::kColumnsRows));
  const auto c = random_chunk(*k.kv, 6);
  const std::vector<int64_t> good = {0, 1}, bad = {2, 8};
  const ChunkCopy copies[] = {{c.data(), good}, {c.data(), bad}};
  uint8_t ok[2];
  EXPECT_EQ(k.kv->scatter(copies, ok).code(), Code::kInvalidArgument);
  for (const auto& m : k.mem)
    for (uint8_t b : m) ASSERT_EQ(b, 0xAB);
  const std::vector<int64_t> short_list = {0};
  const ChunkCopy one[] = {{c.data(), short_list}};
  EXPECT_EQ(k.kv->scatter(one, std::span<uint8_t>(ok, 1)).code(), Code::kInvalidArgument);
}

TEST(PagedKV, CreateRefusesBadGeometry) {
  std::vector<uint8_t> mem(1 << 20);
  std::vector<uint8_t*> bases(3, mem.data());
  PagedGeometry g = small(BlockLayout::kColumnsRows);
  g.chunk_tokens = 48;  // not a multiple of the block
  EXPECT_FALSE(PagedKV::create(g, bases, 0).ok());
  g = small(BlockLayout::kColumnsRows);
  g.stride_head = 10;  // smaller than a region
  EXPECT_FALSE(PagedKV::create(g, bases, 0).ok());
  g = small(BlockLayout::kAmx, KDN_DTYPE_F32);
  EXPECT_EQ(PagedKV::create(g, bases, 0).status().code(), Code::kUnsupported);
  g = small(BlockLayout::kColumnsRows);
  EXPECT_FALSE(PagedKV::create(g, {mem.data(), nullptr, mem.data()}, 0).ok());
  EXPECT_FALSE(PagedKV::create(g, {mem.data()}, 0).ok());
}

}  // namespace
}  // namespace kdn::python
