// The GPU tier's pure parts, on the CPU: layout bounds against hostile clients, registrations
// and their generations, routing, slicing, the metadata ring, the T0 index, and the service's
// behaviour without a device.
#include "gpu/gpu_layout.h"
#include "gpu/gpu_plan.h"
#include "gpu/gpu_registry.h"
#include "gpu/gpu_service.h"
#include "gpu/t0_index.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

namespace kdn::sidecar::gpu {
namespace {

// A vLLM flash-attn NHD cache per layer: (2, NB, BS, H, D) in f16.
struct PagedCache {
  static constexpr int64_t kBlocks = 8, kBlockSize = 4, kHeads = 2, kDim = 4;
  static constexpr uint64_t kLayerBytes = 2 * kBlocks * kBlockSize * kHeads * kDim * 2;
  uint64_t base = 0x7f0000100000ull;
  uint32_t layers = 2;
  std::vector<void*> bases;
  kdn_engine_layout abi{};

  PagedCache() {
    for (uint32_t l = 0; l < layers; ++l) bases.push_back(reinterpret_cast<void*>(uintptr_t(base + l * kLayerBytes)));
    abi.struct_size = sizeof abi;
    abi.engine_dtype = KDN_DTYPE_F16;
    abi.layer_base = bases.data();
    abi.stride_kv = kBlocks * kBlockSize * kHeads * kDim;
    abi.stride_block = kBlockSize * kHeads * kDim;
    abi.stride_offset = kHeads * kDim;
    abi.stride_head = kDim;
    abi.stride_dim = 1;
    abi.block_size = kBlockSize;
  }
  RegisteredRange range() const { return {base, layers * kLayerBytes, 0x200000000ull}; }
};

kernels::ChunkGeometry geo() {
  kernels::ChunkGeometry g;
  g.layers = 2;
  g.kv_heads = 2;
  g.head_dim = 4;
  g.tokens = 4;
  g.dtype = kernels::DType::kF16;
  return g;
}

Result<CheckedLayout> check(const kdn_engine_layout& abi, std::vector<int64_t> slots, uint32_t chunks,
                            const RegisteredRange& range, uint32_t layers = 2) {
  auto wire = encode_gpu_layout(abi, layers, slots);
  if (!wire.ok()) return wire.status();
  auto parsed = decode_gpu_layout(*wire);
  if (!parsed.ok()) return parsed.status();
  return check_and_translate(*parsed, geo(), chunks, range);
}

std::string what(const Result<CheckedLayout>& r) { return r.ok() ? "ok" : r.status().what(); }

TEST(GpuLayout, APagedCacheInsideItsRegistrationPassesAndIsTranslated) {
  PagedCache c;
  auto r = check(c.abi, {0, 1, 2, 31}, 1, c.range());
  ASSERT_TRUE(r.ok()) << what(r);
  EXPECT_EQ(r->max_slot, 31);
  EXPECT_EQ(r->view.slot_limit, 32);
  ASSERT_EQ(r->k_bases.size(), 2u);
  EXPECT_EQ(uintptr_t(r->k_bases[0]), 0x200000000ull);
  EXPECT_EQ(uintptr_t(r->k_bases[1]), 0x200000000ull + PagedCache::kLayerBytes);
  EXPECT_EQ(r->view.layer_base[0], r->k_bases.data());
  EXPECT_EQ(r->view.plane_offset[1], c.abi.stride_kv);
}

TEST(GpuLayout, SlotsPastTheRegistrationAreRefused) {
  PagedCache c;
  auto r = check(c.abi, {0, 1, 2, 32}, 1, c.range());  // block 8 of the last layer's V: past the end
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_NE(what(r).find("outside the registered range"), std::string::npos) << what(r);
  // Slots < 0 are skipped, never written: a mapping of only those reaches nothing.
  EXPECT_TRUE(check(c.abi, {-1, -1, -1, -1}, 1, c.range()).ok());
}

TEST(GpuLayout, BasesAndStridesLeavingTheRangeAreRefusedByField) {
  PagedCache c;
  RegisteredRange small = c.range();
  small.bytes -= 2;  // the last element of the last layer's V plane is outside
  EXPECT_NE(what(check(c.abi, {31, 0, 0, 0}, 1, small)).find("stride_kv"), std::string::npos);
  c.bases[0] = reinterpret_cast<void*>(uintptr_t(c.base - 2));  // one element below
  EXPECT_NE(what(check(c.abi, {0, 0, 0, 0}, 1, c.range())).find("layer_base"), std::string::npos);
  PagedCache d;
  d.abi.stride_block *= 2;  // blocks twice as far apart: the upper half leaves the range
  EXPECT_FALSE(check(d.abi, {31, 0, 0, 0}, 1, d.range()).ok());
  EXPECT_TRUE(check(d.abi, {15, 0, 0, 0}, 1, d.range()).ok()) << "blocks 0..3 still fit";
  PagedCache e;
  e.abi.stride_block = int64_t(1) << 60;  // arithmetic that would overflow 64 bits
  EXPECT_FALSE(check(e.abi, {31, 0, 0, 0}, 1, e.range()).ok());
}

TEST(GpuLayout, SplitVBasesAreCheckedOnTheirOwn) {
  PagedCache c;
  std::vector<void*> v = {reinterpret_cast<void*>(uintptr_t(c.base + 1024 * 1024)), c.bases[1]};
  c.abi.v_layer_base = v.data();
  c.abi.v_stride_block = c.abi.stride_block;
  c.abi.v_stride_offset = c.abi.stride_offset;
  c.abi.v_stride_head = c.abi.stride_head;
  c.abi.v_stride_dim = 1;
  EXPECT_NE(what(check(c.abi, {0, 1, 2, 3}, 1, c.range())).find("v_layer_base"), std::string::npos);
  v[0] = c.bases[0];
  EXPECT_TRUE(check(c.abi, {0, 1, 2, 3}, 1, c.range()).ok());
}

TEST(GpuLayout, ShapeMismatchesAreRefused) {
  PagedCache c;
  EXPECT_FALSE(check(c.abi, {0, 1, 2}, 1, c.range()).ok()) << "slots must cover the chunk";
  EXPECT_FALSE(check(c.abi, {0, 1, 2, 3}, 2, c.range()).ok()) << "two chunks need 8 slots";
  EXPECT_TRUE(check(c.abi, {0, 1, 2, 3, 4, 5, 6, 7}, 2, c.range()).ok());
  EXPECT_FALSE(check(c.abi, {0, 1, 2, 3}, 1, c.range(), 1).ok()) << "layers differ from the model's";
  c.abi.block_size = 0;
  EXPECT_FALSE(check(c.abi, {0, 1, 2, 3}, 1, c.range()).ok());
  c.abi.block_size = 4;
  c.abi.engine_dtype = 99;
  EXPECT_FALSE(check(c.abi, {0, 1, 2, 3}, 1, c.range()).ok());
}

TEST(GpuLayout, MalformedBlobsAreRefused) {
  PagedCache c;
  std::vector<int64_t> slots = {0, 1, 2, 3};
  auto wire = encode_gpu_layout(c.abi, 2, slots);
  ASSERT_TRUE(wire.ok());
  EXPECT_TRUE(decode_gpu_layout(*wire).ok());
  for (size_t cut : {size_t(0), size_t(10), sizeof(ipc::GpuLayoutRecord), wire->size() - 1}) {
    EXPECT_FALSE(decode_gpu_layout(std::span(wire->data(), cut)).ok()) << cut;
  }
  auto bad = *wire;
  bad[4] = std::byte{0x80};  // unknown flag
  EXPECT_FALSE(decode_gpu_layout(bad).ok());
  bad = *wire;
  const uint32_t huge = 0xFFFFFFFFu;
  std::memcpy(bad.data() + 12, &huge, 4);  // tokens: the length no longer matches
  EXPECT_FALSE(decode_gpu_layout(bad).ok());
}

// Whatever a client sends, a layout that passes reaches only bytes inside the registration:
// every element the kernels could write is enumerated and checked.
TEST(GpuLayout, RandomHostileLayoutsNeverReachOutside) {
  std::mt19937_64 rng(7);
  const kernels::ChunkGeometry g = geo();
  const RegisteredRange range{0x100000, 64 * 1024, 0x900000};
  uint32_t passed = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    auto pick = [&](int64_t lo, int64_t hi) { return lo + int64_t(rng() % uint64_t(hi - lo + 1)); };
    std::vector<void*> bases(2), vbases(2);
    for (auto& b : bases) b = reinterpret_cast<void*>(uintptr_t(range.engine_base + pick(-4096, 70 * 1024)));
    for (auto& b : vbases) b = reinterpret_cast<void*>(uintptr_t(range.engine_base + pick(-4096, 70 * 1024)));
    kdn_engine_layout abi{};
    abi.struct_size = sizeof abi;
    abi.engine_dtype = KDN_DTYPE_F16;
    abi.layer_base = bases.data();
    const bool split = rng() % 2;
    if (split) abi.v_layer_base = vbases.data();
    abi.stride_kv = pick(-512, 4096);
    abi.stride_block = pick(-512, 2048);
    abi.stride_offset = pick(-64, 256);
    abi.stride_head = pick(-64, 64);
    abi.stride_dim = pick(-2, 4);
    abi.block_size = pick(0, 16);
    abi.v_stride_block = pick(-512, 2048);
    abi.v_stride_offset = pick(-64, 256);
    abi.v_stride_head = pick(-64, 64);
    abi.v_stride_dim = pick(-2, 4);
    std::vector<int64_t> slots(4);
    for (auto& s : slots) s = pick(-2, 64);
    auto r = check(abi, slots, 1, range);
    if (!r.ok()) continue;
    ++passed;
    const kernels::EngineView& v = r->view;
    for (uint32_t plane = 0; plane < 2; ++plane)
      for (uint32_t l = 0; l < 2; ++l)
        for (int64_t slot : slots) {
          if (!kernels::slot_in_bounds(v, slot)) continue;
          for (uint32_t h = 0; h < g.kv_heads; ++h)
            for (uint32_t d = 0; d < g.head_dim; ++d) {
              const int64_t el = kernels::engine_row_offset(v, plane, slot, h) +
                                 int64_t(kernels::engine_channel(v, plane, d)) * v.stride_dim[plane];
              const uint64_t addr = uint64_t(uintptr_t(v.layer_base[plane][l])) + uint64_t(el * 2);
              ASSERT_GE(addr, range.mapping_base) << iter;
              ASSERT_LE(addr + 2, range.mapping_base + range.bytes) << iter;
            }
        }
  }
  EXPECT_GT(passed, 20u) << "the generator should produce some valid layouts";
}

// ---- registrations ---------------------------------------------------------------------------------

struct Closed {
  std::vector<uint32_t> generations;
};

TEST(GpuRegistry, GenerationsRefuseStaleNames) {
  Closed closed;
  GpuRegistry reg(4, [&](Registration& r) { closed.generations.push_back(r.generation); });
  auto a = reg.add(1, Registration{});
  ASSERT_TRUE(a.ok());
  const uint32_t id = (*a)->id, gen = (*a)->generation;
  EXPECT_TRUE(reg.find(1, id, gen).ok());
  EXPECT_EQ(reg.find(1, id, gen + 1).status().code(), Code::kNotFound);
  EXPECT_EQ(reg.find(2, id, gen).status().code(), Code::kNotFound) << "another session's";
  ASSERT_TRUE(reg.unregister(1, id, gen).ok());
  EXPECT_EQ(closed.generations, std::vector<uint32_t>{gen});
  auto b = reg.add(1, Registration{});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)->id, id) << "ids are reused";
  EXPECT_NE((*b)->generation, gen) << "generations are not";
  EXPECT_EQ(reg.find(1, id, gen).status().code(), Code::kNotFound) << "the old name is stale";
  EXPECT_EQ(reg.unregister(1, id, gen).code(), Code::kNotFound);
}

