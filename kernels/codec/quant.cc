#include "quant.h"

#include <atomic>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace kdn::kernels::kvc1 {
namespace {

// Relaxed: a test switch read once per row call; no data is published through it.
std::atomic<bool> g_simd_enabled{true};

void store_value(void* out, uint32_t d, DType t, float v) { store_f32(out, d, t, v, 1.0f); }

#if defined(__x86_64__)
#define KDN_TARGET_DEQ __attribute__((target("avx2,fma,f16c")))

// F16C by CPUID (leaf 1, ECX bit 29): not every compiler's __builtin_cpu_supports knows it.
bool cpu_has_f16c_bit() {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}

bool cpu_has_deq_simd() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c_bit();
  return has;
}

KDN_TARGET_DEQ inline __m256 load8_scales(const uint8_t* p, uint8_t scale_dtype) {
  if (scale_dtype == kScaleF16) return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
}

// Eight f32 values to the output dtype with one round-to-nearest-even each. bf16 uses the same
// integer rounding as f32_to_bf16 (inputs are finite here: scales were validated).
KDN_TARGET_DEQ inline void store8(__m256 v, DType t, uint8_t* out) {
  if (t == DType::kF16) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  } else if (t == DType::kF32) {
    _mm256_storeu_ps(reinterpret_cast<float*>(out), v);
  } else {
    const __m256i x = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb), 16);
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), packed);
  }
}

KDN_TARGET_DEQ inline __m256 dequantize8(const uint8_t* q, __m256 s, __m256 z) {
  const __m256 qf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q))));
  return _mm256_fmadd_ps(qf, s, z);
}

// Handles n % 8 == 0 with per == 1 or per % 8 == 0; returns false for other shapes.
KDN_TARGET_DEQ bool dequantize_row_avx2(const uint8_t* q, uint32_t n, const uint8_t* s, const uint8_t* z,
                                        uint8_t scale_dtype, uint32_t per, DType out_type, void* out) {
  if (n % 8 != 0 || (per != 1 && per % 8 != 0)) return false;
  const uint32_t sb = scale_bytes(scale_dtype);
  const uint32_t ob = dtype_size(out_type);
  auto* o = static_cast<uint8_t*>(out);
  if (per == 1) {  // per-channel scales: a vector of scales per 8 channels
    for (uint32_t d = 0; d < n; d += 8) {
      const __m256 sv = load8_scales(s + size_t{d} * sb, scale_dtype);
      const __m256 zv = load8_scales(z + size_t{d} * sb, scale_dtype);
      store8(dequantize8(q + d, sv, zv), out_type, o + size_t{d} * ob);
    }
    return true;
  }
  for (uint32_t g = 0; g < n / per; ++g) {  // one scale per group of `per` channels
    const __m256 sv = _mm256_set1_ps(load_scale(s, g, scale_dtype));
    const __m256 zv = _mm256_set1_ps(load_scale(z, g, scale_dtype));
    for (uint32_t d = g * per; d < (g + 1) * per; d += 8)
      store8(dequantize8(q + d, sv, zv), out_type, o + size_t{d} * ob);
  }
  return true;
}
// quantize_value for 8 lanes: (x - z) / s, rounded to nearest even, clamped to [0, qmax];
// lanes with s <= 0 give 0 (as the scalar body, which also maps v <= 0 and NaN to 0).
KDN_TARGET_DEQ uint32_t quantize_row_avx2(const float* x, const float* s, const float* z, uint32_t n, uint32_t qmax,
                                          uint8_t* q) {
  const __m256 zero = _mm256_setzero_ps(), top = _mm256_set1_ps(static_cast<float>(qmax));
  uint32_t d = 0;
  for (; d + 8 <= n; d += 8) {
    const __m256 sv = _mm256_loadu_ps(s + d);
    const __m256 v = _mm256_div_ps(_mm256_sub_ps(_mm256_loadu_ps(x + d), _mm256_loadu_ps(z + d)), sv);
    __m256 r =
        _mm256_min_ps(_mm256_max_ps(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), zero), top);
    r = _mm256_and_ps(r, _mm256_cmp_ps(sv, zero, _CMP_GT_OQ));
    const __m256i i = _mm256_cvtps_epi32(r);
    const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(q + d), _mm_packus_epi16(w, w));
  }
  return d;
}

// quantize_value with one S and Z per group of `group` channels (a multiple of 8).
KDN_TARGET_DEQ void quantize_row_grouped_avx2(const float* x, const float* s, const float* z, uint32_t group,
                                              uint32_t n, uint32_t qmax, uint8_t* q) {
  const __m256 zero = _mm256_setzero_ps(), top = _mm256_set1_ps(static_cast<float>(qmax));
  for (uint32_t g = 0; g < n / group; ++g) {
    const __m256 sv = _mm256_set1_ps(s[g]), zv = _mm256_set1_ps(z[g]);
    const __m256 live = _mm256_cmp_ps(sv, zero, _CMP_GT_OQ);
    for (uint32_t d = g * group; d < (g + 1) * group; d += 8) {
      const __m256 v = _mm256_div_ps(_mm256_sub_ps(_mm256_loadu_ps(x + d), zv), sv);
      __m256 r =
          _mm256_min_ps(_mm256_max_ps(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), zero), top);
      r = _mm256_and_ps(r, live);
      const __m256i i = _mm256_cvtps_epi32(r);
      const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(q + d), _mm_packus_epi16(w, w));
    }
  }
}
#endif

