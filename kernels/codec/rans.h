// 32-lane interleaved rANS, exactly as docs/codec.md ("Entropy coding") defines it:
// PROB_BITS 12 (frequencies sum to 4096), state u32 in [2^16, 2^32), 16-bit I/O words,
// symbol i of a block on lane i mod 32, words shared by the lanes in ascending lane order,
// and the end-state check (every lane back at 2^16, every word consumed).
//
// The per-lane bodies are KDN_HD and shared by the CPU decoders and the CUDA kernel. The CPU
// BlockDecoder streams any number of symbols at a time (tiles need not align with steps):
// decoding lane j and immediately renormalizing it reads the words in the same order as the
// step-wise definition, because lanes only interact through the shared word pointer and that
// pointer advances in ascending lane order either way.
#pragma once

#include <kdn/kernels/hd.h>

#include <cstddef>
#include <cstdint>

namespace kdn::kernels::rans {

constexpr uint32_t kProbBits = 12;
constexpr uint32_t kProbScale = 1u << kProbBits;
constexpr uint32_t kLower = 1u << 16;  // RANS_L
constexpr uint32_t kLanes = 32;
constexpr uint32_t kMaxSymbols = 256;

// ---- per-lane bodies (host and device) -------------------------------------------------------

// The decode transition: x' = freq * (x >> 12) + slot - cum.
KDN_HD_INLINE uint32_t decode_advance(uint32_t x, uint32_t freq, uint32_t cum) {
  return freq * (x >> kProbBits) + (x & (kProbScale - 1)) - cum;
}

// Symbol of `slot` by compare-count: y = #{k in [1, n_syms) : cum[k] <= slot}. Valid because an
// absent symbol's interval is empty (its cum equals the next one's).
KDN_HD_INLINE uint32_t symbol_by_count(uint32_t slot, const uint16_t* cum, uint32_t n_syms) {
  uint32_t y = 0;
  for (uint32_t k = 1; k < n_syms; ++k) y += cum[k] <= slot ? 1u : 0u;
  return y;
}

// cum[0..n_syms] from freq; false unless the frequencies sum to exactly 4096.
KDN_HD_INLINE bool build_cumulative(const uint16_t* freq, uint32_t n_syms, uint16_t* cum) {
  uint32_t c = 0;
  for (uint32_t s = 0; s < n_syms; ++s) {
    cum[s] = static_cast<uint16_t>(c > kProbScale ? kProbScale : c);
    c += freq[s];
  }
  cum[n_syms] = static_cast<uint16_t>(c > kProbScale ? kProbScale : c);
  return c == kProbScale;
}

// ---- encoder bodies (host and device: the CPU and CUDA encoders share them) ------------------

KDN_HD_INLINE uint32_t first_max_index(const uint32_t* v, uint32_t n) {
  uint32_t best = 0;
  for (uint32_t s = 1; s < n; ++s)
    if (v[s] > v[best]) best = s;
  return best;
}

// normalize_frequencies' body.
KDN_HD_INLINE bool normalize_body(const uint32_t* counts, uint32_t n_syms, uint16_t* freq) {
  uint64_t total = 0;
  for (uint32_t s = 0; s < n_syms; ++s) total += counts[s];
  if (total == 0 || n_syms == 0 || n_syms > kMaxSymbols) return false;
  uint32_t f[kMaxSymbols];
  uint32_t sum = 0;
  for (uint32_t s = 0; s < n_syms; ++s) {
    uint64_t v = counts[s] ? (uint64_t{counts[s]} * kProbScale) / total : 0;
    if (counts[s] && v == 0) v = 1;
    f[s] = static_cast<uint32_t>(v);
    sum += f[s];
  }
  // Floors leave a deficit: give it to the most frequent symbol, where it costs least.
  if (sum < kProbScale) f[first_max_index(counts, n_syms)] += kProbScale - sum;
  // Raising rare symbols to 1 can overshoot: take the excess from the largest frequencies.
  while (sum > kProbScale) {
    const uint32_t s = first_max_index(f, n_syms);
    const uint32_t take = sum - kProbScale < f[s] - 1 ? sum - kProbScale : f[s] - 1;
    f[s] -= take;
    sum -= take;
  }
  for (uint32_t s = 0; s < n_syms; ++s) freq[s] = static_cast<uint16_t>(f[s]);
  return true;
}

// Symbols [lo, hi) in reverse, one at a time, as docs/codec.md defines the encoder: `fc` holds
// freq | cum << 16 per symbol (0 for absent ones), x the 32 lane states, words are pushed below
// *top. False at a symbol with freq 0.
KDN_HD_INLINE bool encode_reverse(const uint8_t* sym, uint32_t lo, uint32_t hi, const uint32_t* fc, uint32_t* x,
                                  uint16_t* stack, uint32_t* top) {
  for (uint32_t i = hi; i-- > lo;) {
    const uint32_t e = fc[sym[i]];
    const uint32_t f = e & 0xffffu;
    if (f == 0) return false;
    uint32_t& xj = x[i % kLanes];
    if (uint64_t{xj} >= (uint64_t{f} << (32 - kProbBits))) {
      stack[--*top] = static_cast<uint16_t>(xj & 0xffffu);
      xj >>= 16;
    }
    xj = (xj / f) * kProbScale + (xj % f) + (e >> 16);
  }
  return true;
}

// ---- encoder (host) ------------------------------------------------------------------------

// Scales `counts` (n_syms <= 256 entries) to frequencies summing to 4096, every symbol that
// occurs getting at least 1. Deterministic integer arithmetic. False if nothing occurs.
bool normalize_frequencies(const uint32_t* counts, uint32_t n_syms, uint16_t* freq) noexcept;

struct EncodedBlock {
  uint32_t state[kLanes];
  const uint16_t* words;  // points into the caller's stack buffer
  uint32_t n_words;
};

// A segment's table as the encoder reads it: freq | cum << 16 per symbol; entries of absent
// symbols, and past n_syms, are 0.
struct EncodeTable {
  uint32_t n_syms;
  uint32_t fc[kMaxSymbols];
};

// False unless freq[0, n_syms) sums to 4096 (n_syms <= 256).
bool build_encode_table(const uint16_t* freq, uint32_t n_syms, EncodeTable* t) noexcept;

// Encodes sym[0, n) with the table. `stack` has room for `stack_words` >= n words (a symbol
// emits at most one word). False if a symbol is outside the table or has freq 0. Uses the
// AVX2 loop for whole steps when simd_level() allows; the output is the same either way.
bool encode_block(const uint8_t* sym, uint32_t n, const EncodeTable& t, uint16_t* stack, uint32_t stack_words,
                  EncodedBlock* out) noexcept;

// The same with the table given as (freq, cum) of n_syms symbols.
bool encode_block(const uint8_t* sym, uint32_t n, const uint16_t* freq, const uint16_t* cum, uint32_t n_syms,
                  uint16_t* stack, uint32_t stack_words, EncodedBlock* out) noexcept;

// The AVX2 step loop (rans_encode_avx2.cc): encodes whole steps steps-1 down to 0 of sym
// (32 symbols each) into the lane states x[32], pushing words below *top, while at least 32
// words of stack remain. Returns the number of steps done (from the last one down); stops
// early, before the step, at a symbol with freq 0.
uint32_t encode_steps_avx2(const uint8_t* sym, uint32_t steps, const EncodeTable& t, uint32_t* x, uint16_t* stack,
                           uint32_t* top) noexcept;

// ---- CPU decoder ---------------------------------------------------------------------------

struct DecodeTable {
  uint32_t n_syms = 0;
  uint32_t bits = 0;
  uint32_t fc[kMaxSymbols];  // freq | cum << 16
  uint16_t cum[kMaxSymbols + 1];
  int32_t cum_minus1[16];                   // compare-count thresholds (bits <= 4), 4095 past n_syms
  alignas(32) uint8_t lut[kProbScale + 4];  // slot -> symbol; +4 for 32-bit gathers
};

// Builds the tables from freq[n_syms] (untrusted). False unless 1 <= n_syms <= 2^bits and the
// frequencies sum to 4096.
bool build_decode_table(const uint16_t* freq, uint32_t n_syms, uint32_t bits, DecodeTable* t) noexcept;

struct BlockDecoder {
  uint32_t x[kLanes];
  const uint8_t* words;  // u16 little-endian words, n_words of them
  uint32_t n_words;
  uint32_t p;     // next word
  uint32_t next;  // next symbol index in the block
  uint32_t n_symbols;
};

// states: 32 little-endian u32 (a block descriptor's state array).
void start_block(BlockDecoder* d, const uint8_t* states, const uint8_t* words, uint32_t n_words,
                 uint32_t n_symbols) noexcept;

// Decodes the next `count` symbols (count <= n_symbols - next) into out. False if the word
// stream runs dry (corruption). Uses the SIMD decoder when the CPU has one (see below).
bool decode_symbols(BlockDecoder& d, const DecodeTable& t, uint8_t* out, uint32_t count) noexcept;

// The portable reference the SIMD decoders are tested against.
bool decode_symbols_scalar(BlockDecoder& d, const DecodeTable& t, uint8_t* out, uint32_t count) noexcept;

// True when every symbol was decoded, every word consumed and every lane is back at 2^16.
bool block_finished_cleanly(const BlockDecoder& d) noexcept;

// The bulk step loop decode_symbols uses: the widest the CPU has unless capped (tests compare
// every level with the scalar reference). set_simd_level returns the previous cap.
enum class SimdLevel : uint32_t { kScalar = 0, kAvx2 = 1 };
SimdLevel simd_level() noexcept;  // the level in use: min(cap, what the CPU has)
SimdLevel set_simd_level(SimdLevel cap) noexcept;
const char* decoder_name() noexcept;  // "avx2" or "scalar"

// The AVX2 bulk step loop (rans_avx2.cc): decodes whole 32-symbol steps while at least 32
// words remain, starting at a step boundary. Returns the number of symbols decoded.
uint32_t decode_steps_avx2(BlockDecoder& d, const DecodeTable& t, uint8_t* out, uint32_t count) noexcept;
bool cpu_has_avx2() noexcept;

}  // namespace kdn::kernels::rans
