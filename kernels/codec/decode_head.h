// CPU decoding of one (layer, plane, head): the segment readers and the per-codec row loops,
// templated on where rows go (the canonical chunk, or a fused RoPE + engine scatter).
//
// A Sink provides
//   DType quant_type();              dtype dequantized rows are written in
//   void* quant_row(uint32_t t);     where the dequantized row of token t goes
//   void commit_quant(uint32_t t);   that row is complete
//   void* bits_row(uint32_t t);      where the exact element bits of token t go (raw, lossless,
//                                    the exact rows of a quantized plane)
//   void commit_bits(uint32_t t);
// Inputs come from a blob that validate_layer accepted; what validation cannot see (the rANS
// word stream, exponent deltas) is checked here and reported as kCorrupt.
#pragma once

#include "format.h"
#include "quant.h"
#include "rans.h"
#include "validate.h"

#include <kdn/common/model.h>
#include <kdn/common/status.h>
#include <kdn/kernels/cpu_rows.h>

#include <cstring>

namespace kdn::kernels::kvc1 {

// Symbols decoded per tile: bounded so every buffer lives on the stack.
constexpr uint32_t kTileSymbols = 4096;

// Reads the codes of one segment token row by token row, undoing the token-delta predictor.
class SegmentReader {
 public:
  // `sg` must come from a validated plane.
  bool open(const uint8_t* blob, const Header& h, const Segment& sg) noexcept;
  // The next `rows` token rows (rows * head_dim codes).
  bool read_rows(uint8_t* out, uint32_t rows) noexcept;
  // True once every symbol was read and the last rANS block ended cleanly.
  bool finish() noexcept;

 private:
  bool read(uint8_t* out, uint32_t n) noexcept;
  bool next_block() noexcept;
  void read_packed(uint8_t* out, uint32_t n) noexcept;
  void undo_token_delta(uint8_t* rows, uint32_t n_rows) noexcept;

