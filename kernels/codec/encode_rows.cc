// The encoder's row loops (finiteness, group ranges) with AVX2 when the CPU has it. Each
// vector path returns what the scalar loop beside it returns, bit for bit: ranges keep the
// first of equal extremes (so a range ending at zero keeps that zero's sign), as the
// scalar loop that only replaces on a strict comparison does.
#include "encode_rows.h"

#include <kdn/kernels/dtype.h>

#include <cmath>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kdn::kernels::kvc1 {
namespace {

bool special(float v) { return (bits_as<uint32_t>(v) & 0x7f800000u) == 0x7f800000u; }

bool finite_scalar(const float* x, uint32_t n) {
  uint32_t any = 0;
  for (uint32_t d = 0; d < n; ++d) any |= special(x[d]);
  return any == 0;
}

void accumulate_scalar(const float* x, uint32_t n, float* lo, float* hi) {
  for (uint32_t d = 0; d < n; ++d) {
    lo[d] = x[d] < lo[d] ? x[d] : lo[d];
    hi[d] = x[d] > hi[d] ? x[d] : hi[d];
  }
}

void range_scalar(const float* x, uint32_t n, float* lo, float* hi) {
  float l = INFINITY, h = -INFINITY;
  for (uint32_t d = 0; d < n; ++d) {
    l = x[d] < l ? x[d] : l;
    h = x[d] > h ? x[d] : h;
  }
  *lo = l;
  *hi = h;
}

#if defined(__x86_64__)
#define KDN_TARGET_ROWS __attribute__((target("avx2")))

bool cpu_has_avx2_rows() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

KDN_TARGET_ROWS bool finite_avx2(const float* x, uint32_t n) {
  const __m256i exp = _mm256_set1_epi32(0x7f800000);
  __m256i any = _mm256_setzero_si256();
  uint32_t d = 0;
  for (; d + 8 <= n; d += 8) {
    const __m256i v = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + d)), exp);
    any = _mm256_or_si256(any, _mm256_cmpeq_epi32(v, exp));
  }
  return _mm256_testz_si256(any, any) && finite_scalar(x + d, n - d);
}

// min_ps(a, b) is a < b ? a : b and max_ps(a, b) a > b ? a : b: the scalar rule, lane by lane.
KDN_TARGET_ROWS void accumulate_avx2(const float* x, uint32_t n, float* lo, float* hi) {
  uint32_t d = 0;
  for (; d + 8 <= n; d += 8) {
    const __m256 v = _mm256_loadu_ps(x + d);
    _mm256_storeu_ps(lo + d, _mm256_min_ps(v, _mm256_loadu_ps(lo + d)));
    _mm256_storeu_ps(hi + d, _mm256_max_ps(v, _mm256_loadu_ps(hi + d)));
  }
  accumulate_scalar(x + d, n - d, lo + d, hi + d);
}

// Lane-wise extremes, then across the lanes: the same values as the row-order scalar loop,
// and the same bits unless an extreme is zero (+0 and -0 compare equal), which the scalar
// loop then settles.
KDN_TARGET_ROWS void range_avx2(const float* x, uint32_t n, float* lo, float* hi) {
  __m256 l = _mm256_set1_ps(INFINITY), h = _mm256_set1_ps(-INFINITY);
  for (uint32_t d = 0; d < n; d += 8) {
    const __m256 v = _mm256_loadu_ps(x + d);
    l = _mm256_min_ps(v, l);
    h = _mm256_max_ps(v, h);
  }
  alignas(32) float ls[8], hs[8];
  _mm256_store_ps(ls, l);
  _mm256_store_ps(hs, h);
  float unused;
  range_scalar(ls, 8, lo, &unused);
  range_scalar(hs, 8, &unused, hi);
  if (*lo == 0.0f || *hi == 0.0f) range_scalar(x, n, lo, hi);
}
#endif

}  // namespace

bool row_finite(const float* x, uint32_t n) noexcept {
#if defined(__x86_64__)
  if (cpu_has_avx2_rows()) return finite_avx2(x, n);
#endif
  return finite_scalar(x, n);
}

void accumulate_range(const float* x, uint32_t n, float* lo, float* hi) noexcept {
#if defined(__x86_64__)
  if (cpu_has_avx2_rows()) return accumulate_avx2(x, n, lo, hi);
#endif
  accumulate_scalar(x, n, lo, hi);
}

void group_range(const float* x, uint32_t n, float* lo, float* hi) noexcept {
#if defined(__x86_64__)
  if (n % 8 == 0 && cpu_has_avx2_rows()) return range_avx2(x, n, lo, hi);
#endif
  range_scalar(x, n, lo, hi);
}

}  // namespace kdn::kernels::kvc1
