// Layouts of transform coding (docs/codec.md §10): the calibration object and the parameters
// and band segments of a kCodecTransform plane. Parse helpers are KDN_HD so that a device
// decoder can locate its data with the CPU's code.
#pragma once

#include "format.h"

#include <kdn/kernels/hd.h>

#include <cstdint>

namespace kdn::kernels::kvc1 {

// ---- calibration object ("KDNKVT1") ---------------------------------------------------------
//
//   0  8  magic "KDNKVT1\0"          40 4  layers
//   8  2  version_major (1)          44 4  kv_heads
//  10  2  version_minor (0)          48 4  head_dim
//  12  4  header_bytes (64)          52 4  samples (token rows per head)
//  16  8  total_bytes                56 4  CRC32C of the body
//  24 16  fingerprint                60 4  CRC32C of bytes [0, 60)
// then per (layer, plane, head) in that order: f32 mean[D], f32 variance[D], f32 basis[D][D]
// (row j the j-th axis, variances non-increasing).
constexpr uint16_t kCalVersionMajor = 1;
constexpr uint16_t kCalVersionMinor = 0;
constexpr uint32_t kCalHeaderBytes = 64;

KDN_HD_INLINE uint64_t cal_head_floats(uint32_t d) { return 2ull * d + uint64_t{d} * d; }

// Offset, in floats from the body's start, of (layer, plane, head)'s mean.
KDN_HD_INLINE uint64_t cal_head_offset(uint32_t heads, uint32_t d, uint32_t layer, uint32_t plane, uint32_t head) {
  return ((uint64_t{layer} * 2 + plane) * heads + head) * cal_head_floats(d);
}

// ---- kCodecTransform plane parameters -----------------------------------------------------------
//
//   u8 W[H][D]  widths (0..plane bits), zero padding to 16
//   S[H][D], Z[H][D] in the scale dtype: coordinate (h, j) decodes as fmaf(q, S, Z)
//   exact rows (minor 2/3 semantics), after zero padding to 16, as in a quantized plane

KDN_HD_INLINE uint64_t tc_scale_offset(const Header& h) { return align16(uint64_t{h.kv_heads} * h.head_dim); }

KDN_HD_INLINE uint64_t tc_exact_offset(const Header& h, const Plane& pl) {
  return align16(tc_scale_offset(h) + 2ull * h.kv_heads * h.head_dim * scale_bytes(pl.scale_dtype));
}

KDN_HD_INLINE uint64_t tc_params_bytes(const Header& h, const Plane& pl) {
  const uint64_t rows = exact_rows(pl);
  if (rows == 0) return tc_scale_offset(h) + 2ull * h.kv_heads * h.head_dim * scale_bytes(pl.scale_dtype);
  return tc_exact_offset(h, pl) + rows * h.kv_heads * h.head_dim * dtype_bytes_of(h.dtype);
}

// Band segments: segment i holds the coordinates of the i-th largest width present (widths 0
// have none), columns (h, j) in head-major order, one row of them per coded token. The header
// a band segment is parsed with: the chunk's, with head_dim = the band's columns.
KDN_HD_INLINE Header band_header(const Header& h, uint32_t columns) {
  Header b = h;
  b.head_dim = columns;
  return b;
}

// Widths present in W (bit w set for each width w >= 1 that occurs).
KDN_HD_INLINE uint32_t widths_present(const uint8_t* w, uint64_t n) {
  uint32_t mask = 0;
  for (uint64_t i = 0; i < n; ++i) mask |= (1u << w[i]) & ~1u;
  return mask;
}

// The width of band segment s (0 if there is no such band), from the present-widths mask.
KDN_HD_INLINE uint32_t band_width(uint32_t present, uint32_t s) {
  for (uint32_t w = 8; w >= 1; --w)
    if ((present >> w) & 1u) {
      if (s == 0) return w;
      --s;
    }
  return 0;
}

KDN_HD_INLINE uint32_t band_columns(const uint8_t* w, uint64_t n, uint32_t width) {
  uint32_t c = 0;
  for (uint64_t i = 0; i < n; ++i) c += w[i] == width;
  return c;
}

// Step of the uniform quantizer for a unit-variance Gaussian at b bits (Max's optimum for 2^b
// levels), and its mean squared error, b = 0..8: what the widths are allotted by.
KDN_HD_INLINE float gaussian_step(uint32_t bits) {
  const float s[9] = {0.0f, 1.596f, 0.9957f, 0.5860f, 0.3352f, 0.1881f, 0.1041f, 0.0569f, 0.0308f};
  return s[bits];
}

}  // namespace kdn::kernels::kvc1
