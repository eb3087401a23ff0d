// Shared helpers of the kernels tests: engine buffers for every preset layout, random block
// tables, and serial "reference launchers" that run the element bodies over the whole index space.
#pragma once

#include <kdn/kernels/copy.h>
#include <kdn/kernels/presets.h>
#include <kdn/kernels/synthetic.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

namespace kdn::kernels::testing {

constexpr uint8_t kSentinel = 0xA5;

// Per-layer engine buffers of one preset layout, filled with kSentinel.
struct EngineBuffers {
  std::vector<std::vector<uint8_t>> k, v;
  std::vector<void*> k_bases, v_bases;
  EngineView view;

  Status init(EngineLayoutKind kind, const PagedShape& shape, bool permute_k) {
    const size_t bytes = static_cast<size_t>(engine_layer_elements(kind, shape)) * dtype_size(shape.dtype);
    const bool split = engine_layout_splits_kv(kind);
    k.assign(shape.layers, std::vector<uint8_t>(bytes, kSentinel));
    v.assign(split ? shape.layers : 0, std::vector<uint8_t>(bytes, kSentinel));
    k_bases.clear();
    v_bases.clear();
    for (auto& b : k) k_bases.push_back(b.data());
    for (auto& b : v) v_bases.push_back(b.data());
    return preset_view(kind, shape, k_bases.data(), split ? v_bases.data() : nullptr, permute_k, &view);
  }
  bool operator==(const EngineBuffers& o) const { return k == o.k && v == o.v; }
};

// Slots of `tokens` tokens on a random block table (distinct blocks, so a partial last block
// when tokens % block_size != 0), with about `skip_percent`% of tokens mapped to -1.
inline std::vector<int64_t> random_slots(CounterRng& rng, uint32_t tokens, int64_t num_blocks, int64_t block_size,
                                         uint32_t skip_percent) {
  std::vector<int64_t> blocks(static_cast<size_t>(num_blocks));
  std::iota(blocks.begin(), blocks.end(), 0);
  for (size_t i = blocks.size(); i > 1; --i) std::swap(blocks[i - 1], blocks[rng.next_below(i)]);
  std::vector<int64_t> slots(tokens);
  for (uint32_t t = 0; t < tokens; ++t) {
    slots[t] = blocks[t / block_size] * block_size + t % block_size;
    if (rng.next_below(100) < skip_percent) slots[t] = -1;
  }
  return slots;
}

// Random finite values of moderate magnitude in any dtype.
inline void fill_random(void* data, uint64_t n, DType t, CounterRng& rng, double scale = 4.0) {
  for (uint64_t i = 0; i < n; ++i)
    store_f32(data, static_cast<int64_t>(i), t, static_cast<float>(scale * rng.next_normal()), 1.0f);
}

inline std::vector<uint8_t> random_chunk(const ChunkGeometry& g, uint64_t seed) {
  std::vector<uint8_t> c(chunk_bytes(g));
  CounterRng rng(seed);
  fill_random(c.data(), chunk_elements(g), g.dtype, rng);
  return c;
}

template <class Fn>
void for_each_element(const ChunkGeometry& g, const Fn& fn) {
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t p = 0; p < 2; ++p)
      for (uint32_t t = 0; t < g.tokens; ++t)
        for (uint32_t h = 0; h < g.kv_heads; ++h)
          for (uint32_t d = 0; d < g.head_dim; ++d) fn(l, p, t, h, d);
}

inline void reference_scatter(const void* chunk, const ChunkGeometry& g, const EngineView& v) {
  for_each_element(g, [&](uint32_t l, uint32_t p, uint32_t t, uint32_t h, uint32_t d) {
    scatter_element(chunk, g, v, l, p, t, h, d);
  });
}

inline void reference_gather(const EngineView& v, void* chunk, const ChunkGeometry& g) {
  for_each_element(g, [&](uint32_t l, uint32_t p, uint32_t t, uint32_t h, uint32_t d) {
    gather_element(v, chunk, g, l, p, t, h, d);
  });
}

inline void reference_rope_scatter(const void* chunk, const ChunkGeometry& g, const EngineView& v,
                                   const RopeTable& rt) {
  for_each_element(g, [&](uint32_t l, uint32_t p, uint32_t t, uint32_t h, uint32_t d) {
    if (p == 1 || d >= rt.rotary_dim) scatter_element(chunk, g, v, l, p, t, h, d);
  });
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t t = 0; t < g.tokens; ++t)
      for (uint32_t h = 0; h < g.kv_heads; ++h)
        for (uint32_t i = 0; i < rt.rotary_dim / 2; ++i) rope_scatter_pair(chunk, g, v, rt, l, t, h, i);
}

}  // namespace kdn::kernels::testing
