// Segments through libkdn and a real kdnd, from separate processes: a segment stored by one
// engine is looked up chunk by chunk and loaded by another at any position, K re-rotated in the
// same pass as the scatter (byte for byte what the kernels compute); a partial hit loads the
// leading chunks and says so; segments and prefix chunks of two namespaces never mix; every
// bad argument gets a clear error.
#include "kdnd_process.h"

#include <kdn/common/model.h>
#include <kdn/kernels/layout.h>
#include <kdn/kernels/segment.h>

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace kdn::testing {
namespace {

constexpr uint32_t kT = 16;          // tiny_model's chunk tokens
constexpr uint32_t kCells = 512;     // engine buffer rows
constexpr uint32_t kWidth = 2 * 64;  // kv_heads * head_dim

struct Conn {
  kdn_client* c = nullptr;
  kdn_model* m = nullptr;
  Conn(const KdndProcess& d, const kdn_model_desc& desc, const char* ns = nullptr) {
    kdn_connect_opts o = d.opts(ns);
    if (kdn_connect(&o, &c) != KDN_OK) return;
    if (kdn_register_model(c, &desc, &m) != KDN_OK) m = nullptr;
  }
  ~Conn() { kdn_disconnect(c); }
  bool ok() const { return c && m; }
};

// An engine's KV: llama.cpp-style rows, one buffer per layer and plane, f16.
struct EngineKv {
  std::vector<std::vector<uint16_t>> k, v;
  std::vector<void*> kb, vb;
  std::vector<int64_t> slots;
  kdn_engine_layout layout{};

  explicit EngineKv(uint16_t fill) {
    for (int l = 0; l < 2; ++l) {
      k.emplace_back(size_t{kCells} * kWidth, fill);
      v.emplace_back(size_t{kCells} * kWidth, fill);
    }
    layout.struct_size = sizeof layout;
    layout.engine_dtype = KDN_DTYPE_F16;
    layout.stride_block = layout.stride_offset = kWidth;
    layout.stride_head = 64;
    layout.stride_dim = 1;
    layout.block_size = 1;
    layout.v_stride_block = layout.v_stride_offset = kWidth;
    layout.v_stride_head = 64;
    layout.v_stride_dim = 1;
    rebind();
  }
  EngineKv(const EngineKv& o) : k(o.k), v(o.v), slots(o.slots), layout(o.layout) { rebind(); }
  EngineKv& operator=(const EngineKv&) = delete;
  // The layout's pointers into this object's own buffers.
  void rebind() {
    kb.clear();
    vb.clear();
    for (auto& b : k) kb.push_back(b.data());
    for (auto& b : v) vb.push_back(b.data());
    layout.layer_base = kb.data();
    layout.v_layer_base = vb.data();
    layout.slot_mapping = slots.empty() ? nullptr : slots.data();
  }
  // Finite f16 values that differ per layer, plane, cell and channel.
  void fill_pattern(uint32_t seed) {
    for (int l = 0; l < 2; ++l)
      for (size_t i = 0; i < k[l].size(); ++i) {
        k[l][i] = uint16_t(0x3000 + ((i * 7 + l * 131 + seed) % 0x0800));
        v[l][i] = uint16_t(0xB000 + ((i * 13 + l * 17 + seed) % 0x0800));
      }
  }
  // Engine token t is cell first + t.
  void map_from(uint32_t first, uint32_t n) {
    slots.resize(n);
    for (uint32_t t = 0; t < n; ++t) slots[t] = first + t;
    layout.slot_mapping = slots.data();
  }
};

kdn_segment segment_of(const std::vector<int32_t>& tokens, const kdn_key& base, int64_t base_pos) {
  kdn_segment s{};
  s.struct_size = sizeof s;
  s.tokens = tokens.data();
  s.n_tokens = tokens.size();
  s.base_key = base;
  s.base_pos = base_pos;
  return s;
}

kdn_key base_key(const kdn_model_desc& desc) {
  const std::vector<int32_t> sys = doc_tokens(99, 5);
  kdn_key k{};
  EXPECT_EQ(kdn_context_key(&desc, sys.data(), sys.size(), &k), KDN_OK);
  return k;
}

// What a load at `target` must write: the kernels' own gather and scatter, in this process.
EngineKv expected_load(const EngineKv& src, uint32_t src_first, uint32_t n, const kdn_model_desc& desc, int64_t delta,
                       uint32_t dst_first) {
  auto info = ModelInfo::from_desc(desc);
  const kernels::ChunkGeometry geo{2, 2, 64, kT, kernels::DType::kF16};
  std::vector<std::vector<uint8_t>> chunks((n + kT - 1) / kT, std::vector<uint8_t>(info->chunk_bytes));
  std::vector<void*> cp;
  for (auto& c : chunks) cp.push_back(c.data());
  EngineKv s = src;
  s.map_from(src_first, n);
  kernels::EngineView view;
  EXPECT_TRUE(kernels::view_from_abi(s.layout, geo, {}, &view).ok());
  EXPECT_TRUE(kernels::gather_segment(view, cp, n, geo, kernels::Executor::cpu()).ok());
  EngineKv out(0xA5A5);
  out.map_from(dst_first, n);
  kernels::EngineView dst;
  EXPECT_TRUE(kernels::view_from_abi(out.layout, geo, {}, &dst).ok());
  float inv[32];
  kernels::SegmentRope rope;
  EXPECT_TRUE(kernels::segment_rope_from_desc(desc, inv, 32, &rope).ok());
  std::vector<const void*> ccp(cp.begin(), cp.end());
  EXPECT_TRUE(kernels::scatter_segment(ccp, n, geo, dst, rope, delta, kernels::Executor::cpu()).ok());
  return out;
}

TEST(Segments, StoredByOneProcessLoadedAtAnotherPositionByAnother) {
  KdndProcess d;
  const kdn_model_desc desc = tiny_model(kT);
  const std::vector<int32_t> tokens = doc_tokens(7, 2 * kT + 8);  // two whole chunks and a partial one
  const kdn_key base = base_key(desc);
  EngineKv src(0);
  src.fill_pattern(3);
  ASSERT_EQ(in_child([&] {
              Conn k(d, desc);
              if (!k.ok()) return 1;
              EngineKv e = src;  // the writer's buffer: the segment at cells 10 ..
              e.map_from(10, uint32_t(tokens.size()));
              const kdn_segment s = segment_of(tokens, base, 5);
              uint32_t stored = 0;
              if (kdn_segment_store_from(k.c, k.m, &s, &e.layout, &stored) != KDN_OK) return 2;
              if (stored != 3) return 3;
              // Again: every chunk is cached already.
              if (kdn_segment_store_from(k.c, k.m, &s, &e.layout, &stored) != KDN_OK || stored != 0) return 4;
              return 0;
            }),
            0);
  // Another process: the hit map, then a load at position 100 into cells 200 ...
  const EngineKv want = expected_load(src, 10, uint32_t(tokens.size()), desc, 100 - 5, 200);
  ASSERT_EQ(in_child([&] {
              Conn k(d, desc);
              if (!k.ok()) return 1;
              const kdn_segment s = segment_of(tokens, base, 5);
              kdn_segment_hits hits{};
              uint8_t map[3] = {9, 9, 9};
              if (kdn_segment_lookup(k.c, k.m, &s, 1, &hits, map, 3) != KDN_OK) return 2;
              if (hits.chunks != 3 || hits.cached_chunks != 3 || hits.leading_chunks != 3) return 3;
              if (hits.cached_tokens != tokens.size() || hits.map_offset != 0) return 4;
              for (uint8_t t : map)
                if (t != 1) return 5;  // the host tier
              EngineKv dst(0xA5A5);
              dst.map_from(200, uint32_t(tokens.size()));
              const int64_t target = 100;
              uint64_t loaded = 0;
              if (kdn_segment_retrieve_to(k.c, k.m, &s, 1, &target, &dst.layout, &loaded) != KDN_OK) return 6;
              if (loaded != tokens.size()) return 7;
              // Byte for byte the kernels' rotation, and nothing written outside the segment.
              if (dst.k != want.k || dst.v != want.v) return 8;
              kdn_stats st{};
              st.struct_size = sizeof st;
              if (kdn_get_stats(k.c, &st) != KDN_OK || st.active_leases != 0) return 9;  // all released
              return 0;
            }),
            0);
}

TEST(Segments, APartialHitLoadsTheLeadingChunksAndSaysSo) {
  KdndProcess d;
  const kdn_model_desc desc = tiny_model(kT);
  const kdn_key base = base_key(desc);
  Conn k(d, desc);
  ASSERT_TRUE(k.ok());
  EngineKv src(0);
  src.fill_pattern(5);
  // Stored: 40 tokens. Asked: the same first chunk, then other tokens (chunk 1 and 2 miss).
  const std::vector<int32_t> stored_tokens = doc_tokens(1, 40);
  std::vector<int32_t> asked = stored_tokens;
  for (size_t i = kT; i < asked.size(); ++i) asked[i] ^= 1;
  src.map_from(0, 40);
  const kdn_segment s1 = segment_of(stored_tokens, base, 5);
  ASSERT_EQ(kdn_segment_store_from(k.c, k.m, &s1, &src.layout, nullptr), KDN_OK);
  const kdn_segment both[2] = {segment_of(asked, base, 5), s1};
  kdn_segment_hits hits[2]{};
  uint8_t map[6];
  ASSERT_EQ(kdn_segment_lookup(k.c, k.m, both, 2, hits, map, 6), KDN_OK);
  EXPECT_EQ(hits[0].leading_chunks, 1u);
  EXPECT_EQ(hits[0].cached_tokens, kT);
  EXPECT_EQ(hits[1].map_offset, 3u);
  EXPECT_EQ(hits[1].cached_tokens, 40u);
  EXPECT_EQ(map[0], 1);
  EXPECT_EQ(map[1], KDN_SEGMENT_MISS);
  EXPECT_EQ(map[2], KDN_SEGMENT_MISS);
  // One call, two segments: engine tokens 0..39 for the first, 40..79 for the second.
  EngineKv dst(0xA5A5);
  dst.map_from(100, 80);
  const int64_t targets[2] = {30, 70};
  uint64_t loaded[2] = {7, 7};
  EXPECT_EQ(kdn_segment_retrieve_to(k.c, k.m, both, 2, targets, &dst.layout, loaded), KDN_ERR_NOT_FOUND);
  EXPECT_EQ(loaded[0], kT);
  EXPECT_EQ(loaded[1], 40u);
  // Cells of the first segment's missing part (116 .. 139) are untouched.
  for (uint32_t cell = 100 + kT; cell < 140; ++cell) EXPECT_EQ(dst.k[0][size_t{cell} * kWidth], 0xA5A5) << cell;
  EXPECT_NE(dst.k[0][size_t{100} * kWidth], 0xA5A5);
  EXPECT_NE(dst.k[1][size_t{179} * kWidth + 5], 0xA5A5);
}

TEST(Segments, NamespacesNeverMix) {
  KdndProcess d;
  const kdn_model_desc desc = tiny_model(kT);
  const kdn_key base = base_key(desc);
  const std::vector<int32_t> tokens = doc_tokens(3, 2 * kT + 1);
  EngineKv src(0);
  src.fill_pattern(9);
  src.map_from(0, uint32_t(tokens.size()));
  const kdn_segment s = segment_of(tokens, base, 5);
  {
    Conn a(d, desc, "tenant-a");
    ASSERT_TRUE(a.ok());
    ASSERT_EQ(kdn_segment_store_from(a.c, a.m, &s, &src.layout, nullptr), KDN_OK);
    // A prefix document too.
    const std::vector<int32_t> doc = doc_tokens(4, 2 * kT);
    EngineKv pre(0);
    pre.fill_pattern(1);
    ASSERT_EQ(kdn_store_from(a.c, a.m, doc.data(), doc.size(), 0, 2, &pre.layout, nullptr), KDN_OK);
  }
  Conn b(d, desc, "tenant-b");
  ASSERT_TRUE(b.ok());
  kdn_segment_hits hits{};
  uint8_t map[3];
  ASSERT_EQ(kdn_segment_lookup(b.c, b.m, &s, 1, &hits, map, 3), KDN_OK);
  EXPECT_EQ(hits.cached_chunks, 0u);
  EngineKv dst(0xA5A5);
  dst.map_from(0, uint32_t(tokens.size()));
  const int64_t target = 50;
  uint64_t loaded = 9;
  EXPECT_EQ(kdn_segment_retrieve_to(b.c, b.m, &s, 1, &target, &dst.layout, &loaded), KDN_ERR_NOT_FOUND);
  EXPECT_EQ(loaded, 0u);
  EXPECT_EQ(dst.k[0][0], 0xA5A5);
  const std::vector<int32_t> doc = doc_tokens(4, 2 * kT);
  kdn_lookup_result r{};
  ASSERT_EQ(kdn_lookup(b.c, b.m, doc.data(), doc.size(), &r), KDN_OK);
  EXPECT_EQ(r.hit_chunks, 0u);
  // In its own namespace, tenant A still sees both.
  Conn a(d, desc, "tenant-a");
  ASSERT_EQ(kdn_segment_lookup(a.c, a.m, &s, 1, &hits, map, 3), KDN_OK);
  EXPECT_EQ(hits.cached_chunks, 3u);
  ASSERT_EQ(kdn_lookup(a.c, a.m, doc.data(), doc.size(), &r), KDN_OK);
  EXPECT_EQ(r.hit_chunks, 2u);
}

TEST(Segments, TheLibrarySaysWhichAbiMinorBroughtThem) {
  EXPECT_EQ(kdn_abi_version(), KDN_ABI_VERSION);
  EXPECT_EQ(kdn_abi_minor(), KDN_ABI_MINOR);
  EXPECT_GE(kdn_abi_minor(), 2u);  // the segment calls came with minor 2
}

TEST(Segments, BadInputGetsAClearError) {
  KdndProcess d;
  const kdn_model_desc desc = tiny_model(kT);
  Conn k(d, desc);
  ASSERT_TRUE(k.ok());
  const kdn_key base = base_key(desc);
  const std::vector<int32_t> tokens = doc_tokens(2, 20);
  EngineKv e(0);
  e.fill_pattern(2);
  e.map_from(0, 20);
  kdn_segment_hits hits{};
  uint8_t map[8];
  uint64_t loaded = 0;
  const int64_t target = 10;
  const auto bad = [&](kdn_segment s) {
    const int a = kdn_segment_lookup(k.c, k.m, &s, 1, &hits, map, 8);
    const int b = kdn_segment_store_from(k.c, k.m, &s, &e.layout, nullptr);
    const int c = kdn_segment_retrieve_to(k.c, k.m, &s, 1, &target, &e.layout, &loaded);
    size_t n = 0;
    kdn_key keys[4];
    const int d2 = kdn_segment_keys(&desc, &s, keys, 4, &n);
    return a == KDN_ERR_INVALID_ARGUMENT && b == KDN_ERR_INVALID_ARGUMENT && c == KDN_ERR_INVALID_ARGUMENT &&
           d2 == KDN_ERR_INVALID_ARGUMENT;
  };
  kdn_segment s = segment_of(tokens, base, 5);
  s.struct_size = 8;
  EXPECT_TRUE(bad(s)) << "struct_size";
  s = segment_of(tokens, base, 5);
  s.reserved = 1;
  EXPECT_TRUE(bad(s)) << "reserved";
  s = segment_of(tokens, base, 5);
  s.n_tokens = 0;
  EXPECT_TRUE(bad(s)) << "no tokens";
  s = segment_of(tokens, base, 5);
  s.n_tokens = KDN_SEGMENT_MAX_TOKENS + 1;
  EXPECT_TRUE(bad(s)) << "too long";
  s = segment_of(tokens, base, 5);
  s.tokens = nullptr;
  EXPECT_TRUE(bad(s)) << "null tokens";
  s = segment_of(tokens, base, -1);
  EXPECT_TRUE(bad(s)) << "negative base position";
  s = segment_of(tokens, base, KDN_MAX_POSITION + 1);
  EXPECT_TRUE(bad(s)) << "base position overflow";
  // Target positions: negative, or the segment's end past KDN_MAX_POSITION.
  s = segment_of(tokens, base, 5);
  ASSERT_EQ(kdn_segment_store_from(k.c, k.m, &s, &e.layout, nullptr), KDN_OK);
  for (int64_t t : {int64_t{-1}, int64_t{KDN_MAX_POSITION - 19}, int64_t{INT64_MAX}, int64_t{INT64_MIN}})
    EXPECT_EQ(kdn_segment_retrieve_to(k.c, k.m, &s, 1, &t, &e.layout, &loaded), KDN_ERR_INVALID_ARGUMENT) << t;
  const int64_t last = KDN_MAX_POSITION - 20;
  EXPECT_EQ(kdn_segment_retrieve_to(k.c, k.m, &s, 1, &last, &e.layout, &loaded), KDN_OK) << "the largest target";
  // A hit map too small, more chunks than one call takes, null arguments, a bad layout.
  EXPECT_EQ(kdn_segment_lookup(k.c, k.m, &s, 1, &hits, map, 1), KDN_ERR_INVALID_ARGUMENT);
  std::vector<int32_t> huge(size_t{kT} * 65537, 1);
  const kdn_segment big = segment_of(huge, base, 0);
  EXPECT_EQ(kdn_segment_lookup(k.c, k.m, &big, 1, &hits, map, 8), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kdn_segment_lookup(k.c, k.m, nullptr, 1, &hits, map, 8), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kdn_segment_lookup(k.c, k.m, &s, 0, &hits, map, 8), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kdn_segment_retrieve_to(k.c, k.m, &s, 1, nullptr, &e.layout, &loaded), KDN_ERR_INVALID_ARGUMENT);
  kdn_engine_layout broken = e.layout;
  broken.layer_base = nullptr;
  EXPECT_EQ(kdn_segment_retrieve_to(k.c, k.m, &s, 1, &target, &broken, &loaded), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kdn_segment_store_from(k.c, k.m, &s, &broken, nullptr), KDN_ERR_INVALID_ARGUMENT);
  // An unknown segment: not found, nothing loaded.
  const std::vector<int32_t> other = doc_tokens(77, 20);
  const kdn_segment unknown = segment_of(other, base, 5);
  loaded = 5;
  EXPECT_EQ(kdn_segment_retrieve_to(k.c, k.m, &unknown, 1, &target, &e.layout, &loaded), KDN_ERR_NOT_FOUND);
  EXPECT_EQ(loaded, 0u);
  // Keys: ceil(n / T), capped by max_keys; the last names the segment.
  kdn_key keys[4];
  size_t n = 0;
  ASSERT_EQ(kdn_segment_keys(&desc, &s, keys, 4, &n), KDN_OK);
  EXPECT_EQ(n, 2u);
  kdn_key one;
  ASSERT_EQ(kdn_segment_keys(&desc, &s, &one, 1, &n), KDN_OK);
  EXPECT_EQ(n, 1u);
  EXPECT_EQ(one, keys[0]);
}

}  // namespace
}  // namespace kdn::testing
