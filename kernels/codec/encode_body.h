// Encoder bodies shared by the CPU encoder (encode_planes.cc, predictor.cc) and the CUDA
// encoder (encode_device.h): code packing and the token-delta predictor's choice. Everything
// here is integer arithmetic, so both sides make the same choices and write the same bytes.
//
// The choice is written once as choose_channels_body<Ops>; Ops supplies the inner loops (the
// CPU passes its AVX2 counters and dot products, the device plain loops) and must give the
// results of the plain loops bit for bit.
#pragma once

#include "format.h"
#include "rans.h"

#include <kdn/common/model.h>
#include <kdn/kernels/hd.h>

#include <cstdint>

namespace kdn::kernels::kvc1 {

// log2(x) in 1/65536 bits for x >= 1, by integer arithmetic only (no libm).
KDN_HD_INLINE uint64_t log2_fixed16(uint64_t x) {
#if defined(__CUDA_ARCH__)
  const uint32_t ip = 63 - static_cast<uint32_t>(__clzll(static_cast<long long>(x)));
#else
  const uint32_t ip = 63 - static_cast<uint32_t>(__builtin_clzll(x));
#endif
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

// Codes sym[0, n) of `bits` each as the packed bitstream of docs/codec.md §3.5 (LSB first),
// ceil(n * bits / 32) u32 words at dst.
KDN_HD_INLINE void pack_codes_body(const uint8_t* sym, uint32_t n, uint32_t bits, uint8_t* dst) {
  const uint64_t words = (uint64_t{n} * bits + 31) / 32;
  for (uint64_t i = 0; i < 4 * words; ++i) dst[i] = 0;
  uint64_t pos = 0;
  for (uint32_t i = 0; i < n; ++i, pos += bits) {
    const uint64_t v = uint64_t{sym[i]} << (pos % 8);
    for (uint64_t b = pos / 8, s = 0; s < (pos % 8) + bits; ++b, s += 8) dst[b] |= static_cast<uint8_t>(v >> s);
  }
}

// Channel d's histograms of a segment's codes q[tokens][head_dim], plain and as token deltas
// ((q[t] - q[t-1]) mod n_syms, the first token plain); hp and hd arrive zeroed.
KDN_HD_INLINE void count_channel_body(const uint8_t* q, uint32_t tokens, uint32_t head_dim, uint32_t d, uint32_t n_syms,
                                      uint32_t* hp, uint32_t* hd) {
  const uint8_t code_mask = static_cast<uint8_t>(n_syms - 1);
  uint8_t prev = 0;
  const uint8_t* col = q + d;
  for (uint32_t t = 0; t < tokens; ++t, col += head_dim) {
    const uint8_t c = *col;
    hp[c]++;
    hd[static_cast<uint8_t>((c - prev) & code_mask)]++;
    prev = c;
  }
}

// Plain loops (the device's Ops, and the reference of the CPU's).
struct PlainChoiceOps {
  KDN_HD_INLINE uint64_t log2_count(uint64_t x) const { return log2_fixed16(x); }
  KDN_HD_INLINE uint64_t dot(const uint32_t* h, const uint32_t* cost, uint32_t n_syms) const {
    uint64_t total = 0;
    for (uint32_t s = 0; s < n_syms; ++s) total += uint64_t{h[s]} * cost[s];
    return total;
  }
  KDN_HD_INLINE void add(uint32_t* h, const uint32_t* c, uint32_t n_syms) const {
    for (uint32_t s = 0; s < n_syms; ++s) h[s] += c[s];
  }
  KDN_HD_INLINE void count(const uint8_t* q, uint32_t tokens, uint32_t head_dim, uint32_t n_syms, uint32_t* plain,
                           uint32_t* delta) const {
    for (uint64_t i = 0; i < uint64_t{head_dim} * n_syms; ++i) plain[i] = delta[i] = 0;
    for (uint32_t d = 0; d < head_dim; ++d)
      count_channel_body(q, tokens, head_dim, d, n_syms, plain + uint64_t{d} * n_syms, delta + uint64_t{d} * n_syms);
  }
};

// Scratch of the choice: per-channel code lengths and histograms.
struct ChoiceScratch {
  uint64_t* cost_plain;  // [head_dim]
  uint64_t* cost_delta;  // [head_dim]
  uint32_t* hist_plain;  // [head_dim][n_syms]
  uint32_t* hist_delta;  // [head_dim][n_syms]
};

// Ideal code length of each symbol (1/65536 bits) for histogram h of n symbols; absent
// symbols get a large finite cost.
template <class Ops>
KDN_HD_INLINE void symbol_costs_body(const Ops& ops, const uint32_t* h, uint32_t n_syms, uint64_t n, uint64_t* cost) {
  const uint64_t ln = ops.log2_count(n);
  for (uint32_t s = 0; s < n_syms; ++s) cost[s] = h[s] ? ln - ops.log2_count(h[s]) : ln + (16u << 16);
}

template <class Ops>
KDN_HD_INLINE uint64_t ideal_bits_body(const Ops& ops, const uint32_t* h, uint32_t n_syms, uint64_t n) {
  uint64_t cost[rans::kMaxSymbols];
  symbol_costs_body(ops, h, n_syms, n, cost);
  uint64_t total = 0;
  for (uint32_t s = 0; s < n_syms; ++s) total += h[s] * cost[s];
  return total;
}

KDN_HD_INLINE bool channel_in_mask(const uint8_t* mask, uint32_t d) { return (mask[d / 8] >> (d % 8)) & 1u; }

// Histogram of the segment's symbols with the channels of `mask` coded as deltas (mask null:
// every channel plain).
template <class Ops>
KDN_HD_INLINE void mixed_histogram_body(const Ops& ops, const ChoiceScratch& sc, uint32_t head_dim, uint32_t n_syms,
                                        const uint8_t* mask, uint32_t* h) {
  for (uint32_t s = 0; s < n_syms; ++s) h[s] = 0;
  for (uint32_t d = 0; d < head_dim; ++d) {
    const bool pred = mask && channel_in_mask(mask, d);
    ops.add(h, (pred ? sc.hist_delta : sc.hist_plain) + uint64_t{d} * n_syms, n_syms);
  }
}

// h, the mixed histogram of mask `from`, becomes that of mask `to`: only the channels whose bit
// changed move between their plain and delta histograms (modulo 2^32, exact for counts), so a
// pass that flips few channels costs a few rows instead of head_dim of them.
KDN_HD_INLINE void remix_histogram_body(const ChoiceScratch& sc, uint32_t head_dim, uint32_t n_syms,
                                        const uint8_t* from, const uint8_t* to, uint32_t* h) {
  for (uint32_t d = 0; d < head_dim; ++d) {
    const bool was = channel_in_mask(from, d), now = channel_in_mask(to, d);
    if (was == now) continue;
    const uint32_t* add = (now ? sc.hist_delta : sc.hist_plain) + uint64_t{d} * n_syms;
    const uint32_t* sub = (now ? sc.hist_plain : sc.hist_delta) + uint64_t{d} * n_syms;
    for (uint32_t s = 0; s < n_syms; ++s) h[s] += add[s] - sub[s];
  }
}

// Per-channel ideal lengths of coding each channel plain and as deltas under the tables
// c_plain and c_delta (costs fit 32 bits: below (log2(n) + 17) * 2^16 with n <= 2^28), then
// each channel takes the cheaper option.
template <class Ops>
KDN_HD_INLINE void choose_under_body(const Ops& ops, const ChoiceScratch& sc, uint32_t head_dim, uint32_t n_syms,
                                     const uint64_t* c_plain, const uint64_t* c_delta, uint8_t* mask) {
  uint32_t cp[rans::kMaxSymbols], cd[rans::kMaxSymbols];
  for (uint32_t s = 0; s < n_syms; ++s)
    cp[s] = static_cast<uint32_t>(c_plain[s]), cd[s] = static_cast<uint32_t>(c_delta[s]);
  for (uint32_t d = 0; d < head_dim; ++d) {
    sc.cost_plain[d] = ops.dot(sc.hist_plain + uint64_t{d} * n_syms, cp, n_syms);
    sc.cost_delta[d] = ops.dot(sc.hist_delta + uint64_t{d} * n_syms, cd, n_syms);
  }
  for (uint32_t d = 0; d < head_dim; ++d) {
    const uint8_t bit = static_cast<uint8_t>(1u << (d % 8));
    mask[d / 8] = static_cast<uint8_t>(sc.cost_delta[d] < sc.cost_plain[d] ? mask[d / 8] | bit : mask[d / 8] & ~bit);
  }
}

// choose_predicted_channels (encoder.h) over histograms: each channel first under the
// all-plain and all-delta tables, then twice under the one table the current choice would
// share; the predictor is dropped unless the mix beats coding every channel plain. Needs
// head_dim >= 32 and tokens >= 2 (the caller counts plainly otherwise).
template <class Ops>
KDN_HD_INLINE bool choose_channels_body(const Ops& ops, const uint8_t* codes, uint32_t tokens, uint32_t head_dim,
                                        uint32_t bits, const ChoiceScratch& sc, uint8_t* mask, uint32_t* histogram) {
  const uint32_t mask_bytes = (head_dim + 7) / 8;
  const uint32_t n_syms = 1u << bits;
  const uint64_t n = uint64_t{tokens} * head_dim;
  ops.count(codes, tokens, head_dim, n_syms, sc.hist_plain, sc.hist_delta);
  uint32_t h_plain[rans::kMaxSymbols], h_delta[rans::kMaxSymbols], h[rans::kMaxSymbols];
  mixed_histogram_body(ops, sc, head_dim, n_syms, nullptr, h_plain);
  for (uint32_t i = 0; i < mask_bytes; ++i) mask[i] = 0xff;
  mixed_histogram_body(ops, sc, head_dim, n_syms, mask, h_delta);
  uint64_t c_plain[rans::kMaxSymbols], c_delta[rans::kMaxSymbols];
  symbol_costs_body(ops, h_plain, n_syms, n, c_plain);
  symbol_costs_body(ops, h_delta, n_syms, n, c_delta);
  for (uint32_t i = 0; i < mask_bytes; ++i) mask[i] = 0;
  choose_under_body(ops, sc, head_dim, n_syms, c_plain, c_delta, mask);
  mixed_histogram_body(ops, sc, head_dim, n_syms, mask, h);
  uint8_t before[(kMaxHeadDim + 7) / 8];
  for (int pass = 0; pass < 2; ++pass) {
    uint64_t c_mixed[rans::kMaxSymbols];
    symbol_costs_body(ops, h, n_syms, n, c_mixed);
    for (uint32_t i = 0; i < mask_bytes; ++i) before[i] = mask[i];
    choose_under_body(ops, sc, head_dim, n_syms, c_mixed, c_mixed, mask);
    remix_histogram_body(sc, head_dim, n_syms, before, mask, h);  // h follows the mask
  }
  const bool keep = ideal_bits_body(ops, h, n_syms, n) < ideal_bits_body(ops, h_plain, n_syms, n);
  if (!keep)
    for (uint32_t i = 0; i < mask_bytes; ++i) mask[i] = 0;
  for (uint32_t s = 0; s < n_syms; ++s) histogram[s] = keep ? h[s] : h_plain[s];
  return keep;
}

}  // namespace kdn::kernels::kvc1
