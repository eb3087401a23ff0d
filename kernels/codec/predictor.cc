// KVC1 encoder: choosing the channels the token-delta predictor codes (docs/codec.md,
// "Predictor"). All arithmetic is integer, so every machine makes the same choice.
#include "encode_body.h"
#include "encoder.h"
#include "rans.h"

#include <kdn/common/model.h>

#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace kdn::kernels::kvc1 {
namespace {

#if defined(__x86_64__)
#define KDN_TARGET_AVX2 __attribute__((target("avx2")))
#endif

// log2_fixed16 of every count below kLogTableSize: the choice weighs up to 256 symbols
// several times per segment, and most counts are small.
constexpr uint32_t kLogTableSize = 4096;

struct LogTable {
  uint32_t v[kLogTableSize];
  LogTable() {
    v[0] = 0;
    for (uint32_t x = 1; x < kLogTableSize; ++x) v[x] = static_cast<uint32_t>(log2_fixed16(x));
  }
};

uint64_t log2_count(uint64_t x) {
  static const LogTable table;  // thread-safe static initialization
  return x < kLogTableSize ? table.v[x] : log2_fixed16(x);
}

#if defined(__x86_64__)
// count_channels for alphabets of up to 16 symbols and head_dim a multiple of 32. For each 32
// channels, up to 8 symbol values at a time, byte counters live in registers while the
// token rows stream past (one compare and one subtract per value and row), and are added to
// the u32 histograms every 255 rows.
template <bool kDelta>
KDN_TARGET_AVX2 void count_values(const uint8_t* q, uint32_t tokens, uint32_t head_dim, uint32_t col, uint32_t v0,
                                  uint32_t n_syms, uint32_t* hist) {
  const uint32_t nv = n_syms - v0 < 8 ? n_syms - v0 : 8;
  const __m256i code_mask = _mm256_set1_epi8(static_cast<char>(n_syms - 1));
  __m256i val[8];
  for (uint32_t v = 0; v < 8; ++v) val[v] = _mm256_set1_epi8(static_cast<char>(v0 + v));
  for (uint32_t t0 = 0; t0 < tokens; t0 += 255) {
    const uint32_t t1 = tokens - t0 < 255 ? tokens : t0 + 255;
    __m256i cnt[8];
    for (uint32_t v = 0; v < 8; ++v) cnt[v] = _mm256_setzero_si256();
    for (uint32_t t = t0; t < t1; ++t) {
      const uint8_t* cur = q + size_t{t} * head_dim + col;
      __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cur));
      if (kDelta && t) {
        const __m256i p = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cur - head_dim));
        c = _mm256_and_si256(_mm256_sub_epi8(c, p), code_mask);
      }
#pragma GCC unroll 8
      for (uint32_t v = 0; v < 8; ++v) cnt[v] = _mm256_sub_epi8(cnt[v], _mm256_cmpeq_epi8(c, val[v]));
    }
    alignas(32) uint8_t bytes[8][32];
    for (uint32_t v = 0; v < 8; ++v) _mm256_store_si256(reinterpret_cast<__m256i*>(bytes[v]), cnt[v]);
    for (uint32_t v = 0; v < nv; ++v)
      for (uint32_t d = 0; d < 32; ++d) hist[(col + d) * n_syms + v0 + v] += bytes[v][d];
  }
}

KDN_TARGET_AVX2 void count_channels_avx2(const uint8_t* q, uint32_t tokens, uint32_t head_dim, uint32_t n_syms,
                                         uint32_t* plain, uint32_t* delta) {
  for (uint32_t col = 0; col < head_dim; col += 32)
    for (uint32_t v0 = 0; v0 < n_syms; v0 += 8) {
      count_values<false>(q, tokens, head_dim, col, v0, n_syms, plain);
      count_values<true>(q, tokens, head_dim, col, v0, n_syms, delta);
    }
}
#endif

void count_channels(const uint8_t* q, uint32_t tokens, uint32_t head_dim, uint32_t n_syms, uint32_t* plain,
                    uint32_t* delta) {
  std::memset(plain, 0, sizeof(uint32_t) * head_dim * n_syms);
  std::memset(delta, 0, sizeof(uint32_t) * head_dim * n_syms);
#if defined(__x86_64__)
  if (n_syms <= 16 && head_dim % 32 == 0 && __builtin_cpu_supports("avx2"))
    return count_channels_avx2(q, tokens, head_dim, n_syms, plain, delta);
#endif
  // Channel by channel, so each channel's two histograms stay in L1 while its column of codes
  // is read (rows of a head's codes are a few KiB apart at most).
  for (uint32_t d = 0; d < head_dim; ++d)
    count_channel_body(q, tokens, head_dim, d, n_syms, plain + size_t{d} * n_syms, delta + size_t{d} * n_syms);
}

#if defined(__x86_64__)
// Sum of h[s] * cost[s] in u64 lanes (32 x 32 -> 64-bit products); n_syms a multiple of 8.
KDN_TARGET_AVX2 uint64_t dot_avx2(const uint32_t* h, const uint32_t* cost, uint32_t n_syms) {
  __m256i even = _mm256_setzero_si256(), odd = _mm256_setzero_si256();
  for (uint32_t s = 0; s < n_syms; s += 8) {
    const __m256i hv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + s));
    const __m256i cv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cost + s));
    even = _mm256_add_epi64(even, _mm256_mul_epu32(hv, cv));
    odd = _mm256_add_epi64(odd, _mm256_mul_epu32(_mm256_srli_epi64(hv, 32), _mm256_srli_epi64(cv, 32)));
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), _mm256_add_epi64(even, odd));
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

