// The host half of kdn-gpu-engine: cache geometry, block tables, the layout handed to kdnd, and
// the pattern, checked on the CPU by simulating what kdnd does with a layout (gather to
// canonical chunks, scatter into other blocks).
#include <kdn/gpu_engine/paged_kv.h>

#include <kdn/common/model.h>
#include <kdn/common/model_presets.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <set>

namespace kdn::gpu_engine {
namespace {

kdn_model_desc tiny() { return shaped_desc(2, 2, 8, 32, "test/gpu-engine"); }

TEST(PagedKvShape, Llama3BlocksAndChunks) {
  const kdn_model_desc d = preset_desc(*find_model_preset("llama3-8b"), "llama3-8b");
  const PagedKvShape s = shape_for(d, 4096);
  EXPECT_EQ(s.kv_bytes() / s.num_blocks, 2ull << 20);  // 32 layers x K,V x 16 tokens x 8 x 128 x 2 B
  auto info = ModelInfo::from_desc(d);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(s.token_bytes() * 256, info->chunk_bytes);
  EXPECT_EQ(info->chunk_bytes, 32ull << 20);
  EXPECT_EQ(s.kv_bytes(), 8ull << 30);
  EXPECT_EQ(blocks_for_bytes(d, 8ull << 30), 4096u);
  EXPECT_EQ(blocks_for_bytes(d, 1), 1u);
}

TEST(BlockTables, ShuffledBlocksAreDistinctAndSeeded) {
  const auto a = shuffled_blocks(100, 40, 7);
  ASSERT_EQ(a.size(), 40u);
  EXPECT_EQ(std::set<int32_t>(a.begin(), a.end()).size(), 40u);
  EXPECT_TRUE(std::all_of(a.begin(), a.end(), [](int32_t b) { return b >= 0 && b < 100; }));
  EXPECT_EQ(a, shuffled_blocks(100, 40, 7));
  EXPECT_NE(a, shuffled_blocks(100, 40, 8));
  EXPECT_TRUE(shuffled_blocks(3, 4, 1).empty());
}

TEST(BlockTables, RetrieveNeverUsesTheStoredBlockOfAToken) {
  for (uint32_t blocks : {1u, 2u, 3u, 17u, 64u}) {
    for (uint32_t count = 1; count <= blocks; count += std::max(1u, blocks / 5)) {
      for (uint64_t seed = 0; seed < 50; ++seed) {
        const BlockTables t = store_and_retrieve_tables(blocks, count, seed);
        ASSERT_EQ(t.store.size(), count);
        ASSERT_EQ(t.retrieve.size(), count);
        EXPECT_EQ(std::set<int32_t>(t.retrieve.begin(), t.retrieve.end()).size(), count);
        if (blocks < 2) continue;
        for (uint32_t i = 0; i < count; ++i)
          EXPECT_NE(t.store[i], t.retrieve[i]) << blocks << " " << count << " " << seed;
      }
    }
  }
}

TEST(BlockTables, SlotMappingAndOwnersAreInverse) {
  const std::vector<int32_t> table = {5, 2, 7};
  const auto slots = slot_mapping(table, 40, 16);
  EXPECT_EQ(slots[0], 80);
  EXPECT_EQ(slots[17], 33);
  EXPECT_EQ(slots[39], 7 * 16 + 7);
  const auto owners = slot_owners(slots, 8 * 16);
  for (size_t t = 0; t < slots.size(); ++t) EXPECT_EQ(owners[slots[t]], int32_t(t));
  EXPECT_EQ(std::count(owners.begin(), owners.end(), -1), 8 * 16 - 40);
}

TEST(EngineLayout, AddressesMatchTheCacheGeometry) {
  const PagedKvShape s = shape_for(tiny(), 6, 4);
  const uint64_t base = 0x7f0000000000ull;
  EngineLayout layout(s, base, slot_mapping({3, 0, 5}, 12, 4), KDN_DTYPE_F16);
  const kdn_engine_layout& l = *layout.get();
  EXPECT_EQ(l.struct_size, sizeof(kdn_engine_layout));
  EXPECT_EQ(l.block_size, 4);
  EXPECT_EQ(l.v_layer_base, nullptr);
  for (uint32_t layer = 0; layer < s.layers; ++layer)
    for (uint32_t p = 0; p < 2; ++p)
      for (uint64_t t = 0; t < 12; ++t)
        for (uint32_t h = 0; h < s.kv_heads; ++h)
          for (uint32_t d = 0; d < s.head_dim; ++d) {
            const uint64_t addr = reinterpret_cast<uint64_t>(l.layer_base[layer]) + layout_byte_offset(l, p, t, h, d);
            ASSERT_EQ(addr, base + s.element(layer, p, uint64_t(l.slot_mapping[t]), h, d) * kElementBytes);
          }
  // The last byte a layout can reach lies inside the registered range.
  const uint64_t last = reinterpret_cast<uint64_t>(l.layer_base[s.layers - 1]) +
                        layout_byte_offset(l, 1, 11, s.kv_heads - 1, s.head_dim - 1) + kElementBytes;
  EXPECT_LE(last, base + s.kv_bytes());
}

TEST(Pattern, ValuesAreFiniteNormalHalvesAndDependOnEveryCoordinate) {
  uint32_t changed[6] = {};
  for (uint64_t i = 0; i < 20000; ++i) {
    const uint16_t v = kv_pattern(i, uint32_t(i % 7), uint32_t(i & 1), i * 3, uint32_t(i % 5), uint32_t(i % 128));
    const uint32_t exponent = (v >> 10) & 31u;
    ASSERT_GT(exponent, 0u);
    ASSERT_LT(exponent, 31u);
    changed[0] += v != kv_pattern(i + 1, uint32_t(i % 7), uint32_t(i & 1), i * 3, uint32_t(i % 5), uint32_t(i % 128));
    changed[1] += v != kv_pattern(i, uint32_t(i % 7) + 1, uint32_t(i & 1), i * 3, uint32_t(i % 5), uint32_t(i % 128));
    changed[2] += v != kv_pattern(i, uint32_t(i % 7), uint32_t(~i & 1), i * 3, uint32_t(i % 5), uint32_t(i % 128));
    changed[3] += v != kv_pattern(i, uint32_t(i % 7), uint32_t(i & 1), i * 3 + 1, uint32_t(i % 5), uint32_t(i % 128));
    changed[4] += v != kv_pattern(i, uint32_t(i % 7), uint32_t(i & 1), i * 3, uint32_t(i % 5) + 1, uint32_t(i % 128));
    changed[5] += v != kv_pattern(i, uint32_t(i % 7), uint32_t(i & 1), i * 3, uint32_t(i % 5), uint32_t(i % 128) + 1);
    ASSERT_NE(canary(i, 0, 0, i, 0, 0), 0u);
  }
  for (uint32_t c : changed) EXPECT_GT(c, 19900u);
}

// What kdnd does with a layout, on the host: element (layer, plane, token, head, dim) of chunk
// c goes between canonical offset ((layer * 2 + plane) * T + t) * H * D + h * D + d and the
// address the layout names.
void gather(const uint16_t* cache, const kdn_engine_layout& l, const PagedKvShape& s, uint32_t T, uint64_t chunk,
            uint16_t* out) {
  const auto* base = reinterpret_cast<const uint8_t*>(cache);
  for (uint32_t layer = 0; layer < s.layers; ++layer)
    for (uint32_t p = 0; p < 2; ++p)
      for (uint32_t t = 0; t < T; ++t)
        for (uint32_t h = 0; h < s.kv_heads; ++h)
          for (uint32_t d = 0; d < s.head_dim; ++d) {
            const uint64_t at = reinterpret_cast<uint64_t>(l.layer_base[layer]) - reinterpret_cast<uint64_t>(base) +
                                layout_byte_offset(l, p, chunk * T + t, h, d);
            std::memcpy(out++, base + at, kElementBytes);
          }
}

void scatter(uint16_t* cache, const kdn_engine_layout& l, const PagedKvShape& s, uint32_t T, uint64_t chunk,
             const uint16_t* in) {
  auto* base = reinterpret_cast<uint8_t*>(cache);
  for (uint32_t layer = 0; layer < s.layers; ++layer)
    for (uint32_t p = 0; p < 2; ++p)
      for (uint32_t t = 0; t < T; ++t)
        for (uint32_t h = 0; h < s.kv_heads; ++h)
          for (uint32_t d = 0; d < s.head_dim; ++d) {
            const uint64_t at = reinterpret_cast<uint64_t>(l.layer_base[layer]) - reinterpret_cast<uint64_t>(base) +
                                layout_byte_offset(l, p, chunk * T + t, h, d);
            std::memcpy(base + at, in++, kElementBytes);
          }
}

TEST(Pattern, StoreThenRetrieveIntoOtherBlocksVerifies) {
  const kdn_model_desc desc = tiny();
  const uint32_t T = desc.chunk_tokens;
  const uint64_t tokens = 3 * T, seed = 42;
  const PagedKvShape s = shape_for(desc, 40, 4);
  const BlockTables tables = store_and_retrieve_tables(s.num_blocks, uint32_t(tokens / s.block_size), seed);
  std::vector<uint16_t> store_cache(s.kv_bytes() / 2), engine_cache(s.kv_bytes() / 2);
  EngineLayout from(s, reinterpret_cast<uint64_t>(store_cache.data()), slot_mapping(tables.store, tokens, 4),
                    desc.dtype);
  EngineLayout to(s, reinterpret_cast<uint64_t>(engine_cache.data()), slot_mapping(tables.retrieve, tokens, 4),
                  desc.dtype);
  const auto store_owners = slot_owners(from.slots(), s.slots());
  const auto retrieve_owners = slot_owners(to.slots(), s.slots());
  const std::vector<int32_t> none(s.slots(), -1);

  fill_host(store_cache.data(), s, seed, store_owners);
  fill_host(engine_cache.data(), s, seed, none);
  EXPECT_EQ(count_mismatches_host(engine_cache.data(), s, seed, none), 0u);
  const uint64_t elems = s.token_bytes() / 2 * T;
  std::vector<uint16_t> chunk(elems), expected(elems);
  for (uint64_t c = 0; c < tokens / T; ++c) {
    gather(store_cache.data(), *from.get(), s, T, c, chunk.data());
    fill_canonical_chunk(expected.data(), s, T, seed, c);
    ASSERT_EQ(chunk, expected) << "chunk " << c;
    scatter(engine_cache.data(), *to.get(), s, T, c, chunk.data());
  }
  EXPECT_EQ(count_mismatches_host(engine_cache.data(), s, seed, retrieve_owners), 0u);
  // Stored blocks and retrieved blocks differ, so the cache the store read is not a pass.
  EXPECT_GT(count_mismatches_host(store_cache.data(), s, seed, retrieve_owners), 0u);
  // One flipped bit, one missing chunk, another seed: all caught.
  engine_cache[s.element(1, 1, uint64_t(to.slots()[5]), 1, 3)] ^= 0x10;
  EXPECT_EQ(count_mismatches_host(engine_cache.data(), s, seed, retrieve_owners), 1u);
  fill_host(engine_cache.data(), s, seed, none);
  for (uint64_t c = 0; c + 1 < tokens / T; ++c) {
    gather(store_cache.data(), *from.get(), s, T, c, chunk.data());
    scatter(engine_cache.data(), *to.get(), s, T, c, chunk.data());
  }
  // (a canary may equal the pattern by chance: about 1 element in 30,000)
  EXPECT_GE(count_mismatches_host(engine_cache.data(), s, seed, retrieve_owners), s.token_bytes() / 2 * T * 99 / 100);
  EXPECT_GT(count_mismatches_host(engine_cache.data(), s, seed + 1, retrieve_owners), 0u);
}

TEST(Sequence, TokensAreDeterministicAndInVocabulary) {
  const auto a = sequence_tokens(9, 1000);
  EXPECT_EQ(a, sequence_tokens(9, 1000));
  EXPECT_NE(a, sequence_tokens(10, 1000));
  EXPECT_TRUE(std::all_of(a.begin(), a.end(), [](int32_t t) { return t >= 0 && t < 128000; }));
}

TEST(AllocKind, Parses) {
  AllocKind k{};
  EXPECT_TRUE(parse_alloc_kind("ipc", &k));
  EXPECT_EQ(k, AllocKind::kIpc);
  EXPECT_TRUE(parse_alloc_kind("vmm", &k));
  EXPECT_EQ(k, AllocKind::kVmm);
  EXPECT_STREQ(alloc_kind_name(k), "vmm");
  EXPECT_FALSE(parse_alloc_kind("cudaMalloc", &k));
}

}  // namespace
}  // namespace kdn::gpu_engine
