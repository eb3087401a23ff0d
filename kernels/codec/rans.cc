#include "rans.h"

#include <atomic>
#include <cstring>

namespace kdn::kernels::rans {
namespace {

// The widest bulk loop decode_symbols may use. Relaxed: a plain switch read once per call;
// tests change it between decodes on one thread, so no ordering with other data is needed.
std::atomic<uint32_t> g_simd_cap{static_cast<uint32_t>(SimdLevel::kAvx2)};

uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

}  // namespace

bool normalize_frequencies(const uint32_t* counts, uint32_t n_syms, uint16_t* freq) noexcept {
  return normalize_body(counts, n_syms, freq);
}

bool build_encode_table(const uint16_t* freq, uint32_t n_syms, EncodeTable* t) noexcept {
  if (n_syms > kMaxSymbols) return false;
  uint32_t c = 0;
  t->n_syms = n_syms;
  for (uint32_t s = 0; s < kMaxSymbols; ++s) {
    const uint32_t f = s < n_syms ? freq[s] : 0;
    t->fc[s] = f ? f | (c << 16) : 0;
    c += f;
  }
  return c == kProbScale;
}

namespace {

bool encode_scalar(const uint8_t* sym, uint32_t lo, uint32_t hi, const EncodeTable& t, uint32_t* x, uint16_t* stack,
                   uint32_t* top) {
  return encode_reverse(sym, lo, hi, t.fc, x, stack, top);
}

}  // namespace

bool encode_block(const uint8_t* sym, uint32_t n, const EncodeTable& t, uint16_t* stack, uint32_t stack_words,
                  EncodedBlock* out) noexcept {
  if (stack_words < n) return false;
  uint32_t x[kLanes];
  for (uint32_t j = 0; j < kLanes; ++j) x[j] = kLower;
  uint32_t top = stack_words;
  // The last, partial step first (the encoder runs backwards), then whole steps.
  const uint32_t whole = n / kLanes;
  if (!encode_scalar(sym, whole * kLanes, n, t, x, stack, &top)) return false;
  uint32_t left = whole;
  if (simd_level() == SimdLevel::kAvx2) left -= encode_steps_avx2(sym, whole, t, x, stack, &top);
  if (!encode_scalar(sym, 0, left * kLanes, t, x, stack, &top)) return false;
  for (uint32_t j = 0; j < kLanes; ++j) out->state[j] = x[j];
  out->words = stack + top;
  out->n_words = stack_words - top;
  return true;
}

bool encode_block(const uint8_t* sym, uint32_t n, const uint16_t* freq, const uint16_t* cum, uint32_t n_syms,
                  uint16_t* stack, uint32_t stack_words, EncodedBlock* out) noexcept {
  EncodeTable t;
  if (!build_encode_table(freq, n_syms, &t)) return false;
  for (uint32_t s = 0; s < n_syms; ++s)
    if (t.fc[s] && (t.fc[s] >> 16) != cum[s]) return false;
  return encode_block(sym, n, t, stack, stack_words, out);
}

bool build_decode_table(const uint16_t* freq, uint32_t n_syms, uint32_t bits, DecodeTable* t) noexcept {
  if (bits == 0 || bits > 8 || n_syms == 0 || n_syms > (1u << bits)) return false;
  if (!build_cumulative(freq, n_syms, t->cum)) return false;
  t->n_syms = n_syms;
  t->bits = bits;
  for (uint32_t s = 0; s < n_syms; ++s) t->fc[s] = freq[s] | (uint32_t{t->cum[s]} << 16);
  for (uint32_t s = n_syms; s < kMaxSymbols; ++s) t->fc[s] = 0;
  for (uint32_t k = 0; k < 16; ++k) t->cum_minus1[k] = k < n_syms ? int32_t{t->cum[k]} - 1 : 4095;
  // The scalar decoder looks every slot up here (the SIMD one only for bits > 4): 4 KiB of
  // memset per segment, against a compare loop per symbol.
  for (uint32_t s = 0; s < n_syms; ++s) std::memset(t->lut + t->cum[s], static_cast<int>(s), freq[s]);
  std::memset(t->lut + kProbScale, 0, 4);
  return true;
}

void start_block(BlockDecoder* d, const uint8_t* states, const uint8_t* words, uint32_t n_words,
                 uint32_t n_symbols) noexcept {
  for (uint32_t j = 0; j < kLanes; ++j) d->x[j] = load_u32(states + 4 * j);
  d->words = words;
  d->n_words = n_words;
  d->p = 0;
  d->next = 0;
  d->n_symbols = n_symbols;
}

bool decode_symbols_scalar(BlockDecoder& d, const DecodeTable& t, uint8_t* out, uint32_t count) noexcept {
  // Locals, not the decoder's fields: `out` may alias anything, which would otherwise force
  // every field back to memory on each symbol.
  uint32_t x[kLanes];
  std::memcpy(x, d.x, sizeof x);
  const uint8_t* words = d.words;
  const uint32_t n_words = d.n_words;
  uint32_t p = d.p;
  uint32_t lane = d.next % kLanes;
  bool ok = true;
  uint32_t k = 0;
  for (; k < count; ++k) {
    uint32_t xl = x[lane];
    const uint32_t slot = xl & (kProbScale - 1);
    const uint32_t y = t.lut[slot];
    xl = decode_advance(xl, t.fc[y] & 0xffffu, t.fc[y] >> 16);
    if (xl < kLower) {
      if (p >= n_words) {
        ok = false;
        break;
      }
      xl = (xl << 16) | load_u16(words + 2 * size_t{p});
      ++p;
    }
    x[lane] = xl;
    out[k] = static_cast<uint8_t>(y);
    lane = (lane + 1) % kLanes;
  }
  std::memcpy(d.x, x, sizeof x);
  d.p = p;
  d.next += k;
  return ok;
}

bool decode_symbols(BlockDecoder& d, const DecodeTable& t, uint8_t* out, uint32_t count) noexcept {
  if (count > d.n_symbols - d.next) return false;
  uint32_t done = 0;
  // The bulk loop starts at a step boundary; a tile that starts mid-step goes scalar first.
  if (d.next % kLanes != 0) {
    const uint32_t head = kLanes - d.next % kLanes < count ? kLanes - d.next % kLanes : count;
    if (!decode_symbols_scalar(d, t, out, head)) return false;
    done = head;
  }
  if (simd_level() == SimdLevel::kAvx2) done += decode_steps_avx2(d, t, out + done, count - done);
  return decode_symbols_scalar(d, t, out + done, count - done);
}

bool block_finished_cleanly(const BlockDecoder& d) noexcept {
  if (d.next != d.n_symbols || d.p != d.n_words) return false;
  for (uint32_t j = 0; j < kLanes; ++j)
    if (d.x[j] != kLower) return false;
  return true;
}

SimdLevel simd_level() noexcept {
  const uint32_t cap = g_simd_cap.load(std::memory_order_relaxed);
  return cap >= static_cast<uint32_t>(SimdLevel::kAvx2) && cpu_has_avx2() ? SimdLevel::kAvx2 : SimdLevel::kScalar;
}

SimdLevel set_simd_level(SimdLevel cap) noexcept {
  return static_cast<SimdLevel>(g_simd_cap.exchange(static_cast<uint32_t>(cap), std::memory_order_relaxed));
}

const char* decoder_name() noexcept { return simd_level() == SimdLevel::kAvx2 ? "avx2" : "scalar"; }

}  // namespace kdn::kernels::rans
