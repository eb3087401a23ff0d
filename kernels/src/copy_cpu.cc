// CPU launchers of gather, scatter, rope_scatter and rope_chunk. The unit of work is one row
// group (layer, plane, token): all heads of one token. Rows run the cpu_rows.h specializations
// of the element bodies in copy.h; the common cases are single memcpy calls.
//
// Large ops write their destination with streaming (non-temporal) stores: a chunk is megabytes
// that this thread will not read back, and ordinary stores would first read every destination
// line into the cache (read-for-ownership), costing a third of the memory bandwidth. Small ops
// keep ordinary stores so an engine reading the rows right away finds them in cache.
#include <kdn/common/model.h>
#include <kdn/kernels/copy.h>
#include <kdn/kernels/cpu_rows.h>

#include <algorithm>
#include <cstring>

#include "copy_impl.h"
#include "cpu_launch.h"
#include "rope_fast.h"
#include "stream_copy.h"

namespace kdn::kernels::detail {
namespace {

constexpr uint64_t kStreamingThreshold = 4u << 20;  // op bytes from which stores bypass the cache
constexpr uint32_t kGroupFloats = 4096;             // f32 staging per head group (16 KiB)

struct RowId {
  uint32_t layer, plane, token;
};

// Rows are numbered in canonical order, so consecutive rows read (or write) the chunk sequentially.
RowId row_at(uint64_t r, const ChunkGeometry& g, uint32_t l0) {
  const uint64_t q = r / g.tokens;
  return {l0 + static_cast<uint32_t>(q / 2), static_cast<uint32_t>(q % 2), static_cast<uint32_t>(r % g.tokens)};
}

uint64_t row_bytes(const ChunkGeometry& g) { return uint64_t{g.kv_heads} * g.head_dim * dtype_size(g.dtype); }

// About 64 KiB of chunk bytes per task: large enough to amortize scheduling, small enough to balance.
uint64_t grain_rows(const ChunkGeometry& g) { return std::max<uint64_t>(1, 65536 / row_bytes(g)); }

bool use_streaming(const ChunkGeometry& g, Layers ls) {
  return row_bytes(g) * g.tokens * 2 * (ls.l1 - ls.l0) >= kStreamingThreshold;
}

bool is_permuted(const EngineView& v, uint32_t plane) { return plane == 0 && (v.flags & kPermuteK); }

// True when a token's heads form one contiguous run in the engine, like in the chunk.
bool heads_contiguous(const EngineView& v, uint32_t plane) {
  return v.stride_dim[plane] == 1 && !is_permuted(v, plane) &&
         (v.kv_heads == 1 || v.stride_head[plane] == static_cast<int64_t>(v.head_dim));
}

char* engine_ptr(const EngineView& v, uint32_t plane, uint32_t layer, int64_t element) {
  return static_cast<char*>(engine_layer_base(v, plane, layer)) + element * int64_t{dtype_size(v.dtype)};
}

const char* chunk_row_ptr(const void* chunk, const ChunkGeometry& g, RowId id) {
  return static_cast<const char*>(chunk) + chunk_offset(g, id.layer, id.plane, id.token, 0, 0) * dtype_size(g.dtype);
}

template <class T>
void copy_channels(const EngineView& v, uint32_t plane, T* engine, const T* chunk_row, T* chunk_out, uint32_t d0,
                   uint32_t d1) {
  const int64_t sd = v.stride_dim[plane];
  if (!is_permuted(v, plane)) {  // strided only (e.g. llama.cpp's transposed V): plain loops
    if (chunk_out) {
      for (uint32_t d = d0; d < d1; ++d) chunk_out[d] = engine[d * sd];
    } else {
      for (uint32_t d = d0; d < d1; ++d) engine[d * sd] = chunk_row[d];
    }
    return;
  }
  for (uint32_t d = d0; d < d1; ++d) {
    T* e = engine + int64_t{engine_channel(v, plane, d)} * sd;
    if (chunk_out) {
      chunk_out[d] = *e;
    } else {
      *e = chunk_row[d];
    }
  }
}

// Same-dtype byte moves of channels [d0, d1) of one head row with strides or permutation, either
// direction (chunk_out non-null: engine -> chunk).
void move_channels_strided(const EngineView& v, uint32_t plane, char* engine_row, const char* chunk_row,
                           char* chunk_out, uint32_t d0, uint32_t d1) {
  switch (dtype_size(v.dtype)) {
    case 1:
      return copy_channels(v, plane, reinterpret_cast<uint8_t*>(engine_row),
                           reinterpret_cast<const uint8_t*>(chunk_row), reinterpret_cast<uint8_t*>(chunk_out), d0, d1);
    case 2:
      return copy_channels(v, plane, reinterpret_cast<uint16_t*>(engine_row),
                           reinterpret_cast<const uint16_t*>(chunk_row), reinterpret_cast<uint16_t*>(chunk_out), d0,
                           d1);
    default:
      return copy_channels(v, plane, reinterpret_cast<uint32_t*>(engine_row),
                           reinterpret_cast<const uint32_t*>(chunk_row), reinterpret_cast<uint32_t*>(chunk_out), d0,
                           d1);
  }
}

// Stores `n` f32 values at dst in dtype dt (streaming: through a small staging buffer).
void store_f32_run(const float* in, uint32_t n, DType dt, float scale, char* dst, bool stream) {
  if (!stream) return store_row_f32(in, n, dt, scale, dst);
  if (dt == DType::kF32) return copy_bytes(dst, in, size_t{n} * 4, true);
  alignas(64) char staging[kGroupFloats * 2];
  const uint32_t es = dtype_size(dt), step = sizeof(staging) / es;
  for (uint32_t i = 0; i < n; i += step) {
    const uint32_t m = std::min(step, n - i);
    store_row_f32(in + i, m, dt, scale, staging);
    copy_bytes(dst + size_t{i} * es, staging, size_t{m} * es, true);
  }
}

struct OpContext {
  const ChunkGeometry& g;
  const EngineView& v;
  bool stream;
};

void scatter_row(const OpContext& c, const void* chunk, RowId id, int64_t slot) {
  const ChunkGeometry& g = c.g;
  const EngineView& v = c.v;
  const char* src = chunk_row_ptr(chunk, g, id);
  const size_t head_bytes = size_t{g.head_dim} * dtype_size(g.dtype);
  if (g.dtype == v.dtype && heads_contiguous(v, id.plane)) {
    char* dst = engine_ptr(v, id.plane, id.layer, engine_row_offset(v, id.plane, slot, 0));
    return copy_bytes(dst, src, head_bytes * g.kv_heads, c.stream);
  }
  float buf[kMaxHeadDim];
  for (uint32_t h = 0; h < g.kv_heads; ++h, src += head_bytes) {
    if (g.dtype == v.dtype) {
      char* dst = engine_ptr(v, id.plane, id.layer, engine_row_offset(v, id.plane, slot, h));
      if (v.stride_dim[id.plane] == 1 && !is_permuted(v, id.plane)) {
        copy_bytes(dst, src, head_bytes, c.stream);
      } else {
        move_channels_strided(v, id.plane, dst, src, nullptr, 0, g.head_dim);
      }
    } else {
      load_row_f32(src, g.dtype, 1.0f, g.head_dim, buf);
      store_engine_row_f32(v, id.plane, id.layer, slot, h, buf);
    }
  }
}

void gather_row(const OpContext& c, void* chunk, RowId id, int64_t slot) {
  const ChunkGeometry& g = c.g;
  const EngineView& v = c.v;
  char* dst = const_cast<char*>(chunk_row_ptr(chunk, g, id));
  const size_t head_bytes = size_t{g.head_dim} * dtype_size(g.dtype);
  if (g.dtype == v.dtype && heads_contiguous(v, id.plane)) {
    const char* src = engine_ptr(v, id.plane, id.layer, engine_row_offset(v, id.plane, slot, 0));
    return copy_bytes(dst, src, head_bytes * g.kv_heads, c.stream);
  }
  float buf[kMaxHeadDim];
  for (uint32_t h = 0; h < g.kv_heads; ++h, dst += head_bytes) {
    char* src = engine_ptr(v, id.plane, id.layer, engine_row_offset(v, id.plane, slot, h));
    if (g.dtype == v.dtype) {
      if (v.stride_dim[id.plane] == 1 && !is_permuted(v, id.plane)) {
        copy_bytes(dst, src, head_bytes, c.stream);
      } else {
        move_channels_strided(v, id.plane, src, nullptr, dst, 0, g.head_dim);
      }
    } else {
      load_engine_row_f32(v, id.plane, id.layer, slot, h, buf);
      store_f32_run(buf, g.head_dim, g.dtype, 1.0f, dst, c.stream);
    }
  }
}

// K rows of rope_scatter, a group of heads at a time: one conversion of the group into f32,
// rotation per head, then one store of the group when the engine keeps heads contiguous.
// The AVX2 path: same dtype (f16/bf16), NeoX, unit stride, no permutation.
bool rope_scatter_k_row_fast(const OpContext& c, const RopeTable& t, const void* chunk, RowId id, int64_t slot) {
  const ChunkGeometry& g = c.g;
  const EngineView& v = c.v;
  if (!rope_neox_fast_available() || g.dtype != v.dtype || t.style != RopeStyle::kNeox || v.stride_dim[0] != 1 ||
      is_permuted(v, 0) || (g.dtype != DType::kF16 && g.dtype != DType::kBF16) || t.rotary_dim % 16 != 0) {
    return false;
  }
  const char* src = chunk_row_ptr(chunk, g, id);
  const size_t head_bytes = size_t{g.head_dim} * 2;
  const float* cs = rope_row_of(t, id.token);
  for (uint32_t h = 0; h < g.kv_heads; ++h, src += head_bytes) {
    char* dst = engine_ptr(v, 0, id.layer, engine_row_offset(v, 0, slot, h));
    rope_neox_head_fast(src, dst, g.dtype, g.head_dim, t.rotary_dim, cs, c.stream);
  }
  return true;
}

void rope_scatter_k_row(const OpContext& c, const RopeTable& t, const void* chunk, RowId id, int64_t slot) {
  if (rope_scatter_k_row_fast(c, t, chunk, id, slot)) return;
  const ChunkGeometry& g = c.g;
  const EngineView& v = c.v;
  const uint32_t es = dtype_size(g.dtype), D = g.head_dim;
  const uint32_t group = std::max<uint32_t>(1, kGroupFloats / D);
  const bool contiguous = heads_contiguous(v, 0);
  const float cscale = chunk_scale(v, 0, g.dtype);
  float buf[kGroupFloats > kMaxHeadDim ? kGroupFloats : kMaxHeadDim];
  const char* src = chunk_row_ptr(chunk, g, id);
  for (uint32_t h0 = 0; h0 < g.kv_heads; h0 += group) {
    const uint32_t nh = std::min(group, g.kv_heads - h0);
    const char* group_src = src + size_t{h0} * D * es;
    load_row_f32(group_src, g.dtype, cscale, nh * D, buf);
    for (uint32_t h = 0; h < nh; ++h) rope_row_f32_cpu(t, id.token, buf + h * D);
    if (contiguous) {
      store_f32_run(buf, nh * D, v.dtype, v.scale[0], engine_ptr(v, 0, id.layer, engine_row_offset(v, 0, slot, h0)),
                    c.stream);
    } else {
      for (uint32_t h = 0; h < nh; ++h) store_engine_row_f32(v, 0, id.layer, slot, h0 + h, buf + h * D);
    }
    if (g.dtype == v.dtype && t.rotary_dim < D) {
      // Pass-through channels are byte copies, as in scatter_element.
      for (uint32_t h = 0; h < nh; ++h) {
        char* dst = engine_ptr(v, 0, id.layer, engine_row_offset(v, 0, slot, h0 + h));
        move_channels_strided(v, 0, dst, group_src + size_t{h} * D * es, nullptr, t.rotary_dim, D);
      }
    }
  }
}

// Planes laid out channel-major (stride_dim != 1, e.g. llama.cpp's transposed V) move a tile of
// tokens per channel, so each destination line is written once per tile instead of once per
// token. Same dtype only (a byte move, as copy_value does).
constexpr uint32_t kTileTokens = 32;

bool tiled_plane(const OpContext& c, uint32_t plane) { return c.g.dtype == c.v.dtype && c.v.stride_dim[plane] != 1; }

template <class T>
void move_tile(const OpContext& c, T* chunk, uint32_t layer, uint32_t plane, uint32_t t0, uint32_t nt, bool to_chunk) {
  const ChunkGeometry& g = c.g;
  const EngineView& v = c.v;
  int64_t row[kTileTokens];
  uint32_t live[kTileTokens], n_live = 0;
  for (uint32_t i = 0; i < nt; ++i) {
    const int64_t slot = token_slot(v, t0 + i);
    if (slot < 0) continue;
    row[n_live] = engine_row_offset(v, plane, slot, 0);
    live[n_live++] = i;
  }
  T* base = static_cast<T*>(engine_layer_base(v, plane, layer));
  const int64_t token_stride = int64_t{g.kv_heads} * g.head_dim;
  for (uint32_t h = 0; h < g.kv_heads; ++h)
    for (uint32_t d = 0; d < g.head_dim; ++d) {
      const int64_t e = int64_t{h} * v.stride_head[plane] + int64_t{engine_channel(v, plane, d)} * v.stride_dim[plane];
      T* ck = chunk + chunk_offset(g, layer, plane, t0, h, d);
      for (uint32_t k = 0; k < n_live; ++k) {
        T& eng = base[row[k] + e];
        T& chk = ck[live[k] * token_stride];
        if (to_chunk) {
          chk = eng;
        } else {
          eng = chk;
        }
      }
    }
}

void move_tiled_plane(const OpContext& c, void* chunk, uint32_t plane, Layers ls, const Executor& ex, bool to_chunk) {
  const uint64_t tiles_per_layer = (c.g.tokens + kTileTokens - 1) / kTileTokens;
  cpu_for(ex, uint64_t{ls.l1 - ls.l0} * tiles_per_layer, 1, [&](uint64_t begin, uint64_t end) {
    for (uint64_t i = begin; i < end; ++i) {
      const uint32_t layer = ls.l0 + static_cast<uint32_t>(i / tiles_per_layer);
      const uint32_t t0 = static_cast<uint32_t>(i % tiles_per_layer) * kTileTokens;
      const uint32_t nt = std::min(kTileTokens, c.g.tokens - t0);
      switch (dtype_size(c.g.dtype)) {
        case 1:
          move_tile(c, static_cast<uint8_t*>(chunk), layer, plane, t0, nt, to_chunk);
          break;
        case 2:
          move_tile(c, static_cast<uint16_t*>(chunk), layer, plane, t0, nt, to_chunk);
          break;
        default:
          move_tile(c, static_cast<uint32_t*>(chunk), layer, plane, t0, nt, to_chunk);
          break;
      }
    }
  });
}

template <class RowFn>
void for_each_mapped_row(const OpContext& c, Layers ls, const Executor& ex, const RowFn& row_fn) {
  const uint64_t rows = uint64_t{ls.l1 - ls.l0} * 2 * c.g.tokens;
  cpu_for(ex, rows, grain_rows(c.g), [&](uint64_t begin, uint64_t end) {
    for (uint64_t r = begin; r < end; ++r) {
      const RowId id = row_at(r, c.g, ls.l0);
      const int64_t slot = token_slot(c.v, id.token);
      if (slot >= 0) row_fn(id, slot);  // upper bounds were checked before the launch
    }
    if (c.stream) streaming_fence();  // publish the non-temporal stores before the task ends
  });
}

}  // namespace

void scatter_cpu(const void* chunk, const ChunkGeometry& g, const EngineView& v, Layers ls, const Executor& ex) {
  const OpContext c{g, v, use_streaming(g, ls)};
  const bool tiled[2] = {tiled_plane(c, 0), tiled_plane(c, 1)};
  for_each_mapped_row(c, ls, ex, [&](RowId id, int64_t slot) {
    if (!tiled[id.plane]) scatter_row(c, chunk, id, slot);
  });
  for (uint32_t p = 0; p < 2; ++p) {
    if (tiled[p]) move_tiled_plane(c, const_cast<void*>(chunk), p, ls, ex, /*to_chunk=*/false);
  }
}

void gather_cpu(const EngineView& v, void* chunk, const ChunkGeometry& g, Layers ls, const Executor& ex) {
  const OpContext c{g, v, use_streaming(g, ls)};
  const bool tiled[2] = {tiled_plane(c, 0), tiled_plane(c, 1)};
  for_each_mapped_row(c, ls, ex, [&](RowId id, int64_t slot) {
    if (!tiled[id.plane]) gather_row(c, chunk, id, slot);
  });
  for (uint32_t p = 0; p < 2; ++p) {
    if (tiled[p]) move_tiled_plane(c, chunk, p, ls, ex, /*to_chunk=*/true);
  }
}

void rope_scatter_cpu(const void* chunk, const ChunkGeometry& g, const EngineView& v, const RopeTable& t, Layers ls,
                      const Executor& ex) {
  const OpContext c{g, v, use_streaming(g, ls)};
  const bool tiled_v = tiled_plane(c, 1);
  for_each_mapped_row(c, ls, ex, [&](RowId id, int64_t slot) {
    if (id.plane == 0) {
      rope_scatter_k_row(c, t, chunk, id, slot);
    } else if (!tiled_v) {
      scatter_row(c, chunk, id, slot);
    }
  });
  if (tiled_v) move_tiled_plane(c, const_cast<void*>(chunk), 1, ls, ex, /*to_chunk=*/false);
}

void rope_chunk_cpu(void* chunk, const ChunkGeometry& g, const RopeTable& t, Layers ls, const Executor& ex) {
  const uint64_t rows = uint64_t{ls.l1 - ls.l0} * g.tokens;  // K rows only
  const size_t es = dtype_size(g.dtype);
  cpu_for(ex, rows, grain_rows(g), [&](uint64_t begin, uint64_t end) {
    float buf[kMaxHeadDim];
    for (uint64_t r = begin; r < end; ++r) {
      const uint32_t layer = ls.l0 + static_cast<uint32_t>(r / g.tokens);
      const uint32_t token = static_cast<uint32_t>(r % g.tokens);
      char* row = static_cast<char*>(chunk) + chunk_offset(g, layer, 0, token, 0, 0) * es;
      for (uint32_t h = 0; h < g.kv_heads; ++h, row += g.head_dim * es) {
        load_row_f32(row, g.dtype, 1.0f, g.head_dim, buf);
        rope_row_f32_cpu(t, token, buf);
        store_row_f32(buf, t.rotary_dim, g.dtype, 1.0f, row);  // channels >= rotary_dim untouched
      }
    }
  });
}

}  // namespace kdn::kernels::detail