TEST(GpuRegistry, LimitPerSession) {
  GpuRegistry reg(2, [](Registration&) {});
  EXPECT_TRUE(reg.add(1, Registration{}).ok());
  EXPECT_TRUE(reg.add(1, Registration{}).ok());
  EXPECT_EQ(reg.add(1, Registration{}).status().code(), Code::kLimit);
  EXPECT_TRUE(reg.add(2, Registration{}).ok()) << "per session";
  EXPECT_EQ(reg.live(), 3u);
}

TEST(GpuRegistry, ClosesOnlyAfterCopiesInFlight) {
  Closed closed;
  GpuRegistry reg(4, [&](Registration& r) { closed.generations.push_back(r.generation); });
  Registration* r = *reg.add(1, Registration{});
  const uint32_t gen = r->generation;
  reg.begin_copy(r);
  reg.begin_copy(r);
  ASSERT_TRUE(reg.unregister(1, r->id, gen).ok());
  EXPECT_TRUE(closed.generations.empty()) << "copies still read it";
  EXPECT_EQ(reg.find(1, 1, gen).status().code(), Code::kNotFound) << "but no request may name it";
  EXPECT_EQ(reg.retired_open(), 1u);
  reg.end_copy(r);
  EXPECT_TRUE(closed.generations.empty());
  reg.end_copy(r);
  EXPECT_EQ(closed.generations, std::vector<uint32_t>{gen});
  EXPECT_EQ(reg.retired_open(), 0u);
}

