// AVX2 rANS encoder: the 32 lanes as four 8-lane vectors, producing exactly the words and
// states of the scalar definition (rans.cc, encode_block).
//
// The encoder walks the steps from last to first and, inside a step, the lanes from 31 down
// to 0, pushing renormalization words onto a stack that grows toward lower addresses. Lanes
// only share that stack, so a step runs as vectors 3, 2, 1, 0 (lanes 24..31 first): each
// vector renormalizes its needy lanes at once and pushes their words in ascending lane order
// below the previous vector's, which is the order the scalar loop leaves in memory.
//
// The division x / freq is exact in double precision: with r the double just above 1/freq,
// floor(x * r) = floor(x / freq) for every x < 2^32 (the product exceeds x / freq by less than
// 2^-19 / freq, while a non-integer x / freq sits at least 1 / freq below the next integer),
// so the vector loop needs no integer division.
//
// Compiled for AVX2 through function attributes only; rans.cc calls in after a runtime check.
#include "rans.h"

#include <cmath>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kdn::kernels::rans {

#if defined(__x86_64__)

namespace {

#define KDN_TARGET_AVX2 __attribute__((target("avx2,popcnt")))

// kPack[m]: a permutation of 8 lanes that moves the lanes of mask m, in ascending order, to
// the top popcount(m) positions (the other positions are don't-care).
struct PackTable {
  alignas(32) uint32_t idx[256][8];
};

constexpr PackTable make_pack_table() {
  PackTable t{};
  for (uint32_t m = 0; m < 256; ++m) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < 8; ++i) n += (m >> i) & 1u;
    uint32_t pos = 8 - n;
    for (uint32_t i = 0; i < 8; ++i)
      if ((m >> i) & 1u) t.idx[m][pos++] = i;
  }
  return t;
}

constexpr PackTable kPack = make_pack_table();

struct Lanes {
  __m256i x[4];
};

// floor(x / f) of 8 lanes from their double reciprocals (rounded up).
KDN_TARGET_AVX2 inline __m256i divide(__m256i x, __m256i sym, const double* rcp) {
  // u32 -> f64 exactly: bias into the signed range, convert, unbias.
  const __m256i biased = _mm256_xor_si256(x, _mm256_set1_epi32(INT32_MIN));
  const __m256d two31 = _mm256_set1_pd(2147483648.0);
  const __m256d lo = _mm256_add_pd(_mm256_cvtepi32_pd(_mm256_castsi256_si128(biased)), two31);
  const __m256d hi = _mm256_add_pd(_mm256_cvtepi32_pd(_mm256_extracti128_si256(biased, 1)), two31);
  const __m256d rlo = _mm256_i32gather_pd(rcp, _mm256_castsi256_si128(sym), 8);
  const __m256d rhi = _mm256_i32gather_pd(rcp, _mm256_extracti128_si256(sym, 1), 8);
  const __m128i qlo = _mm256_cvttpd_epi32(_mm256_mul_pd(lo, rlo));
  const __m128i qhi = _mm256_cvttpd_epi32(_mm256_mul_pd(hi, rhi));
  return _mm256_inserti128_si256(_mm256_castsi128_si256(qlo), qhi, 1);
}

// Encodes the 8 symbols of one vector into x; pushes the needy lanes' words below *top.
// False if a symbol has frequency 0 (absent from the table).
KDN_TARGET_AVX2 inline bool encode_vector(__m256i& x, const uint8_t* sym8, const EncodeTable& t, uint16_t* stack,
                                          uint32_t* top) {
  const __m256i sym = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sym8)));
  const __m256i fc = _mm256_i32gather_epi32(reinterpret_cast<const int*>(t.fc), sym, 4);
  const __m256i freq = _mm256_and_si256(fc, _mm256_set1_epi32(0xffff));
  if (_mm256_movemask_epi8(_mm256_cmpeq_epi32(freq, _mm256_setzero_si256())) != 0) return false;
  // Needy: x >= freq << 20 as u64, i.e. x > (freq << 20) - 1 as u32 (freq 4096: never).
  const __m256i sign = _mm256_set1_epi32(INT32_MIN);
  const __m256i limit = _mm256_sub_epi32(_mm256_slli_epi32(freq, 32 - kProbBits), _mm256_set1_epi32(1));
  const __m256i needy = _mm256_cmpgt_epi32(_mm256_xor_si256(x, sign), _mm256_xor_si256(limit, sign));
  const uint32_t m = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(needy)));
  if (m) {
    const __m256i idx = _mm256_load_si256(reinterpret_cast<const __m256i*>(kPack.idx[m]));
    const __m256i w = _mm256_permutevar8x32_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0xffff)), idx);
    const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(w, w), 0x08);
    // The top popcount(m) words are the pushed ones; the rest land below the new top,
    // where nothing lives yet.
    _mm_storeu_si128(reinterpret_cast<__m128i*>(stack + *top - 8), _mm256_castsi256_si128(p));
    *top -= static_cast<uint32_t>(__builtin_popcount(m));
    x = _mm256_blendv_epi8(x, _mm256_srli_epi32(x, 16), needy);
  }
  // x' = (x / f) * 4096 + x % f + cum = x + (x / f) * (4096 - f) + cum.
  const __m256i q = divide(x, sym, t.rcp);
  const __m256i cum = _mm256_srli_epi32(fc, 16);
  x = _mm256_add_epi32(_mm256_add_epi32(x, cum),
                       _mm256_mullo_epi32(q, _mm256_sub_epi32(_mm256_set1_epi32(kProbScale), freq)));
  return true;
}

}  // namespace

KDN_TARGET_AVX2 uint32_t encode_steps_avx2(const uint8_t* sym, uint32_t steps, const EncodeTable& t, uint32_t* x,
                                           uint16_t* stack, uint32_t* top) noexcept {
  Lanes l;
  for (uint32_t v = 0; v < 4; ++v) l.x[v] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 8 * v));
  uint32_t s = steps;
  // A step pushes at most 32 words, and a vector's store reaches 8 words below the top.
  for (; s > 0 && *top >= kLanes; --s) {
    const uint8_t* step = sym + size_t{s - 1} * kLanes;
    uint32_t tp = *top;
    __m256i x3 = l.x[3], x2 = l.x[2], x1 = l.x[1], x0 = l.x[0];
    if (!encode_vector(x3, step + 24, t, stack, &tp) || !encode_vector(x2, step + 16, t, stack, &tp) ||
        !encode_vector(x1, step + 8, t, stack, &tp) || !encode_vector(x0, step, t, stack, &tp))
      break;  // the scalar loop redoes this step and reports the absent symbol
    l.x[3] = x3, l.x[2] = x2, l.x[1] = x1, l.x[0] = x0;
    *top = tp;
  }
  for (uint32_t v = 0; v < 4; ++v) _mm256_storeu_si256(reinterpret_cast<__m256i*>(x + 8 * v), l.x[v]);
  return steps - s;
}

#else

uint32_t encode_steps_avx2(const uint8_t*, uint32_t, const EncodeTable&, uint32_t*, uint16_t*, uint32_t*) noexcept {
  return 0;
}

#endif

}  // namespace kdn::kernels::rans
