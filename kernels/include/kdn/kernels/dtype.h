// Element types of KV buffers and exact conversions between them.
//
// DType values equal the public kdn_dtype codes (kdn/kdn.h), so a descriptor's dtype field can be
// used directly after validation (dtype_valid). All conversions are bit-manipulation bodies that
// run identically on host and device; they do not depend on the FPU rounding mode.
//
//   f16  : IEEE binary16.                     f32 -> f16 rounds to nearest even, overflow -> inf.
//   bf16 : the upper half of an IEEE binary32. f32 -> bf16 rounds to nearest even; NaN stays NaN.
//   fp8  : OCP e4m3 "fn" (bias 7, no inf, NaN = 0x7f/0xff, max 448). f32 -> fp8 rounds to nearest
//          even and saturates to +-448 (the engines' SATFINITE convention); NaN -> 0x7f.
//
// An fp8 engine buffer holds x / scale (vLLM's k_scale / v_scale); load_f32 multiplies the scale
// back, store_f32 divides by it. For every other dtype the scale is ignored.
#pragma once

#include <kdn/kernels/hd.h>

#include <cstdint>

namespace kdn::kernels {

enum class DType : uint32_t {
  kF16 = 1,      // KDN_DTYPE_F16
  kBF16 = 2,     // KDN_DTYPE_BF16
  kF32 = 3,      // KDN_DTYPE_F32
  kFP8E4M3 = 4,  // KDN_DTYPE_FP8_E4M3
};

KDN_HD_INLINE bool dtype_valid(uint32_t raw) { return raw >= 1 && raw <= 4; }

// Bytes per element (0 for an invalid value).
KDN_HD_INLINE uint32_t dtype_size(DType t) {
  switch (t) {
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kF32:
      return 4;
    case DType::kFP8E4M3:
      return 1;
  }
  return 0;
}

// ---- binary16 -------------------------------------------------------------------------------

KDN_HD_INLINE float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    // Zero or subnormal: man * 2^-24 is exact in binary32.
    const float mag = static_cast<float>(man) * 5.9604644775390625e-8f;
    return bits_as<float>(sign | bits_as<uint32_t>(mag));
  }
  if (exp == 31) {
    // NaNs come out quiet, as the F16C and CUDA converters produce them.
    return bits_as<float>(sign | 0x7f800000u | (man ? 0x400000u : 0u) | (man << 13));
  }
  return bits_as<float>(sign | ((exp + 112u) << 23) | (man << 13));
}

// Rounds `value >> shift` to nearest even (1 <= shift <= 31).
KDN_HD_INLINE uint32_t shift_round_even(uint32_t value, uint32_t shift) {
  const uint32_t kept = value >> shift;
  const uint32_t rest = value & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  return kept + ((rest > half || (rest == half && (kept & 1u))) ? 1u : 0u);
}

KDN_HD_INLINE uint16_t f32_to_f16(float f) {
  const uint32_t x = bits_as<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 (or inf)
  if (ax >= 0x38800000u) {                                              // normal binary16
    return static_cast<uint16_t>(sign | shift_round_even(ax - 0x38000000u, 13));
  }
  if (ax <= 0x33000000u) return static_cast<uint16_t>(sign);  // <= 2^-25 rounds to zero
  const uint32_t exp = ax >> 23;                              // 102..112
  const uint32_t man = (ax & 0x7fffffu) | 0x800000u;
  return static_cast<uint16_t>(sign | shift_round_even(man, 126u - exp));
}

// ---- bfloat16 -------------------------------------------------------------------------------

KDN_HD_INLINE float bf16_to_f32(uint16_t b) { return bits_as<float>(static_cast<uint32_t>(b) << 16); }

KDN_HD_INLINE uint16_t f32_to_bf16(float f) {
  const uint32_t x = bits_as<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// ---- fp8 e4m3fn -----------------------------------------------------------------------------

KDN_HD_INLINE float fp8e4m3_to_f32(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t exp = (b >> 3) & 0xfu;
  const uint32_t man = b & 0x7u;
  if (exp == 15 && man == 7) return bits_as<float>(sign | 0x7fc00000u);
  if (exp == 0) {
    const float mag = static_cast<float>(man) * 0.001953125f;  // man * 2^-9, exact
    return bits_as<float>(sign | bits_as<uint32_t>(mag));
  }
  return bits_as<float>(sign | ((exp + 120u) << 23) | (man << 20));
}

KDN_HD_INLINE uint8_t f32_to_fp8e4m3(float f) {
  const uint32_t x = bits_as<uint32_t>(f);
  const uint32_t sign = (x >> 24) & 0x80u;
  uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return 0x7fu;
  if (ax > 0x43e00000u) ax = 0x43e00000u;  // saturate to 448
  if (ax >= 0x3c800000u) {                 // >= 2^-6: normal e4m3
    return static_cast<uint8_t>(sign | shift_round_even(ax - 0x3c000000u, 20));
  }
  if (ax <= 0x3a800000u) return static_cast<uint8_t>(sign);  // <= 2^-10 rounds to zero
  const uint32_t exp = ax >> 23;                             // 117..120
  const uint32_t man = (ax & 0x7fffffu) | 0x800000u;
  return static_cast<uint8_t>(sign | shift_round_even(man, 141u - exp));
}

// ---- typed element access -------------------------------------------------------------------

// Element `idx` of a buffer of dtype `t`, as f32. `scale` applies to fp8 only.
KDN_HD_INLINE float load_f32(const void* base, int64_t idx, DType t, float scale) {
  switch (t) {
    case DType::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(base)[idx]);
    case DType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(base)[idx]);
    case DType::kF32:
      return static_cast<const float*>(base)[idx];
    case DType::kFP8E4M3:
      return fmul_rn(fp8e4m3_to_f32(static_cast<const uint8_t*>(base)[idx]), scale);
  }
  return 0.0f;
}

// Stores `v` into element `idx` with one rounding to dtype `t`. `scale` applies to fp8 only.
KDN_HD_INLINE void store_f32(void* base, int64_t idx, DType t, float v, float scale) {
  switch (t) {
    case DType::kF16:
      static_cast<uint16_t*>(base)[idx] = f32_to_f16(v);
      return;
    case DType::kBF16:
      static_cast<uint16_t*>(base)[idx] = f32_to_bf16(v);
      return;
    case DType::kF32:
      static_cast<float*>(base)[idx] = v;
      return;
    case DType::kFP8E4M3:
      static_cast<uint8_t*>(base)[idx] = f32_to_fp8e4m3(fdiv_rn(v, scale));
      return;
  }
}

}  // namespace kdn::kernels