TEST(GpuRegistry, ASessionEndingClosesItsRegistrations) {
  Closed closed;
  GpuRegistry reg(4, [&](Registration& r) { closed.generations.push_back(r.generation); });
  Registration* a = *reg.add(7, Registration{});
  Registration* b = *reg.add(7, Registration{});
  reg.begin_copy(b);
  const uint32_t ga = a->generation, gb = b->generation;
  reg.drop_session(7);
  EXPECT_EQ(closed.generations, std::vector<uint32_t>{ga}) << "idle: closed at once";
  EXPECT_EQ(reg.live(), 0u);
  reg.end_copy(b);
  EXPECT_EQ(closed.generations, (std::vector<uint32_t>{ga, gb}));
}

// ---- routing, slicing, the ring --------------------------------------------------------------------

TEST(GpuPlan, Routing) {
  EXPECT_EQ(route({0, 0, false, false}), Route::kT0Local);
  EXPECT_EQ(route({1, 0, true, true}), Route::kT0Peer);
  EXPECT_EQ(route({1, 0, false, true}), Route::kHostToT0) << "no peer access: through T1, promoted here";
  EXPECT_EQ(route({1, 0, false, false}), Route::kHostToStage);
  EXPECT_EQ(route({-1, 0, false, true}), Route::kHostToT0);
  EXPECT_EQ(route({-1, 2, false, false}), Route::kHostToStage);
  EXPECT_STREQ(route_name(Route::kT0Peer), "t0_peer");
}