  const uint8_t* blob_ = nullptr;
  Segment sg_{};
  uint32_t head_dim_ = 0;
  uint32_t done_ = 0;
  uint64_t bitpos_ = 0;
  uint32_t block_ = 0;
  rans::BlockDecoder dec_{};
  rans::DecodeTable table_;
  alignas(32) uint8_t select_[kMaxHeadDim];  // 0xff on token-delta channels, else 0
  alignas(32) uint8_t prev_[kMaxHeadDim];    // codes of the previous token row
};

inline uint32_t tile_tokens(uint32_t head_dim) { return head_dim >= kTileSymbols ? 1 : kTileSymbols / head_dim; }

inline Status stream_corrupt() { return Status(Code::kCorrupt, "KVC1 entropy-coded stream is corrupt"); }

template <class Sink>
Status decode_raw_head(const uint8_t* blob, const Header& h, const Plane& pl, uint32_t head, Sink& sink) {
  const size_t row_bytes = size_t{h.head_dim} * dtype_bytes_of(h.dtype);
  for (uint32_t t = 0; t < h.tokens; ++t) {
    std::memcpy(sink.bits_row(t), blob + pl.payload_off + (size_t{t} * h.kv_heads + head) * row_bytes, row_bytes);
    sink.commit_bits(t);
  }
  return OkStatus();
}

template <class Sink>
Status decode_quant_head(const uint8_t* blob, const Header& h, const Plane& pl, uint32_t head, Sink& sink) {
  Segment sg;
  SegmentReader reader;
  if (parse_segment(blob, h, pl, head, &sg) != kParseOk || !reader.open(blob, h, sg)) return stream_corrupt();
  alignas(32) uint8_t tile[kTileSymbols + 32];
  alignas(32) float rot[kMaxHeadDim];  // a rotated row (kTransformHadamard)
  const uint32_t per = pl.codec == kCodecUintChannel ? 1 : pl.group;
  const uint8_t* exact = blob + pl.params_off + exact_rows_offset(h, pl);
  const size_t row_bytes = size_t{h.head_dim} * dtype_bytes_of(h.dtype);
  const uint32_t tt = tile_tokens(h.head_dim);
  const uint32_t coded = coded_tokens(h, pl);
  for (uint32_t t = coded; t < h.tokens; ++t) {  // trailing exact rows: no codes in the segment
    std::memcpy(sink.bits_row(t), exact + (exact_row_of(pl, h.tokens, t) * h.kv_heads + head) * row_bytes, row_bytes);
    sink.commit_bits(t);
  }
  for (uint32_t t0 = 0; t0 < coded; t0 += tt) {
    const uint32_t rows = coded - t0 < tt ? coded - t0 : tt;
    if (!reader.read_rows(tile, rows)) return stream_corrupt();
    for (uint32_t r = 0; r < rows; ++r) {
      if (is_exact_token(pl, h.tokens, t0 + r)) {  // a leading exact row; its codes are placeholders
        const size_t e = exact_row_of(pl, h.tokens, t0 + r);
        std::memcpy(sink.bits_row(t0 + r), exact + (e * h.kv_heads + head) * row_bytes, row_bytes);
        sink.commit_bits(t0 + r);
        continue;
      }
      uint64_t s_off, z_off;
      row_scale_offsets(h, pl, t0 + r, head, &s_off, &z_off);
      const uint8_t* q = tile + size_t{r} * h.head_dim;
      const uint8_t* s = blob + pl.params_off + s_off;
      const uint8_t* z = blob + pl.params_off + z_off;
      if (pl.transform == kTransformHadamard) {
        // Dequantize in f32, rotate back, then round once to the sink's dtype.
        dequantize_row(q, h.head_dim, s, z, pl.scale_dtype, per, DType::kF32, rot);
        hadamard_row(rot, h.head_dim, hadamard_inverse_scale(h.head_dim));
        store_row_f32(rot, h.head_dim, sink.quant_type(), 1.0f, sink.quant_row(t0 + r));
      } else {
        dequantize_row(q, h.head_dim, s, z, pl.scale_dtype, per, sink.quant_type(), sink.quant_row(t0 + r));
      }
      sink.commit_quant(t0 + r);
    }
  }
  return reader.finish() ? OkStatus() : stream_corrupt();
}

// Reassembles element bits from byte planes (k = 0 most significant) and exponent references.
template <class Elem>
bool untransform_row(const uint8_t* const* planes, uint32_t n_planes, const uint8_t* emax, uint32_t n,
                     const ExponentField& f, Elem* out) {
  bool bad = false;
  for (uint32_t d = 0; d < n; ++d) {
    uint32_t rp = 0;
    for (uint32_t k = 0; k < n_planes; ++k) rp = (rp << 8) | planes[k][d];
    out[d] = static_cast<Elem>(untransform_element(rp, emax[d], f, &bad));
  }
  return !bad;
}

// untransform_row for 16-bit elements (two planes), vectorized where the CPU allows.
bool untransform_row16(const uint8_t* hi, const uint8_t* lo, const uint8_t* emax, uint32_t n, const ExponentField& f,
                       uint16_t* out) noexcept;

template <class Sink>
Status decode_byteplane_head(const uint8_t* blob, const Header& h, const Plane& pl, uint32_t head, Sink& sink) {
  constexpr uint32_t kMaxPlanes = 4;
  const uint32_t e = dtype_bytes_of(h.dtype);
  SegmentReader readers[kMaxPlanes];
  alignas(32) uint8_t tiles[kMaxPlanes][kTileSymbols];
  for (uint32_t k = 0; k < e; ++k) {
    Segment sg;
    if (parse_segment(blob, h, pl, head * e + k, &sg) != kParseOk || !readers[k].open(blob, h, sg))
      return stream_corrupt();
  }
  const ExponentField f = exponent_field(h.dtype);
  const uint8_t* emax = blob + pl.params_off + size_t{head} * h.head_dim;
  const uint32_t tt = tile_tokens(h.head_dim);
  for (uint32_t t0 = 0; t0 < h.tokens; t0 += tt) {
    const uint32_t rows = h.tokens - t0 < tt ? h.tokens - t0 : tt;
    for (uint32_t k = 0; k < e; ++k)
      if (!readers[k].read_rows(tiles[k], rows)) return stream_corrupt();
    for (uint32_t r = 0; r < rows; ++r) {
      const uint8_t* rowp[kMaxPlanes];
      for (uint32_t k = 0; k < e; ++k) rowp[k] = tiles[k] + size_t{r} * h.head_dim;
      void* dst = sink.bits_row(t0 + r);
      const bool ok = e == 4 ? untransform_row(rowp, e, emax, h.head_dim, f, static_cast<uint32_t*>(dst))
                             : untransform_row16(rowp[0], rowp[1], emax, h.head_dim, f, static_cast<uint16_t*>(dst));
      if (!ok) return stream_corrupt();
      sink.commit_bits(t0 + r);
    }
  }
  for (uint32_t k = 0; k < e; ++k)
    if (!readers[k].finish()) return stream_corrupt();
  return OkStatus();
}

template <class Sink>
Status decode_head(const uint8_t* blob, const Header& h, const Plane& pl, uint32_t head, Sink& sink) {
  switch (pl.codec) {
    case kCodecRaw:
      return decode_raw_head(blob, h, pl, head, sink);
    case kCodecBytePlanes:
      return decode_byteplane_head(blob, h, pl, head, sink);
    default:
      return decode_quant_head(blob, h, pl, head, sink);
  }
}

}  // namespace kdn::kernels::kvc1
