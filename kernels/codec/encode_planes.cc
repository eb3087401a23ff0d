// KVC1 encoder: plane records (parameters, segment directory) and segments (packed or rANS).
#include "encode_body.h"
#include "encoder.h"
#include "quant.h"
#include "rans.h"

#include <kdn/kernels/dtype.h>

#include <cmath>
#include <cstring>

namespace kdn::kernels::kvc1 {
namespace {

Status no_space() { return Status(Code::kNoSpace, "KVC1 output buffer too small"); }

size_t align64(size_t v) { return (v + 63) & ~size_t{63}; }

// ---- packing ------------------------------------------------------------------------------

void pack_codes(const uint8_t* sym, uint32_t n, uint32_t bits, uint8_t* dst) {
  const uint64_t words = (uint64_t{n} * bits + 31) / 32;
  std::memset(dst, 0, 4 * words);
  if (bits == 8) {  // one code per byte, in order: the stream is the codes
    std::memcpy(dst, sym, n);
    return;
  }
  if (bits == 4) {  // two codes per byte, the first in the low nibble
    for (uint32_t i = 0; i + 1 < n; i += 2) dst[i / 2] = static_cast<uint8_t>(sym[i] | (sym[i + 1] << 4));
    if (n % 2) dst[n / 2] = sym[n - 1];
    return;
  }
  pack_codes_body(sym, n, bits, dst);
}

Status write_packed(const uint8_t* sym, uint32_t n, uint32_t bits, OutBuf& out) {
  const uint64_t words = (uint64_t{n} * bits + 31) / 32;
  if (!out.reserve(kSegmentHeaderBytes + 4 * words)) return no_space();
  const size_t at = out.pos;
  out.zeros(kSegmentHeaderBytes);
  out.data[at] = kCodingPacked;
  out.data[at + 1] = static_cast<uint8_t>(bits);
  out.st32(at + 4, n);
  pack_codes(sym, n, bits, out.data + out.pos);
  out.pos += 4 * words;
  return OkStatus();
}

// ---- rANS segments ----------------------------------------------------------------------------

// Writes the segment as rANS if it fits in fewer than `limit` bytes. Returns false (leaving
// out.pos unchanged) when it does not fit, either budget-wise or in the buffer.
// `counts` is the histogram of sym (2^bits entries).
bool try_rans(const uint8_t* sym, uint32_t n, uint32_t bits, const uint32_t* counts, uint32_t block_symbols,
              const uint8_t* mask, uint32_t mask_bytes, uint64_t limit, EncodeScratch& sc, OutBuf& out) {
  uint32_t n_syms = 0;
  for (uint32_t s = 0; s < (1u << bits); ++s)
    if (counts[s]) n_syms = s + 1;
  uint16_t freq[rans::kMaxSymbols];
  rans::EncodeTable table;
  if (!rans::normalize_frequencies(counts, n_syms, freq) || !rans::build_encode_table(freq, n_syms, &table))
    return false;
  const uint32_t n_blocks = (n + block_symbols - 1) / block_symbols;
  const size_t start = out.pos;
  const uint64_t table_off = kSegmentHeaderBytes + (mask ? align16(mask_bytes) : 0);
  const uint64_t desc_off = align16(table_off + 2ull * n_syms);
  uint64_t words_off = align16(desc_off + uint64_t{n_blocks} * kBlockDescBytes);
  if (words_off >= limit || !out.reserve(words_off)) return false;
  out.zeros(static_cast<size_t>(words_off));
  uint8_t* seg = out.data + start;
  seg[0] = kCodingRans;
  seg[1] = static_cast<uint8_t>(bits);
  out.st16(start + 2, static_cast<uint16_t>(n_syms));
  out.st32(start + 4, n);
  out.st32(start + 8, n_blocks);
  if (mask) {
    seg[12] = kPredictTokenDelta;
    std::memcpy(seg + kSegmentHeaderBytes, mask, mask_bytes);
  }
  for (uint32_t s = 0; s < n_syms; ++s) out.st16(start + table_off + 2 * s, freq[s]);
  uint64_t end = words_off;
  for (uint32_t b = 0; b < n_blocks; ++b) {
    const uint32_t first = b * block_symbols;
    const uint32_t count = n - first < block_symbols ? n - first : block_symbols;
    rans::EncodedBlock eb;
    if (!rans::encode_block(sym + first, count, table, sc.stack, sc.stack_words, &eb)) break;
    const uint64_t off = align16(end);
    end = off + 2ull * eb.n_words;
    if (end >= limit || !out.reserve(end - (out.pos - start))) break;
    out.zeros(static_cast<size_t>(off - (out.pos - start)));
    out.put(eb.words, 2ull * eb.n_words);
    const size_t d = start + desc_off + size_t{b} * kBlockDescBytes;
    out.st32(d, eb.n_words);
    out.st32(d + 4, static_cast<uint32_t>(off));
    for (uint32_t j = 0; j < rans::kLanes; ++j) out.st32(d + 8 + 4 * j, eb.state[j]);
    if (b + 1 == n_blocks) return true;
  }
  out.pos = start;
  return false;
}

// ---- plane parameters and symbols -------------------------------------------------------------

Status write_segments(const Source& src, const Header& hdr, const Plane& pl, const EncodePlan& plan, EncodeScratch& sc,
                      OutBuf& out) {
  const size_t payload = out.pos;
  const uint32_t n_seg = expected_segments(hdr, pl.codec);
  const uint32_t e = dtype_size(src.g.dtype);
  if (!out.zeros(size_t{n_seg} * kSegmentDirEntryBytes)) return no_space();
  for (uint32_t s = 0; s < n_seg; ++s) {
    if (!out.pad16()) return no_space();
    const size_t seg = out.pos;
    if (pl.codec == kCodecBytePlanes)
      byte_plane_symbols(src, out.data + pl.params_off + (s / e) * hdr.head_dim, s / e, s % e, sc.symbols);
    else
      quantize_head(src, hdr, pl, out.data + pl.params_off, s, sc);
    KDN_RETURN_IF_ERROR(write_segment(coded_tokens(hdr, pl), hdr.head_dim, pl.bits, plan, sc, out));
    out.st32(payload + 8 * size_t{s}, static_cast<uint32_t>(seg - payload));
    out.st32(payload + 8 * size_t{s} + 4, static_cast<uint32_t>(out.pos - seg));
  }
  return OkStatus();
}

}  // namespace

bool OutBuf::put(const void* src, size_t n) {
  if (!reserve(n)) return false;
  if (n) std::memcpy(data + pos, src, n);
  pos += n;
  return true;
}

bool OutBuf::zeros(size_t n) {
  if (!reserve(n)) return false;
  if (n) std::memset(data + pos, 0, n);
  pos += n;
  return true;
}

void OutBuf::st16(size_t at, uint16_t v) { std::memcpy(data + at, &v, 2); }
void OutBuf::st32(size_t at, uint32_t v) { std::memcpy(data + at, &v, 4); }
void OutBuf::st64(size_t at, uint64_t v) { std::memcpy(data + at, &v, 8); }

size_t encode_scratch_bytes(const ChunkGeometry& g, uint32_t block_tokens) noexcept {
  // 64 bytes of slack to align the caller's buffer; every part 64-byte aligned after that.
  return 64 + 2 * align64(size_t{g.tokens} * g.head_dim) + align64(2 * size_t{block_tokens} * g.head_dim) +
         3 * align64(4 * size_t{g.head_dim}) + 2 * align64(8 * size_t{g.head_dim}) +
         2 * align64(4 * size_t{g.head_dim} * rans::kMaxSymbols);
}

bool carve_scratch(void* scratch, size_t bytes, const ChunkGeometry& g, uint32_t block_tokens,
                   EncodeScratch* out) noexcept {
  if (!scratch || bytes < encode_scratch_bytes(g, block_tokens)) return false;
  auto* p = reinterpret_cast<uint8_t*>(align64(reinterpret_cast<uintptr_t>(scratch)));
  auto take = [&p](size_t n) {
    uint8_t* at = p;
    p += align64(n);
    return at;
  };
  const size_t d = g.head_dim;
  out->symbols = take(size_t{g.tokens} * d);
  out->residuals = take(size_t{g.tokens} * d);
  out->stack = reinterpret_cast<uint16_t*>(take(2 * size_t{block_tokens} * d));
  out->stack_words = block_tokens * g.head_dim;
  out->lo = reinterpret_cast<float*>(take(4 * d));
  out->hi = reinterpret_cast<float*>(take(4 * d));
  out->row = reinterpret_cast<float*>(take(4 * d));
  out->cost_plain = reinterpret_cast<uint64_t*>(take(8 * d));
  out->cost_delta = reinterpret_cast<uint64_t*>(take(8 * d));
  out->hist_plain = reinterpret_cast<uint32_t*>(take(4 * d * rans::kMaxSymbols));
  out->hist_delta = reinterpret_cast<uint32_t*>(take(4 * d * rans::kMaxSymbols));
  return true;
}

Status write_segment(uint32_t tokens, uint32_t head_dim, uint32_t bits, const EncodePlan& plan, EncodeScratch& sc,
                     OutBuf& out) noexcept {
  const uint32_t n = tokens * head_dim;
  const uint64_t packed = kSegmentHeaderBytes + 4 * ((uint64_t{n} * bits + 31) / 32);
  if (!plan.entropy) return write_packed(sc.symbols, n, bits, out);
  uint8_t mask[kMaxHeadDim / 8];
  const uint32_t mask_bytes = (head_dim + 7) / 8;
  const uint8_t* sym = sc.symbols;
  uint32_t counts[rans::kMaxSymbols];
  if (!plan.token_delta) {
    count_symbols(sc.symbols, n, 1u << bits, counts);
  } else if (choose_predicted_channels(sc.symbols, tokens, head_dim, bits, sc, mask, counts)) {
    apply_token_delta(sc.symbols, tokens, head_dim, static_cast<uint8_t>((1u << bits) - 1), mask, sc.residuals);
    sym = sc.residuals;
  }
  const uint8_t* used_mask = sym == sc.residuals ? mask : nullptr;
  if (try_rans(sym, n, bits, counts, plan.block_tokens * head_dim, used_mask, mask_bytes, packed, sc, out))
    return OkStatus();
  return write_packed(sc.symbols, n, bits, out);
}

namespace {

Status write_plane_as(const ChunkGeometry& g, const void* chunk, uint32_t layer, uint32_t plane, const PlaneSpec& spec,
                      const EncodePlan& plan, EncodeScratch& scratch, OutBuf& out) {
  const Source src{chunk, g, layer, plane};
  const Header hdr = geometry_header(g);
  Plane pl = spec_plane(spec, 0);  // write_quant_params sets the scales' dtype
  const size_t at = out.pos;
  if (!out.zeros(kPlaneHeaderBytes)) return no_space();
  pl.params_off = out.pos;
  if (spec.codec == kCodecBytePlanes) {
    pl.params_bytes = g.kv_heads * g.head_dim;
    if (!out.reserve(pl.params_bytes)) return no_space();
    write_exponent_refs(src, out.data + out.pos);
    out.pos += pl.params_bytes;
  } else if (spec.codec != kCodecRaw) {
    KDN_RETURN_IF_ERROR(write_quant_params(src, hdr, pl, plan, scratch, out));
  }
  if (!out.pad16()) return no_space();
  const size_t payload = out.pos;
  if (spec.codec == kCodecRaw) {
    const size_t bytes = size_t{g.tokens} * g.kv_heads * g.head_dim * dtype_size(g.dtype);
    if (!out.put(static_cast<const uint8_t*>(chunk) + src.index(0, 0, 0) * dtype_size(g.dtype), bytes))
      return no_space();
  } else {
    KDN_RETURN_IF_ERROR(write_segments(src, hdr, pl, plan, scratch, out));
  }
  out.data[at] = pl.codec;
  out.data[at + 1] = pl.bits;
  out.data[at + 2] = pl.scale_dtype;
  out.data[at + 3] = pl.transform;
  out.st32(at + 4, pl.group);
  out.st32(at + 8, expected_segments(hdr, pl.codec));
  out.st32(at + 12, pl.params_bytes);
  out.st32(at + 16, static_cast<uint32_t>(out.pos - payload));
  out.st32(at + 20, pl.exact_tokens);
  out.st32(at + 24, pl.exact_tail_tokens);
  return out.pad16() ? OkStatus() : no_space();
}

}  // namespace

Status write_plane(const ChunkGeometry& g, const void* chunk, uint32_t layer, uint32_t plane, PlaneSpec& spec,
                   const EncodePlan& plan, EncodeScratch& scratch, OutBuf& out) noexcept {
  const size_t at = out.pos;
  KDN_RETURN_IF_ERROR(write_plane_as(g, chunk, layer, plane, spec, plan, scratch, out));
  // Lossless planes that do not beat the raw bytes are stored raw: also lossless, and faster.
  const PlaneSpec raw{kCodecRaw, 0, 0};
  if (spec.codec == kCodecBytePlanes && out.pos - at >= plane_max_bytes(g, raw)) {
    out.pos = at;
    spec = raw;
    return write_plane_as(g, chunk, layer, plane, spec, plan, scratch, out);
  }
  return OkStatus();
}

}  // namespace kdn::kernels::kvc1
