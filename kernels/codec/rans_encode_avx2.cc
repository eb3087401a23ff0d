// AVX2 rANS encoder: the 32 lanes as four 8-lane vectors, producing exactly the words and
// states of the scalar definition (rans.cc, encode_block).
//
// The encoder walks the steps from last to first and, inside a step, the lanes from 31 down
// to 0, pushing renormalization words onto a stack that grows toward lower addresses. Lanes
// only share that stack, so a step runs as vectors 3, 2, 1, 0 (lanes 24..31 first): each
// vector renormalizes its needy lanes at once and pushes their words in ascending lane order
// below the previous vector's, which is the order the scalar loop leaves in memory.
//
// The vector loop has no integer division: after renormalization x < freq * 2^20, so
// q = x / freq < 2^20, and a single-precision quotient of x (converted with one rounding:
// relative error below 2^-23 all told) is within 0.125 of it, truncates to q - 1, q or q + 1, and one check
// of the remainder x - q * freq against [0, freq) makes it exact. Then
// x' = q * 4096 + remainder + cum, as the definition says.
//
// Tables of up to 16 symbols (kivi4 and narrower codes) are read with register permutes,
// wider ones with gathers.
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

// freq | cum << 16 of 8 symbols: permutes of a register-resident table of up to 16 entries,
// or a gather.
struct Lookup {
  __m256i lo, hi;  // fc[0..7], fc[8..15] (kSmall only)
  const uint32_t* fc;
};

template <bool kSmall>
KDN_TARGET_AVX2 inline __m256i lookup(const Lookup& t, __m256i sym) {
  if constexpr (kSmall) {
    const __m256i lo = _mm256_permutevar8x32_epi32(t.lo, sym);
    const __m256i hi = _mm256_permutevar8x32_epi32(t.hi, sym);
    return _mm256_blendv_epi8(lo, hi, _mm256_cmpgt_epi32(sym, _mm256_set1_epi32(7)));
  } else {
    return _mm256_i32gather_epi32(reinterpret_cast<const int*>(t.fc), sym, 4);
  }
}

// x' = (x / f) * 4096 + x % f + cum for 8 lanes with x < f * 2^20 (see the top of the file).
KDN_TARGET_AVX2 inline __m256i advance(__m256i x, __m256i f, __m256i cum) {
  // u32 -> f32 with one rounding: the high half times 2^16 is exact, the add rounds once.
  const __m256 hi = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(x, 16)), _mm256_set1_ps(65536.0f));
  const __m256 xf = _mm256_add_ps(hi, _mm256_cvtepi32_ps(_mm256_and_si256(x, _mm256_set1_epi32(0xffff))));
  __m256i q = _mm256_cvttps_epi32(_mm256_div_ps(xf, _mm256_cvtepi32_ps(f)));
  __m256i r = _mm256_sub_epi32(x, _mm256_mullo_epi32(q, f));          // in [-f, 2f): exact as signed
  const __m256i low = _mm256_cmpgt_epi32(_mm256_setzero_si256(), r);  // q one too large
  const __m256i high = _mm256_cmpgt_epi32(r, _mm256_sub_epi32(f, _mm256_set1_epi32(1)));  // one too small
  q = _mm256_add_epi32(_mm256_sub_epi32(q, high), low);                                   // true compares are -1
  r = _mm256_add_epi32(r, _mm256_and_si256(low, f));
  r = _mm256_sub_epi32(r, _mm256_and_si256(high, f));
  return _mm256_add_epi32(_mm256_add_epi32(_mm256_slli_epi32(q, kProbBits), r), cum);
}

// Encodes the 8 symbols of one vector into x; pushes the needy lanes' words below *top.
// False if a symbol has frequency 0 (absent from the table).
template <bool kSmall>
KDN_TARGET_AVX2 inline bool encode_vector(__m256i& x, const uint8_t* sym8, const Lookup& t, uint16_t* stack,
                                          uint32_t* top) {
  const __m256i sym = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sym8)));
  const __m256i fc = lookup<kSmall>(t, sym);
  const __m256i freq = _mm256_and_si256(fc, _mm256_set1_epi32(0xffff));
  if (_mm256_movemask_epi8(_mm256_cmpeq_epi32(freq, _mm256_setzero_si256())) != 0) return false;
  // Needy: x >= freq << 20 as u64, i.e. x > (freq << 20) - 1 as u32 (freq 4096: never).
  const __m256i sign = _mm256_set1_epi32(INT32_MIN);
  const __m256i limit = _mm256_sub_epi32(_mm256_slli_epi32(freq, 32 - kProbBits), _mm256_set1_epi32(1));
  const __m256i needy = _mm256_cmpgt_epi32(_mm256_xor_si256(x, sign), _mm256_xor_si256(limit, sign));
  const uint32_t m = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(needy)));
  // Branch-free (about one vector in seven has no needy lane): the top popcount(m) words are
  // the pushed ones; the rest land below the new top, where nothing lives yet.
  const __m256i idx = _mm256_load_si256(reinterpret_cast<const __m256i*>(kPack.idx[m]));
  const __m256i w = _mm256_permutevar8x32_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0xffff)), idx);
  const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(w, w), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(stack + *top - 8), _mm256_castsi256_si128(p));
  *top -= static_cast<uint32_t>(__builtin_popcount(m));
  x = _mm256_blendv_epi8(x, _mm256_srli_epi32(x, 16), needy);
  x = advance(x, freq, _mm256_srli_epi32(fc, 16));
  return true;
}

template <bool kSmall>
KDN_TARGET_AVX2 uint32_t steps(const uint8_t* sym, uint32_t n_steps, const Lookup& t, uint32_t* x, uint16_t* stack,
                               uint32_t* top) {
  __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 8));
  __m256i x2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 16));
  __m256i x3 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 24));
  uint32_t s = n_steps;
  // A step pushes at most 32 words, and a vector's store reaches 8 words below the top.
  for (; s > 0 && *top >= kLanes; --s) {
    const uint8_t* step = sym + size_t{s - 1} * kLanes;
    uint32_t tp = *top;
    __m256i y3 = x3, y2 = x2, y1 = x1, y0 = x0;
    if (!encode_vector<kSmall>(y3, step + 24, t, stack, &tp) || !encode_vector<kSmall>(y2, step + 16, t, stack, &tp) ||
        !encode_vector<kSmall>(y1, step + 8, t, stack, &tp) || !encode_vector<kSmall>(y0, step, t, stack, &tp))
      break;  // the scalar loop redoes this step and reports the absent symbol
    x3 = y3, x2 = y2, x1 = y1, x0 = y0;
    *top = tp;
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(x), x0);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(x + 8), x1);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(x + 16), x2);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(x + 24), x3);
  return n_steps - s;
}

}  // namespace

KDN_TARGET_AVX2 uint32_t encode_steps_avx2(const uint8_t* sym, uint32_t n_steps, const EncodeTable& t, uint32_t* x,
                                           uint16_t* stack, uint32_t* top) noexcept {
  Lookup l;
  l.fc = t.fc;
  l.lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.fc));
  l.hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.fc + 8));
  // Symbols past 15 would alias the permutes: only tables whose entries past 15 are all
  // absent take the register path (every symbol there then has freq 0 and is refused).
  return t.n_syms <= 16 ? steps<true>(sym, n_steps, l, x, stack, top) : steps<false>(sym, n_steps, l, x, stack, top);
}

#else

uint32_t encode_steps_avx2(const uint8_t*, uint32_t, const EncodeTable&, uint32_t*, uint16_t*, uint32_t*) noexcept {
  return 0;
}

#endif

}  // namespace kdn::kernels::rans
