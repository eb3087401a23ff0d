// KVC1 encoder: choosing the channels the token-delta predictor codes (docs/codec.md,
// "Predictor"). All arithmetic is integer, so every machine makes the same choice.
#include "encoder.h"
#include "rans.h"

#include <kdn/common/model.h>

#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace kdn::kernels::kvc1 {
namespace {

// log2(x) in 1/65536 bits for x >= 1, by integer arithmetic only (no libm).
uint64_t log2_fixed16(uint64_t x) {
  const uint32_t ip = 63 - static_cast<uint32_t>(__builtin_clzll(x));
  // Mantissa in [1, 2) as Q1.31; each squaring yields one fractional bit.
  uint64_t m = ip >= 31 ? x >> (ip - 31) : x << (31 - ip);
  uint64_t frac = 0;
  for (int b = 15; b >= 0; --b) {
    m = (m * m) >> 31;
    if (m >= (uint64_t{2} << 31)) {
      m >>= 1;
      frac |= uint64_t{1} << b;
    }
  }
  return (uint64_t{ip} << 16) | frac;
}

// Ideal code length of each symbol (1/65536 bits) for histogram h of n symbols; absent
// symbols get a large finite cost.
void symbol_costs(const uint32_t* h, uint32_t n_syms, uint64_t n, uint64_t* cost) {
  const uint64_t ln = log2_fixed16(n);
  for (uint32_t s = 0; s < n_syms; ++s) cost[s] = h[s] ? ln - log2_fixed16(h[s]) : ln + (16u << 16);
}

uint64_t ideal_bits(const uint32_t* h, uint32_t n_syms, uint64_t n) {
  uint64_t cost[rans::kMaxSymbols];
  symbol_costs(h, n_syms, n, cost);
  uint64_t total = 0;
  for (uint32_t s = 0; s < n_syms; ++s) total += h[s] * cost[s];
  return total;
}

// Codes of a segment as token rows, with their token deltas ((q[t] - q[t-1]) mod 2^bits).
struct Codes {
  const uint8_t* q;
  uint32_t tokens, head_dim;
  uint8_t mask;  // 2^bits - 1

  uint8_t plain(uint32_t t, uint32_t d) const { return q[size_t{t} * head_dim + d]; }
  uint8_t delta(uint32_t t, uint32_t d) const {
    return t ? static_cast<uint8_t>((plain(t, d) - plain(t - 1, d)) & mask) : plain(t, d);
  }
};

// Per-channel ideal lengths of coding each channel plain and as deltas, under the tables
// c_plain and c_delta (row-major pass).
void channel_costs(const Codes& c, const uint64_t* c_plain, const uint64_t* c_delta, EncodeScratch& sc) {
  std::memset(sc.cost_plain, 0, sizeof(uint64_t) * c.head_dim);
  std::memset(sc.cost_delta, 0, sizeof(uint64_t) * c.head_dim);
  for (uint32_t t = 0; t < c.tokens; ++t)
    for (uint32_t d = 0; d < c.head_dim; ++d) {
      sc.cost_plain[d] += c_plain[c.plain(t, d)];
      sc.cost_delta[d] += c_delta[c.delta(t, d)];
    }
}

void choose(const Codes& c, const EncodeScratch& sc, uint8_t* mask) {
  for (uint32_t d = 0; d < c.head_dim; ++d) {
    const uint8_t bit = static_cast<uint8_t>(1u << (d % 8));
    mask[d / 8] = static_cast<uint8_t>(sc.cost_delta[d] < sc.cost_plain[d] ? mask[d / 8] | bit : mask[d / 8] & ~bit);
  }
}

void mixed_histogram(const Codes& c, const uint8_t* mask, EncodeScratch& sc, uint32_t* h) {
  apply_token_delta(c.q, c.tokens, c.head_dim, c.mask, mask, sc.residuals);
  for (size_t i = 0; i < size_t{c.tokens} * c.head_dim; ++i) h[sc.residuals[i]]++;
}

}  // namespace

bool choose_predicted_channels(const uint8_t* codes, uint32_t tokens, uint32_t head_dim, uint32_t bits,
                               EncodeScratch& sc, uint8_t* mask) noexcept {
  const uint32_t mask_bytes = (head_dim + 7) / 8;
  std::memset(mask, 0, mask_bytes);
  if (head_dim < 32 || tokens < 2) return false;
  const uint32_t n_syms = 1u << bits;
  const Codes c{codes, tokens, head_dim, static_cast<uint8_t>(n_syms - 1)};
  const uint64_t n = uint64_t{tokens} * head_dim;
  uint32_t h_plain[rans::kMaxSymbols] = {}, h_delta[rans::kMaxSymbols] = {};
  for (uint32_t t = 0; t < tokens; ++t)
    for (uint32_t d = 0; d < head_dim; ++d) {
      h_plain[c.plain(t, d)]++;
      h_delta[c.delta(t, d)]++;
    }
  // First guess: each channel under the all-plain and all-delta tables. Then, twice, each
  // channel again under the one table the current choice would share (what rANS will pay).
  uint64_t c_plain[rans::kMaxSymbols], c_delta[rans::kMaxSymbols];
  symbol_costs(h_plain, n_syms, n, c_plain);
  symbol_costs(h_delta, n_syms, n, c_delta);
  channel_costs(c, c_plain, c_delta, sc);
  choose(c, sc, mask);
  for (int pass = 0; pass < 2; ++pass) {
    uint32_t h[rans::kMaxSymbols] = {};
    mixed_histogram(c, mask, sc, h);
    uint64_t c_mixed[rans::kMaxSymbols];
    symbol_costs(h, n_syms, n, c_mixed);
    channel_costs(c, c_mixed, c_mixed, sc);
    choose(c, sc, mask);
  }
  uint32_t h[rans::kMaxSymbols] = {};
  mixed_histogram(c, mask, sc, h);
  if (ideal_bits(h, n_syms, n) >= ideal_bits(h_plain, n_syms, n)) {
    std::memset(mask, 0, mask_bytes);
    return false;
  }
  return true;
}

void apply_token_delta(const uint8_t* codes, uint32_t tokens, uint32_t head_dim, uint8_t code_mask,
                       const uint8_t* mask, uint8_t* out) noexcept {
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
