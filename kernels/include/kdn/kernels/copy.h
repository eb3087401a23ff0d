// Per-element bodies of gather, scatter and rope_scatter (reference semantics, host and device).
//
// The index space of every op is (layer, plane, token, head, dim) of the canonical chunk; rope
// bodies run over (layer, K, token, head, pair) instead of (.., dim) for the rotated channels.
// The CPU launcher runs row-at-a-time specializations (kdn/kernels/cpu_rows.h) that the tests
// check against these bodies; the CUDA launcher runs these bodies directly.
//
// Dtype rule: when chunk and engine dtypes are equal, plain copies move the bytes unchanged and
// the chunk is taken to carry the engine's scale (matters for fp8 only); otherwise values are
// converted through f32 with one rounding, applying the engine's fp8 scale on the engine side.
#pragma once

#include <kdn/kernels/dtype.h>
#include <kdn/kernels/hd.h>
#include <kdn/kernels/layout.h>
#include <kdn/kernels/rope.h>

#include <cstdint>

namespace kdn::kernels {

// Scale to read or write the chunk side with (see the dtype rule above).
KDN_HD_INLINE float chunk_scale(const EngineView& v, uint32_t plane, DType chunk_dtype) {
  return chunk_dtype == v.dtype ? v.scale[plane] : 1.0f;
}

// Copies element `si` of `src` to element `di` of `dst`.
KDN_HD_INLINE void copy_value(const void* src, int64_t si, DType st, float sscale, void* dst, int64_t di, DType dt,
                              float dscale) {
  if (st == dt) {
    switch (dtype_size(st)) {
      case 1:
        static_cast<uint8_t*>(dst)[di] = static_cast<const uint8_t*>(src)[si];
        return;
      case 2:
        static_cast<uint16_t*>(dst)[di] = static_cast<const uint16_t*>(src)[si];
        return;
      default:
        static_cast<uint32_t*>(dst)[di] = static_cast<const uint32_t*>(src)[si];
        return;
    }
  }
  store_f32(dst, di, dt, load_f32(src, si, st, sscale), dscale);
}

// Engine element offset of canonical (plane, head, d) at `slot` (from the layer base).
KDN_HD_INLINE int64_t engine_element(const EngineView& v, uint32_t plane, int64_t slot, uint32_t head, uint32_t d) {
  return engine_row_offset(v, plane, slot, head) +
         static_cast<int64_t>(engine_channel(v, plane, d)) * v.stride_dim[plane];
}

// scatter: chunk element -> engine element. Skips tokens whose slot is out of bounds.
KDN_HD_INLINE void scatter_element(const void* chunk, const ChunkGeometry& g, const EngineView& v, uint32_t layer,
                                   uint32_t plane, uint32_t token, uint32_t head, uint32_t d) {
  const int64_t slot = token_slot(v, token);
  if (!slot_in_bounds(v, slot)) return;
  copy_value(chunk, chunk_offset(g, layer, plane, token, head, d), g.dtype, chunk_scale(v, plane, g.dtype),
             engine_layer_base(v, plane, layer), engine_element(v, plane, slot, head, d), v.dtype, v.scale[plane]);
}

// gather: engine element -> chunk element. Tokens whose slot is out of bounds are left untouched.
KDN_HD_INLINE void gather_element(const EngineView& v, void* chunk, const ChunkGeometry& g, uint32_t layer,
                                  uint32_t plane, uint32_t token, uint32_t head, uint32_t d) {
  const int64_t slot = token_slot(v, token);
  if (!slot_in_bounds(v, slot)) return;
  copy_value(engine_layer_base(v, plane, layer), engine_element(v, plane, slot, head, d), v.dtype, v.scale[plane],
             chunk, chunk_offset(g, layer, plane, token, head, d), g.dtype, chunk_scale(v, plane, g.dtype));
}

// rope_scatter, rotated part: K pair i of (layer, token, head), rotated by the table's delta for
// `token`, rounded once into the engine dtype. Channels >= rotary_dim and all of V go through
// scatter_element.
KDN_HD_INLINE void rope_scatter_pair(const void* chunk, const ChunkGeometry& g, const EngineView& v,
                                     const RopeTable& rt, uint32_t layer, uint32_t token, uint32_t head,
                                     uint32_t pair) {
  const int64_t slot = token_slot(v, token);
  if (!slot_in_bounds(v, slot)) return;
  uint32_t a, b;
  rope_pair_channels(rt.style, rt.rotary_dim, pair, &a, &b);
  const float cscale = chunk_scale(v, 0, g.dtype);
  const float x = load_f32(chunk, chunk_offset(g, layer, 0, token, head, a), g.dtype, cscale);
  const float y = load_f32(chunk, chunk_offset(g, layer, 0, token, head, b), g.dtype, cscale);
  const float* cs = rope_row_of(rt, token);
  float xo, yo;
  rope_rotate(x, y, cs[pair], cs[rt.rotary_dim / 2 + pair], &xo, &yo);
  void* base = engine_layer_base(v, 0, layer);
  store_f32(base, engine_element(v, 0, slot, head, a), v.dtype, xo, v.scale[0]);
  store_f32(base, engine_element(v, 0, slot, head, b), v.dtype, yo, v.scale[0]);
}

// rope in place on a canonical chunk's K plane (pair i of (layer, token, head)).
KDN_HD_INLINE void rope_chunk_pair(void* chunk, const ChunkGeometry& g, const RopeTable& rt, uint32_t layer,
                                   uint32_t token, uint32_t head, uint32_t pair) {
  uint32_t a, b;
  rope_pair_channels(rt.style, rt.rotary_dim, pair, &a, &b);
  const int64_t ia = chunk_offset(g, layer, 0, token, head, a);
  const int64_t ib = chunk_offset(g, layer, 0, token, head, b);
  const float* cs = rope_row_of(rt, token);
  float xo, yo;
  rope_rotate(load_f32(chunk, ia, g.dtype, 1.0f), load_f32(chunk, ib, g.dtype, 1.0f), cs[pair],
              cs[rt.rotary_dim / 2 + pair], &xo, &yo);
  store_f32(chunk, ia, g.dtype, xo, 1.0f);
  store_f32(chunk, ib, g.dtype, yo, 1.0f);
}

}  // namespace kdn::kernels