TEST(GpuPlan, SlicesCoverEachCopyExactly) {
  std::vector<Copy> copies = {{1000, 5000, 10}, {20000, 90000, 25}, {0, 0, 0}, {7, 8, 8}};
  auto s = slice_copies(copies, 8);
  std::vector<Copy> want = {{1000, 5000, 8},   {1008, 5008, 2},   {20000, 90000, 8}, {20008, 90008, 8},
                            {20016, 90016, 8}, {20024, 90024, 1}, {0, 0, 0},         {7, 8, 8}};
  ASSERT_EQ(s.size(), want.size());
  for (size_t i = 0; i < s.size(); ++i) {
    EXPECT_EQ(s[i].dst, want[i].dst) << i;
    EXPECT_EQ(s[i].src, want[i].src) << i;
    EXPECT_EQ(s[i].bytes, want[i].bytes) << i;
  }
  EXPECT_EQ(slice_copies(copies, 0).size(), copies.size());
  std::mt19937_64 rng(3);
  for (int i = 0; i < 200; ++i) {
    const Copy c{rng() % 1000000, rng() % 1000000, rng() % 100000};
    const uint64_t slice = 1 + rng() % 9000;
    uint64_t at = 0;
    for (const Copy& p : slice_copies(std::span(&c, 1), slice)) {
      EXPECT_LE(p.bytes, slice);
      EXPECT_EQ(p.dst, c.dst + at);
      EXPECT_EQ(p.src, c.src + at);
      at += p.bytes;
    }
    EXPECT_EQ(at, c.bytes);
  }
}

