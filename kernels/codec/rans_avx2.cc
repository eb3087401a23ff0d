// AVX2 rANS decoder: the 32 lanes as four 8-lane vectors.
//
// One step decodes 32 symbols. The four vectors decode independently; only the shared word
// pointer couples them, so the renormalization runs after all four decodes: each vector's
// needy mask (state < 2^16) gives a popcount, a scalar prefix sum gives each vector's first
// word, and a permutation table routes words p, p+1, ... to the needy lanes in ascending lane
// order — the order of the scalar definition. Symbol lookup is compare-count for tables of up
// to 16 entries (bits <= 4) and a slot->symbol byte table read by gathers for wider alphabets.
//
// Compiled for AVX2 through function attributes only, so the rest of the library stays
// baseline x86-64; rans.cc calls in only after a runtime CPU check.
#include "rans.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kdn::kernels::rans {

#if defined(__x86_64__)

namespace {

#define KDN_TARGET_AVX2 __attribute__((target("avx2,popcnt")))

// kRoute[m][i]: for a needy mask m over 8 lanes, which of the 8 loaded words lane i takes
// (its rank among the needy lanes). Entries of lanes outside m are unused.
struct RouteTable {
  alignas(32) uint32_t idx[256][8];
};

constexpr RouteTable make_route_table() {
  RouteTable t{};
  for (uint32_t m = 0; m < 256; ++m) {
    uint32_t rank = 0;
    for (uint32_t i = 0; i < 8; ++i) t.idx[m][i] = (m >> i) & 1u ? rank++ : 0;
  }
  return t;
}

constexpr RouteTable kRoute = make_route_table();

// Symbols of 8 lanes by compare-count over (1 << kBits) - 1 thresholds, summed as a tree so the
// latency is logarithmic in the alphabet size.
template <uint32_t kBits>
KDN_TARGET_AVX2 inline __m256i count_symbols(__m256i slot, const __m256i* thr) {
  constexpr uint32_t kThr = (1u << kBits) - 1;
  __m256i c[16];
#pragma GCC unroll 16
  for (uint32_t k = 0; k < kThr; ++k) c[k] = _mm256_cmpgt_epi32(slot, thr[k]);
  c[kThr] = _mm256_setzero_si256();
#pragma GCC unroll 4
  for (uint32_t w = 1; w < kThr + 1; w *= 2)
#pragma GCC unroll 8
    for (uint32_t k = 0; k + w < kThr + 1; k += 2 * w) c[k] = _mm256_add_epi32(c[k], c[k + w]);
  return _mm256_sub_epi32(_mm256_setzero_si256(), c[0]);  // each true compare is -1
}

struct Tables {
  __m256i thr[15];
  __m256i fc_lo, fc_hi;
};

// Symbols and packed freq|cum<<16 for 8 lanes.
template <uint32_t kBits>
KDN_TARGET_AVX2 inline __m256i lookup(const Tables& tb, const DecodeTable& t, __m256i slot, __m256i* fc) {
  if constexpr (kBits == 0) {
    const __m256i y =
        _mm256_and_si256(_mm256_i32gather_epi32(reinterpret_cast<const int*>(t.lut), slot, 1), _mm256_set1_epi32(0xff));
    *fc = _mm256_i32gather_epi32(reinterpret_cast<const int*>(t.fc), y, 4);
    return y;
  } else {
    const __m256i y = count_symbols<kBits>(slot, tb.thr);
    if constexpr (kBits <= 3) {
      *fc = _mm256_permutevar8x32_epi32(tb.fc_lo, y);
    } else {
      const __m256i hi = _mm256_cmpgt_epi32(y, _mm256_set1_epi32(7));
      *fc = _mm256_blendv_epi8(_mm256_permutevar8x32_epi32(tb.fc_lo, y), _mm256_permutevar8x32_epi32(tb.fc_hi, y), hi);
    }
    return y;
  }
}

template <uint32_t kBits>
KDN_TARGET_AVX2 uint32_t steps(BlockDecoder& d, const DecodeTable& t, uint8_t* out, uint32_t count) {
  Tables tb;
#pragma GCC unroll 15
  for (uint32_t k = 0; k < 15; ++k) tb.thr[k] = _mm256_set1_epi32(t.cum_minus1[k + 1]);
  tb.fc_lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.fc));
  tb.fc_hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.fc + 8));
  const __m256i mask12 = _mm256_set1_epi32(kProbScale - 1);
  const __m256i mask16 = _mm256_set1_epi32(0xffff);
  const __m256i zero = _mm256_setzero_si256();
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  __m256i x[4], y[4], needy[4];
#pragma GCC unroll 4
  for (uint32_t g = 0; g < 4; ++g) x[g] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(d.x + 8 * g));
  uint32_t p = d.p;
  uint32_t done = 0;
  // At most 32 words per step, so 32 remaining words make every 16-byte load below in bounds.
  while (count - done >= kLanes && d.n_words - p >= kLanes) {
#pragma GCC unroll 4
    for (uint32_t g = 0; g < 4; ++g) {
      const __m256i slot = _mm256_and_si256(x[g], mask12);
      __m256i fc;
      y[g] = lookup<kBits>(tb, t, slot, &fc);
      const __m256i freq = _mm256_and_si256(fc, mask16);
      const __m256i bias = _mm256_sub_epi32(slot, _mm256_srli_epi32(fc, 16));
      x[g] = _mm256_add_epi32(_mm256_mullo_epi32(freq, _mm256_srli_epi32(x[g], kProbBits)), bias);
      needy[g] = _mm256_cmpeq_epi32(_mm256_srli_epi32(x[g], 16), zero);
    }
#pragma GCC unroll 4
    for (uint32_t g = 0; g < 4; ++g) {
      const uint32_t m = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(needy[g])));
      const __m256i words = _mm256_cvtepu16_epi32(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(d.words + 2 * static_cast<size_t>(p))));
      const __m256i route = _mm256_load_si256(reinterpret_cast<const __m256i*>(kRoute.idx[m]));
      const __m256i refill = _mm256_or_si256(_mm256_slli_epi32(x[g], 16), _mm256_permutevar8x32_epi32(words, route));
      x[g] = _mm256_blendv_epi8(x[g], refill, needy[g]);
      p += static_cast<uint32_t>(__builtin_popcount(m));
    }
    const __m256i lo = _mm256_packus_epi32(y[0], y[1]);
    const __m256i hi = _mm256_packus_epi32(y[2], y[3]);
    const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(lo, hi), order);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + done), bytes);
    done += kLanes;
  }
#pragma GCC unroll 4
  for (uint32_t g = 0; g < 4; ++g) _mm256_storeu_si256(reinterpret_cast<__m256i*>(d.x + 8 * g), x[g]);
  d.p = p;
  d.next += done;
  return done;
}

}  // namespace

bool cpu_has_avx2() noexcept {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt");
  return has;
}

uint32_t decode_steps_avx2(BlockDecoder& d, const DecodeTable& t, uint8_t* out, uint32_t count) noexcept {
  if (d.next % kLanes != 0) return 0;
  switch (t.bits) {
    case 1:
      return steps<1>(d, t, out, count);
    case 2:
      return steps<2>(d, t, out, count);
    case 3:
      return steps<3>(d, t, out, count);
    case 4:
      return steps<4>(d, t, out, count);
    default:
      return steps<0>(d, t, out, count);
  }
}

#else  // not x86-64: the scalar decoder only

bool cpu_has_avx2() noexcept { return false; }
uint32_t decode_steps_avx2(BlockDecoder&, const DecodeTable&, uint8_t*, uint32_t) noexcept { return 0; }

#endif

}  // namespace kdn::kernels::rans
