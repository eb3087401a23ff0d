// The per-element bodies of transform-plane decoding (docs/codec.md §10.3), shared by the CPU
// decoder (decode_transform.cc) and the device decoder (decode_warp.h), so both make the same
// bits: which columns a band holds, a coordinate from its parked code, and one step of the
// rotation back from the calibrated axes.
#pragma once

#include "format.h"
#include "quant.h"
#include "transform_format.h"

#include <kdn/kernels/hd.h>

#include <cstdint>

namespace kdn::kernels::kvc1 {

// The flat coordinates (head * head_dim + axis) of the band of `width`, in order, into
// columns[]; returns how many (at most n = kv_heads * head_dim).
KDN_HD_INLINE uint32_t band_column_list(const uint8_t* widths, uint64_t n, uint32_t width, uint16_t* columns) {
  uint32_t c = 0;
  for (uint64_t i = 0; i < n; ++i)
    if (widths[i] == width) columns[c++] = static_cast<uint16_t>(i);
  return c;
}

// Coordinate j of a row of `head` from its parked code: fmaf(q, S, Z), q = 0 where W = 0.
KDN_HD_INLINE float tc_coordinate(const uint8_t* params, const Header& h, const Plane& pl, uint32_t head, uint32_t j,
                                  uint32_t code) {
  const uint64_t n = uint64_t{h.kv_heads} * h.head_dim, i = uint64_t{head} * h.head_dim + j;
  const uint8_t* s = params + tc_scale_offset(h);
  const uint32_t q = params[i] ? code : 0;
  return dequantize_value(q, load_scale(s, i, pl.scale_dtype), load_scale(s, n + i, pl.scale_dtype));
}

// One step of x = mean + sum_j y_j * axis_j: a rounded multiply, then a rounded add, never fused.
KDN_HD_INLINE float tc_accumulate(float x, float axis, float y) { return fadd_rn(x, fmul_rn(axis, y)); }

// (layer, plane, head)'s calibration floats (mean[D], variance[D], axes[D][D]) in the bytes of a
// calibration object the host validated.
KDN_HD_INLINE const float* tc_calibration_head(const uint8_t* cal, const Header& h, uint32_t layer, uint32_t plane,
                                               uint32_t head) {
  return reinterpret_cast<const float*>(cal + kCalHeaderBytes) +
         cal_head_offset(h.kv_heads, h.head_dim, layer, plane, head);
}

}  // namespace kdn::kernels::kvc1
