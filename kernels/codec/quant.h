// KVC1 quantizers: asymmetric uniform b-bit codes with a stored scale S and zero point Z per
// group (docs/codec.md, "Quantized planes").
//
//   encoder:  Z = mn rounded down to the scale dtype;  S = (mx - Z) / (2^b - 1) rounded up
//             q = S == 0 ? 0 : clamp(rint((x - Z) / S), 0, 2^b - 1)       (f32, stored S and Z)
//   decoder:  x^ = fmaf(q, S, Z), then one rounding to the output dtype
//
// Rounding Z down and S up keeps every x of the group inside [Z, Z + (2^b - 1) S], so
// |x - x^| <= S/2 plus float rounding; and because the encoder uses the stored values, the
// decoder reproduces x^ exactly. A constant group whose value the scale dtype holds gets S = 0
// and decodes exactly.
#pragma once

#include "format.h"

#include <kdn/kernels/dtype.h>
#include <kdn/kernels/hd.h>

#include <cmath>
#include <cstdint>

namespace kdn::kernels::kvc1 {

// ---- per-element bodies (host and device) ---------------------------------------------------

KDN_HD_INLINE float dequantize_value(uint32_t q, float s, float z) { return fmaf(static_cast<float>(q), s, z); }

KDN_HD_INLINE uint32_t quantize_value(float x, float s, float z, uint32_t qmax) {
  if (!(s > 0.0f)) return 0;
  const float v = fdiv_rn(fsub_rn(x, z), s);
  if (!(v > 0.0f)) return 0;
  if (v >= static_cast<float>(qmax)) return qmax;
  return static_cast<uint32_t>(rintf(v));
}

// ---- Hadamard transform (plane transform kTransformHadamard) ---------------------------------
//
// The unnormalized Walsh-Hadamard transform of n = 2^k values in Sylvester order, computed in
// stages len = 1, 2, 4, ..., n/2; stage len replaces each pair (x[i], x[i + len]) with
// (x[i] + x[i + len], x[i] - x[i + len]) for every i with i & len == 0. The encoder transforms a
// row before quantizing it; the decoder transforms the dequantized row and multiplies by 1/n,
// which inverts it (H H = n I) and is exact because n is a power of two. Every output element
// of a stage is one rounded add or subtract of two inputs, so any split of the butterflies
// over threads gives the same bits.

// The pair (x[i], x[i + len]), i & len == 0, of stage `len`.
KDN_HD_INLINE void hadamard_pair(float* x, uint32_t len, uint32_t i) {
  const float a = x[i], b = x[i + len];
  x[i] = fadd_rn(a, b);
  x[i + len] = fsub_rn(a, b);
}

// Butterfly j (0 <= j < n/2) of stage `len` (a power of two): the split a warp's lanes use.
KDN_HD_INLINE void hadamard_butterfly(float* x, uint32_t len, uint32_t j) {
  hadamard_pair(x, len, ((j & ~(len - 1)) << 1) | (j & (len - 1)));
}

// All stages on one thread, the pairs of a stage visited in blocks so that the inner loop is
// contiguous.
KDN_HD_INLINE void hadamard_inplace(float* x, uint32_t n) {
  for (uint32_t len = 1; len < n; len *= 2)
    for (uint32_t i0 = 0; i0 < n; i0 += 2 * len)
      for (uint32_t i = i0; i < i0 + len; ++i) hadamard_pair(x, len, i);
}

// 1/n, exact for n = 2^k (k <= 12).
KDN_HD_INLINE float hadamard_inverse_scale(uint32_t n) { return 1.0f / static_cast<float>(n); }

// Stored scale (or zero point) number `index` of a parameter array in `scale_dtype`.
KDN_HD_INLINE float load_scale(const uint8_t* params, uint64_t index, uint8_t scale_dtype) {
  if (scale_dtype == kScaleF16) return f16_to_f32(ld16(params + 2 * index));
  return bits_as<float>(ld32(params + 4 * index));
}

// ---- encoder-side scale rules (host and device: the CPU and CUDA encoders share them) ----------

KDN_HD_INLINE bool finite_f32(float v) { return (bits_as<uint32_t>(v) & 0x7f800000u) != 0x7f800000u; }

KDN_HD_INLINE uint16_t f16_next_down(uint16_t h) {
  if (h == 0x0000u) return 0x8001u;                      // +0 -> the negative subnormal nearest zero
  if (h & 0x8000u) return static_cast<uint16_t>(h + 1);  // negative: one step more magnitude
  return static_cast<uint16_t>(h - 1);
}

KDN_HD_INLINE uint16_t f16_next_up(uint16_t h) {
  if (h == 0x8000u) return 0x0001u;
  if (h & 0x8000u) return static_cast<uint16_t>(h - 1);
  return static_cast<uint16_t>(h + 1);
}

// Largest binary16 value <= v (may be -inf), and smallest >= v (may be +inf).
KDN_HD_INLINE uint16_t f16_round_down_body(float v) {
  uint16_t h = f32_to_f16(v);
  if (f16_to_f32(h) > v) h = f16_next_down(h);
  return h;
}

KDN_HD_INLINE uint16_t f16_round_up_body(float v) {
  uint16_t h = f32_to_f16(v);
  if (f16_to_f32(h) < v) h = f16_next_up(h);
  return h;
}

// Smallest float >= d (may be +inf), for d > 0: the next float up of a positive finite float
// is its bit pattern plus one (FLT_MAX + 1 ulp is +inf). The conversion rounds to nearest on
// both sides.
KDN_HD_INLINE float f32_round_up(double d) {
  float f = static_cast<float>(d);
  if (static_cast<double>(f) < d) f = bits_as<float>(bits_as<uint32_t>(f) + 1);
  return f;
}

uint16_t f16_round_down(float v) noexcept;
uint16_t f16_round_up(float v) noexcept;

struct GroupScale {
  float s, z;               // stored values widened to f32
  uint32_t s_bits, z_bits;  // their stored bit patterns (f16 in the low half, or f32)
};

// stored_group_scale's body. The fp64 subtraction is exact and the division correctly rounded
// on both sides (nvcc's double division is IEEE; the codec compiles without FMA contraction).
KDN_HD_INLINE bool group_scale_body(float mn, float mx, uint32_t bits, uint8_t scale_dtype, GroupScale* out) {
  const uint32_t qmax = (1u << bits) - 1;
  const bool half = scale_dtype == kScaleF16;
  float z = mn;
  if (half) {
    out->z_bits = f16_round_down_body(mn);
    z = f16_to_f32(static_cast<uint16_t>(out->z_bits));
  } else {
    out->z_bits = bits_as<uint32_t>(mn);
  }
  if (!finite_f32(z)) return false;
  const double sd = (static_cast<double>(mx) - static_cast<double>(z)) / qmax;
  float s = 0.0f;
  if (sd > 0.0) {
    s = f32_round_up(sd);
    if (half) {
      const uint16_t h = f16_round_up_body(s);
      s = f16_to_f32(h);
      out->s_bits = h;
    } else {
      out->s_bits = bits_as<uint32_t>(s);
    }
    if (!finite_f32(s)) return false;
  } else {
    out->s_bits = 0;
  }
  out->s = s;
  out->z = z;
  return true;
}

// The stored scale and zero point of a group whose finite values span [mn, mx] (mn <= mx).
// False if they do not fit `scale_dtype` (the encoder then stores the plane's scales as f32).
bool stored_group_scale(float mn, float mx, uint32_t bits, uint8_t scale_dtype, GroupScale* out) noexcept;

// ---- CPU rows ----------------------------------------------------------------------------------

// hadamard_inplace(x, n), then x[i] = fmul_rn(x[i], scale) unless scale is 1 (n a power of
// two). AVX2 when the CPU has it; the bits are those of the scalar bodies either way.
void hadamard_row(float* x, uint32_t n, float scale) noexcept;

// ---- CPU row dequantization --------------------------------------------------------------------

// out[d] = dequantize_value(q[d], S(d), Z(d)) rounded once to out_type, for d < n, where S(d) is
// scale number d / per of `s` (likewise Z): per = 1 for per-channel scales (K), per = group for
// per-token groups (V). Uses AVX2/FMA/F16C when the CPU has them; results are bit-identical to
// the scalar bodies either way.
void dequantize_row(const uint8_t* q, uint32_t n, const uint8_t* s, const uint8_t* z, uint8_t scale_dtype, uint32_t per,
                    DType out_type, void* out) noexcept;

// The scalar reference of dequantize_row.
void dequantize_row_scalar(const uint8_t* q, uint32_t n, const uint8_t* s, const uint8_t* z, uint8_t scale_dtype,
                           uint32_t per, DType out_type, void* out) noexcept;

// Forces the scalar row paths (tests); returns the previous setting.
bool set_dequantize_simd_enabled(bool enabled) noexcept;

// q[d] = quantize_value(x[d], s[d], z[d], qmax) for d < n (AVX2 when the CPU has it; the
// results are those of the scalar body either way).
void quantize_row(const float* x, const float* s, const float* z, uint32_t n, uint32_t qmax, uint8_t* q) noexcept;

// q[d] = quantize_value(x[d], s[d / group], z[d / group], qmax) for d < n (group divides n).
void quantize_row_grouped(const float* x, const float* s, const float* z, uint32_t group, uint32_t n, uint32_t qmax,
                          uint8_t* q) noexcept;

}  // namespace kdn::kernels::kvc1