TEST(GpuPlan, FifoRingHandsOutDisjointRangesAndWraps) {
  FifoRing ring(1024, 64);
  auto a = ring.alloc(300), b = ring.alloc(300), c = ring.alloc(300);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(*a, 0u);
  EXPECT_EQ(*b, 320u);
  EXPECT_EQ(*c, 640u);
  EXPECT_FALSE(ring.alloc(100)) << "64 bytes left";
  ring.release_oldest();     // a
  auto d = ring.alloc(300);  // does not fit at 960: wraps to 0
  ASSERT_TRUE(d);
  EXPECT_EQ(*d, 0u);
  EXPECT_FALSE(ring.alloc(64)) << "b still holds [320, 640)";
  ring.release_oldest();  // b
  ring.release_oldest();  // c
  auto e = ring.alloc(600);
  ASSERT_TRUE(e);
  EXPECT_EQ(*e, 320u);
  ring.undo_newest();
  EXPECT_EQ(ring.held(), 1u);
  ring.release_oldest();
  EXPECT_EQ(ring.used(), 0u);
  EXPECT_FALSE(ring.alloc(2048));
}

// ---- T0 ---------------------------------------------------------------------------------------------

T0Key key(uint64_t n, uint64_t gen = 1) { return T0Key{1, kdn_key{n, n * 31}, gen}; }

TEST(T0Index, InsertPublishFindEvict) {
  T0Index t0(4 * 4096, 4096);  // four one-page slots
  ASSERT_EQ(t0.capacity(), 4u * 4096);
  for (uint64_t i = 0; i < 4; ++i) {
    auto off = t0.insert(key(i), 4096);
    ASSERT_TRUE(off) << i;
    EXPECT_FALSE(t0.find(key(i))) << "not findable before its copy was queued";
    t0.publish(key(i));
  }
  EXPECT_EQ(t0.resident_chunks(), 4u);
  EXPECT_FALSE(t0.insert(key(2), 4096)) << "present";
  EXPECT_TRUE(t0.find(key(0)));  // 0 is now the most recent; 1 the least
  t0.pin(key(1));
  ASSERT_TRUE(t0.insert(key(9), 4096));  // evicts 2 (1 is pinned)
  EXPECT_FALSE(t0.find(key(2)));
  EXPECT_TRUE(t0.find(key(1)));
  EXPECT_EQ(t0.counters().evicted, 1u);
  EXPECT_FALSE(t0.find(key(1, 2))) << "another generation of the chunk is another copy";
  t0.unpin(key(1));
  EXPECT_TRUE(t0.erase(key(1)));
  EXPECT_FALSE(t0.erase(key(1)));
}

TEST(T0Index, PinnedAndUnpublishedSlotsAreNeverEvicted) {
  T0Index t0(2 * 4096, 4096);
  ASSERT_TRUE(t0.insert(key(1), 4096));  // in flight: unpublished
  ASSERT_TRUE(t0.insert(key(2), 4096));
  t0.publish(key(2));
  t0.pin(key(2));
  EXPECT_FALSE(t0.insert(key(3), 4096)) << "nothing evictable";
  t0.unpin(key(2));
  EXPECT_TRUE(t0.insert(key(3), 4096));
  EXPECT_FALSE(t0.insert(key(4), 1 << 20)) << "larger than T0";
}

// ---- the service without a device -----------------------------------------------------------------

TEST(GpuService, WithoutADevice) {
  if (available()) GTEST_SKIP() << "a GPU is present";
  GpuTierConfig cfg;
  auto s = GpuService::create(cfg);
  ASSERT_TRUE(s.ok());
  EXPECT_FALSE((*s)->enabled());
  EXPECT_NE((*s)->off_reason().find("no CUDA device"), std::string::npos) << (*s)->off_reason();
  EXPECT_EQ((*s)->wake_fd(), -1);
  cfg.enable = "on";
  auto on = GpuService::create(cfg);
  ASSERT_FALSE(on.ok());
  EXPECT_EQ(on.status().code(), Code::kUnavailable);
  EXPECT_NE(std::string(on.status().what()).find("tier.gpu.enable = on"), std::string::npos);
  cfg.enable = "off";
  auto off = GpuService::create(cfg);
  ASSERT_TRUE(off.ok());
  EXPECT_EQ((*off)->off_reason(), "tier.gpu.enable = off");
}

}  // namespace
}  // namespace kdn::sidecar::gpu