KDN_TARGET_AVX2 void add_avx2(uint32_t* h, const uint32_t* c, uint32_t n_syms) {
  for (uint32_t s = 0; s < n_syms; s += 8) {
    auto* hp = reinterpret_cast<__m256i*>(h + s);
    _mm256_storeu_si256(
        hp, _mm256_add_epi32(_mm256_loadu_si256(hp), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + s))));
  }
}
#endif

bool wide_simd(uint32_t n_syms) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2 && n_syms % 8 == 0;
#else
  (void)n_syms;
  return false;
#endif
}

// Costs fit 32 bits (below (log2(n) + 17) * 2^16 with n = tokens * head_dim <= 2^28), which the
// vector dot needs.
uint64_t dot(const uint32_t* h, const uint32_t* cost, uint32_t n_syms) {
#if defined(__x86_64__)
  if (wide_simd(n_syms)) return dot_avx2(h, cost, n_syms);
#endif
  return PlainChoiceOps{}.dot(h, cost, n_syms);
}

void add_counts(uint32_t* h, const uint32_t* c, uint32_t n_syms) {
#if defined(__x86_64__)
  if (wide_simd(n_syms)) return add_avx2(h, c, n_syms);
#endif
  PlainChoiceOps{}.add(h, c, n_syms);
}

// The CPU's inner loops: a table of small logarithms, AVX2 counters, dot products and sums.
struct CpuChoiceOps {
  uint64_t log2_count(uint64_t x) const { return kvc1::log2_count(x); }
  uint64_t dot(const uint32_t* h, const uint32_t* cost, uint32_t n_syms) const { return kvc1::dot(h, cost, n_syms); }
  void add(uint32_t* h, const uint32_t* c, uint32_t n_syms) const { add_counts(h, c, n_syms); }
  void count(const uint8_t* q, uint32_t tokens, uint32_t head_dim, uint32_t n_syms, uint32_t* plain,
             uint32_t* delta) const {
    count_channels(q, tokens, head_dim, n_syms, plain, delta);
  }
};

}  // namespace

void count_symbols(const uint8_t* sym, uint32_t n, uint32_t n_syms, uint32_t* histogram) noexcept {
  // Four partial histograms: runs of one symbol would otherwise serialize on one counter.
  uint32_t part[4][rans::kMaxSymbols] = {};
  uint32_t i = 0;
  for (; i + 4 <= n; i += 4) part[0][sym[i]]++, part[1][sym[i + 1]]++, part[2][sym[i + 2]]++, part[3][sym[i + 3]]++;
  for (; i < n; ++i) part[0][sym[i]]++;
  for (uint32_t s = 0; s < n_syms; ++s) histogram[s] = part[0][s] + part[1][s] + part[2][s] + part[3][s];
}

bool choose_predicted_channels(const uint8_t* codes, uint32_t tokens, uint32_t head_dim, uint32_t bits,
                               EncodeScratch& sc, uint8_t* mask, uint32_t* histogram) noexcept {
  if (head_dim < 32 || tokens < 2) {
    std::memset(mask, 0, (head_dim + 7) / 8);
    count_symbols(codes, tokens * head_dim, 1u << bits, histogram);
    return false;
  }
  const ChoiceScratch cs{sc.cost_plain, sc.cost_delta, sc.hist_plain, sc.hist_delta};
  return choose_channels_body(CpuChoiceOps{}, codes, tokens, head_dim, bits, cs, mask, histogram);
}

void apply_token_delta(const uint8_t* codes, uint32_t tokens, uint32_t head_dim, uint8_t code_mask, const uint8_t* mask,
                       uint8_t* out) noexcept {
  uint8_t select[kMaxHeadDim];  // 0xff on predicted channels: the row loop is then branch-free
  for (uint32_t d = 0; d < head_dim; ++d) select[d] = (mask[d / 8] >> (d % 8)) & 1u ? 0xffu : 0u;
  std::memcpy(out, codes, head_dim);
  for (uint32_t t = 1; t < tokens; ++t) {
    const uint8_t* cur = codes + size_t{t} * head_dim;
    const uint8_t* prev = cur - head_dim;
    uint8_t* o = out + size_t{t} * head_dim;
    uint32_t d = 0;
#if defined(__SSE2__)
    const __m128i m = _mm_set1_epi8(static_cast<char>(code_mask));
    for (; d + 16 <= head_dim; d += 16) {
      const __m128i p = _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(prev + d)),
                                      _mm_loadu_si128(reinterpret_cast<const __m128i*>(select + d)));
      const __m128i r = _mm_sub_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(cur + d)), p);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + d), _mm_and_si128(r, m));
    }
#endif
    for (; d < head_dim; ++d) o[d] = static_cast<uint8_t>((cur[d] - (prev[d] & select[d])) & code_mask);
  }
}

}  // namespace kdn::kernels::kvc1
