// The rope_scatter hot path on AVX2 + F16C CPUs: one pass per head that loads f16/bf16 pairs,
// rotates them in fp32 and stores the result, instead of convert / rotate / convert passes over
// a staging buffer. Same operations as the element bodies (f16/bf16 -> f32 exact; x*c - y*s
// and y*c + x*s with each product and sum rounded once, no FMA; round to nearest even on
// store), so the bytes are identical; the tests compare them.
#include <kdn/kernels/dtype.h>

#include <cstring>

#include "rope_fast.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace kdn::kernels::detail {

#if defined(__x86_64__)
namespace {

bool detect_avx2_f16c() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  const bool f16c = c & (1u << 29), avx = c & (1u << 28), osxsave = c & (1u << 27);
  if (!(f16c && avx && osxsave)) return false;
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & 6u) != 6u) return false;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return b & (1u << 5);  // AVX2
}

const bool g_fast = detect_avx2_f16c();

#define KDN_AVX2 __attribute__((target("avx2,f16c")))

KDN_AVX2 inline __m256 load8(const uint16_t* p, DType t) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if (t == DType::kF16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// f32 -> bf16 with round to nearest even; NaN -> quiet NaN (as f32_to_bf16).
KDN_AVX2 inline __m128i to_bf16(__m256 v) {
  const __m256i x = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
  const __m256i is_nan =
      _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  const __m256i r = _mm256_blendv_epi8(rounded, quiet, is_nan);
  const __m256i packed = _mm256_packus_epi32(r, r);  // every value is in [0, 0xffff]
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

KDN_AVX2 inline void store8(uint16_t* p, __m256 v, DType t, bool stream) {
  const __m128i h = t == DType::kF16 ? _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT) : to_bf16(v);
  if (stream) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(p), h);
  } else {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), h);
  }
}

KDN_AVX2 void rope_neox_head(const uint16_t* src, uint16_t* dst, DType t, uint32_t half, const float* cs, bool stream) {
  const float* sn = cs + half;
  for (uint32_t i = 0; i < half; i += 8) {
    const __m256 x = load8(src + i, t), y = load8(src + half + i, t);
    const __m256 c = _mm256_loadu_ps(cs + i), s = _mm256_loadu_ps(sn + i);
    store8(dst + i, _mm256_sub_ps(_mm256_mul_ps(x, c), _mm256_mul_ps(y, s)), t, stream);
    store8(dst + half + i, _mm256_add_ps(_mm256_mul_ps(y, c), _mm256_mul_ps(x, s)), t, stream);
  }
}

}  // namespace

bool rope_neox_fast_available() noexcept { return g_fast; }

bool rope_neox_head_fast(const void* src, void* dst, DType dtype, uint32_t head_dim, uint32_t rotary_dim,
                         const float* cos_sin, bool stream) noexcept {
  if (!g_fast || (dtype != DType::kF16 && dtype != DType::kBF16) || rotary_dim % 16 != 0) return false;
  const auto* s = static_cast<const uint16_t*>(src);
  auto* d = static_cast<uint16_t*>(dst);
  const bool aligned = (reinterpret_cast<uintptr_t>(d) & 15) == 0;
  rope_neox_head(s, d, dtype, rotary_dim / 2, cos_sin, stream && aligned);
  if (rotary_dim < head_dim) memcpy(d + rotary_dim, s + rotary_dim, size_t{head_dim - rotary_dim} * 2);
  return true;
}

#else
bool rope_neox_fast_available() noexcept { return false; }
bool rope_neox_head_fast(const void*, void*, DType, uint32_t, uint32_t, const float*, bool) noexcept { return false; }
#endif

}  // namespace kdn::kernels::detail