#if defined(__x86_64__)
// Stage `len` < 8 inside one vector of 8: p holds each lane's partner x[i ^ len]; lanes with
// i & len == 0 take x + p (= x[i] + x[i + len]), the others p - x (= x[i - len] - x[i]), the
// same two IEEE operations as hadamard_butterfly.
KDN_TARGET_DEQ inline __m256 hadamard_in_vector(__m256 x) {
  __m256 p = _mm256_permute_ps(x, 0xB1);  // i ^ 1
  x = _mm256_blend_ps(_mm256_add_ps(x, p), _mm256_sub_ps(p, x), 0xAA);
  p = _mm256_permute_ps(x, 0x4E);  // i ^ 2
  x = _mm256_blend_ps(_mm256_add_ps(x, p), _mm256_sub_ps(p, x), 0xCC);
  p = _mm256_permute2f128_ps(x, x, 1);  // i ^ 4
  return _mm256_blend_ps(_mm256_add_ps(x, p), _mm256_sub_ps(p, x), 0xF0);
}

KDN_TARGET_DEQ void hadamard_row_avx2(float* x, uint32_t n, float scale) {
  for (uint32_t i = 0; i < n; i += 8) _mm256_storeu_ps(x + i, hadamard_in_vector(_mm256_loadu_ps(x + i)));
  for (uint32_t len = 8; len < n; len *= 2)
    for (uint32_t i0 = 0; i0 < n; i0 += 2 * len)
      for (uint32_t i = i0; i < i0 + len; i += 8) {
        const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + len);
        _mm256_storeu_ps(x + i, _mm256_add_ps(a, b));
        _mm256_storeu_ps(x + i + len, _mm256_sub_ps(a, b));
      }
  if (scale != 1.0f) {
    const __m256 s = _mm256_set1_ps(scale);
    for (uint32_t i = 0; i < n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), s));
  }
}
#endif

}  // namespace

void hadamard_row(float* x, uint32_t n, float scale) noexcept {
#if defined(__x86_64__)
  if (n >= 8 && g_simd_enabled.load(std::memory_order_relaxed) && cpu_has_deq_simd()) {
    hadamard_row_avx2(x, n, scale);
    return;
  }
#endif
  hadamard_inplace(x, n);
  if (scale != 1.0f)
    for (uint32_t i = 0; i < n; ++i) x[i] = fmul_rn(x[i], scale);
}

void quantize_row(const float* x, const float* s, const float* z, uint32_t n, uint32_t qmax, uint8_t* q) noexcept {
  uint32_t d = 0;
#if defined(__x86_64__)
  if (g_simd_enabled.load(std::memory_order_relaxed) && cpu_has_deq_simd()) d = quantize_row_avx2(x, s, z, n, qmax, q);
#endif
  for (; d < n; ++d) q[d] = static_cast<uint8_t>(quantize_value(x[d], s[d], z[d], qmax));
}

void quantize_row_grouped(const float* x, const float* s, const float* z, uint32_t group, uint32_t n, uint32_t qmax,
                          uint8_t* q) noexcept {
#if defined(__x86_64__)
  if (group % 8 == 0 && g_simd_enabled.load(std::memory_order_relaxed) && cpu_has_deq_simd())
    return quantize_row_grouped_avx2(x, s, z, group, n, qmax, q);
#endif
  for (uint32_t d = 0; d < n; ++d) q[d] = static_cast<uint8_t>(quantize_value(x[d], s[d / group], z[d / group], qmax));
}

uint16_t f16_round_down(float v) noexcept { return f16_round_down_body(v); }

uint16_t f16_round_up(float v) noexcept { return f16_round_up_body(v); }

bool stored_group_scale(float mn, float mx, uint32_t bits, uint8_t scale_dtype, GroupScale* out) noexcept {
  return group_scale_body(mn, mx, bits, scale_dtype, out);
}

void dequantize_row_scalar(const uint8_t* q, uint32_t n, const uint8_t* s, const uint8_t* z, uint8_t scale_dtype,
                           uint32_t per, DType out_type, void* out) noexcept {
  for (uint32_t d = 0; d < n; ++d) {
    const uint32_t g = d / per;
    store_value(out, d, out_type, dequantize_value(q[d], load_scale(s, g, scale_dtype), load_scale(z, g, scale_dtype)));
  }
}

void dequantize_row(const uint8_t* q, uint32_t n, const uint8_t* s, const uint8_t* z, uint8_t scale_dtype, uint32_t per,
                    DType out_type, void* out) noexcept {
#if defined(__x86_64__)
  if (g_simd_enabled.load(std::memory_order_relaxed) && cpu_has_deq_simd() &&
      dequantize_row_avx2(q, n, s, z, scale_dtype, per, out_type, out))
    return;
#endif
  dequantize_row_scalar(q, n, s, z, scale_dtype, per, out_type, out);
}

bool set_dequantize_simd_enabled(bool enabled) noexcept {
  return g_simd_enabled.exchange(enabled, std::memory_order_relaxed);
}

}  // namespace kdn::kernels::kvc1
