// The KVC1 encoder as the CUDA encoder runs it (encode_cuda.cu), written once as host-and-device
// stages so that the same code runs on the CPU in tests (encode_emulation_test.cc) and must give
// kvc1_encode's blob byte for byte. The per-element bodies — scale rounding, quantization,
// Hadamard rows, the token-delta choice, frequency normalization, the rANS step, packing — are
// the CPU encoder's own (quant.h, rans.h, encode_body.h).
//
// A batch of chunks is encoded in stages, each a launch over independent units:
//   1. params   per (chunk, layer, plane): quantizer scales (f16, else f32) and exact rows
//   2. segment  per (chunk, layer, plane, head): codes, predictor choice, rANS or packing, into
//               a fixed-size slot
//   3. layout   per chunk: the canonical offsets of every plane (a walk over sizes only)
//   4. place    per (chunk, layer, plane), split over threads: plane header, parameters,
//               segment directory and segments copied to their offsets
//   5. crc      per (chunk, layer): the record's CRC32C and its directory entry
//   6. header   per chunk: the directory CRC and the file header
// The output buffers arrive zeroed (every padding byte of the format is zero).
#pragma once

#include "encode_body.h"
#include "format.h"
#include "quant.h"
#include "rans.h"

#include <kdn/common/model.h>
#include <kdn/kernels/dtype.h>
#include <kdn/kernels/hd.h>
#include <kdn/kernels/layout.h>

#include <cstdint>

namespace kdn::kernels::kvc1 {

// Error bits of the device-side result word.
constexpr uint32_t kEncErrorNonFinite = 1;  // NaN or Inf in a chunk to quantize
constexpr uint32_t kEncErrorRange = 2;      // values span more than fp32 scales can hold
constexpr uint32_t kEncErrorInternal = 4;   // an rANS table that could not be built

// What one plane is coded with (the host's plane_spec, per layer and plane).
struct DevicePlaneSpec {
  uint8_t codec, bits, transform, pad;
  uint32_t group, exact_tokens, exact_tail_tokens;
};

// Results of the params stage and the layout stage, per (chunk, layer, plane).
struct PlaneMeta {
  uint32_t scale_dtype, params_bytes;
  uint64_t offset;         // blob offset of the plane header
  uint64_t payload_bytes;  // segment directory and segments
};

struct EncodeJob {
  const uint8_t* const* chunks;  // n canonical chunks
  uint8_t* const* outs;          // n zeroed outputs
  uint64_t* written;             // n blob sizes
  uint32_t* error;               // the result word
  const DevicePlaneSpec* specs;  // [layers][2]
  PlaneMeta* meta;               // [n][layers][2]
  uint8_t* params;               // [n][layers][2] slots of params_slot bytes
  uint8_t* segments;             // [n][layers][2][kv_heads] slots of seg_slot bytes
  uint64_t* seg_bytes;           // [n][layers][2][kv_heads]
  uint8_t* work;                 // [n][layers][2][kv_heads] areas of seg_work bytes
  uint64_t params_slot, seg_slot, seg_work;
  uint32_t n_chunks, layers, kv_heads, head_dim, tokens, dtype;
  uint32_t mode, block_tokens, version_minor, max_syms;
  uint32_t entropy, token_delta, f32_scales;
  int64_t pos_base;
  uint64_t fingerprint_lo, fingerprint_hi, chunk_key_lo, chunk_key_hi;
};

// ---- small helpers -----------------------------------------------------------------------------

KDN_HD_INLINE void st16_at(uint8_t* p, uint16_t v) { memcpy(p, &v, 2); }
KDN_HD_INLINE void st32_at(uint8_t* p, uint32_t v) { memcpy(p, &v, 4); }
KDN_HD_INLINE void st64_at(uint8_t* p, uint64_t v) { memcpy(p, &v, 8); }

KDN_HD_INLINE void flag_error(uint32_t* word, uint32_t bits) {
#if defined(__CUDA_ARCH__)
  atomicOr(word, bits);
#else
  __atomic_fetch_or(word, bits, __ATOMIC_RELAXED);
#endif
}

KDN_HD_INLINE uint64_t plane_unit(const EncodeJob& j, uint32_t c, uint32_t lp) {
  return uint64_t{c} * j.layers * 2 + lp;
}
KDN_HD_INLINE uint64_t seg_unit(const EncodeJob& j, uint32_t c, uint32_t lp, uint32_t h) {
  return plane_unit(j, c, lp) * j.kv_heads + h;
}

KDN_HD_INLINE ChunkGeometry job_geometry(const EncodeJob& j) {
  ChunkGeometry g;
  g.layers = j.layers;
  g.kv_heads = j.kv_heads;
  g.head_dim = j.head_dim;
  g.tokens = j.tokens;
  g.dtype = static_cast<DType>(j.dtype);
  return g;
}

KDN_HD_INLINE Header job_header(const EncodeJob& j) {
  Header h{};
  h.tokens = j.tokens;
  h.layers = j.layers;
  h.kv_heads = j.kv_heads;
  h.head_dim = j.head_dim;
  h.dtype = static_cast<uint8_t>(j.dtype);
  return h;
}

KDN_HD_INLINE Plane job_plane(const EncodeJob& j, uint32_t c, uint32_t lp) {
  const DevicePlaneSpec& s = j.specs[lp];
  Plane pl{};
  pl.codec = s.codec;
  pl.bits = s.bits;
  pl.transform = s.transform;
  pl.group = s.group;
  pl.exact_tokens = s.exact_tokens;
  pl.exact_tail_tokens = s.exact_tail_tokens;
  pl.scale_dtype = static_cast<uint8_t>(j.meta[plane_unit(j, c, lp)].scale_dtype);
  pl.params_bytes = j.meta[plane_unit(j, c, lp)].params_bytes;
  return pl;
}

// Element (t, h, d) of plane `plane` of `layer` as f32.
KDN_HD_INLINE float source_value(const EncodeJob& j, const uint8_t* chunk, uint32_t lp, uint32_t t, uint32_t h,
                                 uint32_t d) {
  const ChunkGeometry g = job_geometry(j);
  return load_f32(chunk, chunk_offset(g, lp / 2, lp % 2, t, h, d), g.dtype, 1.0f);
}

// Row (t, h) into row[head_dim] as f32; false if it holds a NaN or an infinity.
KDN_HD_INLINE bool source_row(const EncodeJob& j, const uint8_t* chunk, uint32_t lp, uint32_t t, uint32_t h,
                              float* row) {
  bool finite = true;
  for (uint32_t d = 0; d < j.head_dim; ++d) {
    row[d] = source_value(j, chunk, lp, t, h, d);
    finite = finite && finite_f32(row[d]);
  }
  return finite;
}

// Work area of a segment: codes, residuals, rANS stack, predictor scratch, a row of f32.
struct SegmentWork {
  uint8_t* codes;
  uint8_t* residuals;
  uint16_t* stack;
  uint32_t stack_words;
  ChoiceScratch choice;
  float* row;
};

KDN_HD_INLINE uint64_t segment_work_bytes(uint32_t tokens, uint32_t head_dim, uint32_t block_tokens,
                                          uint32_t max_syms) {
  const uint64_t td = align16(uint64_t{tokens} * head_dim);
  return 2 * td + align16(2ull * block_tokens * head_dim) + 2 * align16(8ull * head_dim) +
         2 * align16(4ull * head_dim * max_syms) + align16(4ull * head_dim);
}

KDN_HD_INLINE SegmentWork segment_work(const EncodeJob& j, uint64_t unit) {
  uint8_t* p = j.work + unit * j.seg_work;
  const uint64_t td = align16(uint64_t{j.tokens} * j.head_dim);
  SegmentWork w;
  w.codes = p;
  w.residuals = p + td;
  p += 2 * td;
  w.stack = reinterpret_cast<uint16_t*>(p);
  w.stack_words = j.block_tokens * j.head_dim;
  p += align16(2ull * j.block_tokens * j.head_dim);
  w.choice.cost_plain = reinterpret_cast<uint64_t*>(p);
  p += align16(8ull * j.head_dim);
  w.choice.cost_delta = reinterpret_cast<uint64_t*>(p);
  p += align16(8ull * j.head_dim);
  w.choice.hist_plain = reinterpret_cast<uint32_t*>(p);
  p += align16(4ull * j.head_dim * j.max_syms);
  w.choice.hist_delta = reinterpret_cast<uint32_t*>(p);
  p += align16(4ull * j.head_dim * j.max_syms);
  w.row = reinterpret_cast<float*>(p);
  return w;
}

// ---- stage 1: quantizer parameters ------------------------------------------------------------

KDN_HD_INLINE bool store_group_at(float lo, float hi, uint32_t bits, uint8_t sd, uint8_t* params, uint64_t i,
                                  uint64_t per_array) {
  GroupScale gs;
  if (!group_scale_body(lo, hi, bits, sd, &gs)) return false;
  const uint32_t sb = scale_bytes(sd);
  if (sd == kScaleF16) {
    st16_at(params + sb * i, static_cast<uint16_t>(gs.s_bits));
    st16_at(params + sb * (per_array + i), static_cast<uint16_t>(gs.z_bits));
  } else {
    st32_at(params + sb * i, gs.s_bits);
    st32_at(params + sb * (per_array + i), gs.z_bits);
  }
  return true;
}

// K of the kivi modes: per (head, token group, channel) over the group's quantized tokens,
// each channel's range in token order. Sets *non_finite and returns early on NaN or Inf.
KDN_HD_INLINE bool channel_scales(const EncodeJob& j, const uint8_t* chunk, uint32_t lp, const Plane& pl, uint8_t sd,
                                  uint8_t* params, bool* non_finite) {
  const uint32_t ng = (j.tokens + pl.group - 1) / pl.group;
  const uint64_t per_array = uint64_t{j.kv_heads} * ng * j.head_dim;
  const uint32_t quant_end = j.tokens - pl.exact_tail_tokens;
  for (uint32_t h = 0; h < j.kv_heads; ++h)
    for (uint32_t gi = 0; gi < ng; ++gi) {
      const uint32_t t1 = (gi + 1) * pl.group < quant_end ? (gi + 1) * pl.group : quant_end;
      const uint32_t t0 = gi * pl.group > pl.exact_tokens ? gi * pl.group : pl.exact_tokens;
      if (t0 >= t1) continue;  // every token of the group is exact: S = Z = 0
      for (uint32_t d = 0; d < j.head_dim; ++d) {
        float lo = bits_as<float>(0x7f800000u), hi = bits_as<float>(0xff800000u);
        for (uint32_t t = t0; t < t1; ++t) {
          const float x = source_value(j, chunk, lp, t, h, d);
          if (!finite_f32(x)) {
            *non_finite = true;
            return true;
          }
          lo = x < lo ? x : lo;
          hi = x > hi ? x : hi;
        }
        if (!store_group_at(lo, hi, pl.bits, sd, params, (uint64_t{h} * ng + gi) * j.head_dim + d, per_array))
          return false;
      }
    }
  return true;
}

// V, and int8 K: per (token, head, channel group), after the row's transform.
KDN_HD_INLINE bool token_scales(const EncodeJob& j, const uint8_t* chunk, uint32_t lp, const Plane& pl, uint8_t sd,
                                float* row, uint8_t* params, bool* non_finite) {
  const uint32_t ng = j.head_dim / pl.group;
  const uint64_t per_array = uint64_t{j.tokens} * j.kv_heads * ng;
  for (uint32_t t = 0; t < j.tokens; ++t)
    for (uint32_t h = 0; h < j.kv_heads; ++h) {
      if (is_exact_token(pl, j.tokens, t)) continue;
      if (!source_row(j, chunk, lp, t, h, row)) {
        *non_finite = true;
        return true;
      }
      if (pl.transform == kTransformHadamard) hadamard_inplace(row, j.head_dim);
      for (uint32_t gi = 0; gi < ng; ++gi) {
        float lo = bits_as<float>(0x7f800000u), hi = bits_as<float>(0xff800000u);
        for (uint32_t d = gi * pl.group; d < (gi + 1) * pl.group; ++d) {
          lo = row[d] < lo ? row[d] : lo;
          hi = row[d] > hi ? row[d] : hi;
        }
        if (!store_group_at(lo, hi, pl.bits, sd, params, (uint64_t{t} * j.kv_heads + h) * ng + gi, per_array))
          return false;
      }
    }
  return true;
}

// The exact rows E[row][h][d] in the chunk dtype; false if one holds NaN or Inf.
KDN_HD_INLINE bool exact_rows_into(const EncodeJob& j, const uint8_t* chunk, uint32_t lp, const Plane& pl, float* row,
                                   uint8_t* at) {
  const ChunkGeometry g = job_geometry(j);
  const uint32_t eb = dtype_size(g.dtype);
  for (uint32_t t = 0; t < j.tokens; ++t) {
    if (!is_exact_token(pl, j.tokens, t)) continue;
    for (uint32_t h = 0; h < j.kv_heads; ++h) {
      if (!source_row(j, chunk, lp, t, h, row)) return false;
      const uint8_t* src = chunk + chunk_offset(g, lp / 2, lp % 2, t, h, 0) * eb;
      for (uint32_t i = 0; i < j.head_dim * eb; ++i) at[i] = src[i];
      at += j.head_dim * eb;
    }
  }
  return true;
}

KDN_HD_INLINE void enc_params(const EncodeJob& j, uint32_t c, uint32_t lp) {
  const uint64_t unit = plane_unit(j, c, lp);
  uint8_t* params = j.params + unit * j.params_slot;
  const Header hdr = job_header(j);
  Plane pl = job_plane(j, c, lp);
  float* row = segment_work(j, unit * j.kv_heads).row;
  for (uint32_t pass = 0; pass < 2; ++pass) {
    const uint8_t sd = pass == 0 ? kScaleF16 : kScaleF32;
    if (sd == kScaleF16 && j.f32_scales) continue;
    pl.scale_dtype = sd;
    const uint64_t bytes = quant_params_bytes(hdr, pl);
    for (uint64_t i = 0; i < bytes; ++i) params[i] = 0;
    bool non_finite = false;
    const bool fits = pl.codec == kCodecUintChannel
                          ? channel_scales(j, j.chunks[c], lp, pl, sd, params, &non_finite)
                          : token_scales(j, j.chunks[c], lp, pl, sd, row, params, &non_finite);
    if (!non_finite && exact_rows(pl))
      non_finite = !exact_rows_into(j, j.chunks[c], lp, pl, row, params + exact_rows_offset(hdr, pl));
    if (non_finite) break;
    if (fits) {
      j.meta[unit].scale_dtype = sd;
      j.meta[unit].params_bytes = static_cast<uint32_t>(bytes);
      return;
    }
    if (pass == 1) {
      flag_error(j.error, kEncErrorRange);
      return;
    }
  }
  flag_error(j.error, kEncErrorNonFinite);
}

// ---- stage 2: segments -------------------------------------------------------------------------

// Codes of head h, token-major, with the stored parameters (quantize_head's definition).
KDN_HD_INLINE void quantize_codes(const EncodeJob& j, uint32_t c, uint32_t lp, uint32_t h, const Plane& pl,
                                  const SegmentWork& w) {
  const Header hdr = job_header(j);
  const uint8_t* params = j.params + plane_unit(j, c, lp) * j.params_slot;
  const uint32_t qmax = (1u << pl.bits) - 1;
  for (uint32_t t = 0; t < coded_tokens(hdr, pl); ++t) {
    uint8_t* codes = w.codes + uint64_t{t} * j.head_dim;
    if (is_exact_token(pl, j.tokens, t)) {
      for (uint32_t d = 0; d < j.head_dim; ++d) codes[d] = 0;
      continue;
    }
    uint64_t s_off, z_off;
    row_scale_offsets(hdr, pl, t, h, &s_off, &z_off);
    source_row(j, j.chunks[c], lp, t, h, w.row);
    if (pl.transform == kTransformHadamard) hadamard_inplace(w.row, j.head_dim);
    const uint32_t per = pl.codec == kCodecUintChannel ? 1 : pl.group;
    for (uint32_t d = 0; d < j.head_dim; ++d) {
      const float s = load_scale(params + s_off, d / per, pl.scale_dtype);
      const float z = load_scale(params + z_off, d / per, pl.scale_dtype);
      codes[d] = static_cast<uint8_t>(quantize_value(w.row[d], s, z, qmax));
    }
  }
}

// Packed segment at seg; returns its bytes.
KDN_HD_INLINE uint64_t packed_segment(const uint8_t* sym, uint32_t n, uint32_t bits, uint8_t* seg) {
  for (uint32_t i = 0; i < kSegmentHeaderBytes; ++i) seg[i] = 0;
  seg[0] = kCodingPacked;
  seg[1] = static_cast<uint8_t>(bits);
  st32_at(seg + 4, n);
  pack_codes_body(sym, n, bits, seg + kSegmentHeaderBytes);
  return kSegmentHeaderBytes + 4 * ((uint64_t{n} * bits + 31) / 32);
}

// try_rans (encode_planes.cc): the rANS segment at seg if it is smaller than `limit`; else 0.
KDN_HD_INLINE uint64_t rans_segment(const uint8_t* sym, uint32_t n, uint32_t bits, const uint32_t* counts,
                                    uint32_t block_symbols, const uint8_t* mask, uint32_t mask_bytes, uint64_t limit,
                                    const SegmentWork& w, uint8_t* seg) {
  uint32_t n_syms = 0;
  for (uint32_t s = 0; s < (1u << bits); ++s)
    if (counts[s]) n_syms = s + 1;
  uint16_t freq[rans::kMaxSymbols];
  uint32_t fc[rans::kMaxSymbols];
  if (!rans::normalize_body(counts, n_syms, freq)) return 0;
  uint32_t cum = 0;
  for (uint32_t s = 0; s < rans::kMaxSymbols; ++s) {
    const uint32_t f = s < n_syms ? freq[s] : 0;
    fc[s] = f ? f | (cum << 16) : 0;
    cum += f;
  }
  const uint32_t n_blocks = (n + block_symbols - 1) / block_symbols;
  const uint64_t table_off = kSegmentHeaderBytes + (mask ? align16(mask_bytes) : 0);
  const uint64_t desc_off = align16(table_off + 2ull * n_syms);
  const uint64_t words_off = align16(desc_off + uint64_t{n_blocks} * kBlockDescBytes);
  if (words_off >= limit) return 0;
  for (uint64_t i = 0; i < words_off; ++i) seg[i] = 0;
  seg[0] = kCodingRans;
  seg[1] = static_cast<uint8_t>(bits);
  st16_at(seg + 2, static_cast<uint16_t>(n_syms));
  st32_at(seg + 4, n);
  st32_at(seg + 8, n_blocks);
  if (mask) {
    seg[12] = kPredictTokenDelta;
    for (uint32_t i = 0; i < mask_bytes; ++i) seg[kSegmentHeaderBytes + i] = mask[i];
  }
  for (uint32_t s = 0; s < n_syms; ++s) st16_at(seg + table_off + 2 * s, freq[s]);
  uint64_t end = words_off;
  for (uint32_t b = 0; b < n_blocks; ++b) {
    const uint32_t first = b * block_symbols;
    const uint32_t count = n - first < block_symbols ? n - first : block_symbols;
    uint32_t x[rans::kLanes];
    for (uint32_t l = 0; l < rans::kLanes; ++l) x[l] = rans::kLower;
    uint32_t top = w.stack_words;
    if (!rans::encode_reverse(sym + first, 0, count, fc, x, w.stack, &top)) return 0;
    const uint32_t n_words = w.stack_words - top;
    const uint64_t off = align16(end);
    end = off + 2ull * n_words;
    if (end >= limit) return 0;
    for (uint64_t i = 0; i < 2ull * n_words; ++i) seg[off + i] = reinterpret_cast<const uint8_t*>(w.stack + top)[i];
    uint8_t* desc = seg + desc_off + uint64_t{b} * kBlockDescBytes;
    st32_at(desc, n_words);
    st32_at(desc + 4, static_cast<uint32_t>(off));
    for (uint32_t l = 0; l < rans::kLanes; ++l) st32_at(desc + 8 + 4 * l, x[l]);
  }
  return end;
}

// write_segment (encode_planes.cc) into the segment's slot.
KDN_HD_INLINE void enc_segment(const EncodeJob& j, uint32_t c, uint32_t lp, uint32_t h) {
  const uint64_t unit = seg_unit(j, c, lp, h);
  const Plane pl = job_plane(j, c, lp);
  const SegmentWork w = segment_work(j, unit);
  uint8_t* seg = j.segments + unit * j.seg_slot;
  quantize_codes(j, c, lp, h, pl, w);
  const Header hdr = job_header(j);
  const uint32_t tokens = coded_tokens(hdr, pl), n = tokens * j.head_dim;
  const uint64_t packed = kSegmentHeaderBytes + 4 * ((uint64_t{n} * pl.bits + 31) / 32);
  uint64_t bytes = 0;
  if (j.entropy) {
    uint8_t mask[kMaxHeadDim / 8];
    const uint32_t mask_bytes = (j.head_dim + 7) / 8;
    uint32_t counts[rans::kMaxSymbols];
    const uint8_t* sym = w.codes;
    bool predicted = false;
    const uint32_t n_syms = 1u << pl.bits;
    if (j.token_delta && j.head_dim >= 32 && tokens >= 2) {
      predicted = choose_channels_body(PlainChoiceOps{}, w.codes, tokens, j.head_dim, pl.bits, w.choice, mask, counts);
    } else {
      for (uint32_t s = 0; s < n_syms; ++s) counts[s] = 0;
      for (uint32_t i = 0; i < n; ++i) counts[w.codes[i]]++;
    }
    if (predicted) {
      const uint8_t code_mask = static_cast<uint8_t>(n_syms - 1);
      for (uint32_t t = 0; t < tokens; ++t)
        for (uint32_t d = 0; d < j.head_dim; ++d) {
          const uint64_t i = uint64_t{t} * j.head_dim + d;
          const uint8_t prev = t && channel_in_mask(mask, d) ? w.codes[i - j.head_dim] : 0;
          w.residuals[i] = static_cast<uint8_t>((w.codes[i] - prev) & code_mask);
        }
      sym = w.residuals;
    }
    bytes = rans_segment(sym, n, pl.bits, counts, j.block_tokens * j.head_dim, predicted ? mask : nullptr, mask_bytes,
                         packed, w, seg);
  }
  if (bytes == 0) bytes = packed_segment(w.codes, n, pl.bits, seg);
  j.seg_bytes[unit] = bytes;
}

// ---- stage 3: layout ---------------------------------------------------------------------------

KDN_HD_INLINE uint64_t blob_start(const EncodeJob& j) {
  return align16(kHeaderBytes + uint64_t{j.layers} * kLayerEntryBytes);
}

KDN_HD_INLINE void enc_layout(const EncodeJob& j, uint32_t c) {
  uint64_t pos = blob_start(j);
  for (uint32_t lp = 0; lp < 2 * j.layers; ++lp) {
    PlaneMeta& m = j.meta[plane_unit(j, c, lp)];
    m.offset = pos;
    pos = align16(pos + kPlaneHeaderBytes + m.params_bytes);
    const uint64_t payload = pos;
    pos += uint64_t{kSegmentDirEntryBytes} * j.kv_heads;
    for (uint32_t h = 0; h < j.kv_heads; ++h) pos = align16(pos) + j.seg_bytes[seg_unit(j, c, lp, h)];
    m.payload_bytes = pos - payload;
    pos = align16(pos);
  }
  j.written[c] = pos;
}

// ---- stage 4: place ----------------------------------------------------------------------------

KDN_HD_INLINE void copy_strided(uint8_t* dst, const uint8_t* src, uint64_t n, uint32_t tid, uint32_t threads) {
  for (uint64_t i = tid; i < n; i += threads) dst[i] = src[i];
}

KDN_HD_INLINE void enc_place(const EncodeJob& j, uint32_t c, uint32_t lp, uint32_t tid, uint32_t threads) {
  const uint64_t unit = plane_unit(j, c, lp);
  const PlaneMeta& m = j.meta[unit];
  const Plane pl = job_plane(j, c, lp);
  uint8_t* at = j.outs[c] + m.offset;
  if (tid == 0) {
    at[0] = pl.codec;
    at[1] = pl.bits;
    at[2] = pl.scale_dtype;
    at[3] = pl.transform;
    st32_at(at + 4, pl.group);
    st32_at(at + 8, j.kv_heads);
    st32_at(at + 12, pl.params_bytes);
    st32_at(at + 16, static_cast<uint32_t>(m.payload_bytes));
    st32_at(at + 20, pl.exact_tokens);
    st32_at(at + 24, pl.exact_tail_tokens);
  }
  copy_strided(at + kPlaneHeaderBytes, j.params + unit * j.params_slot, m.params_bytes, tid, threads);
  const uint64_t payload = align16(m.offset + kPlaneHeaderBytes + m.params_bytes);
  uint64_t pos = payload + uint64_t{kSegmentDirEntryBytes} * j.kv_heads;
  for (uint32_t h = 0; h < j.kv_heads; ++h) {
    const uint64_t su = seg_unit(j, c, lp, h);
    pos = align16(pos);
    if (tid == 0) {
      st32_at(j.outs[c] + payload + 8ull * h, static_cast<uint32_t>(pos - payload));
      st32_at(j.outs[c] + payload + 8ull * h + 4, static_cast<uint32_t>(j.seg_bytes[su]));
    }
    copy_strided(j.outs[c] + pos, j.segments + su * j.seg_slot, j.seg_bytes[su], tid, threads);
    pos += j.seg_bytes[su];
  }
}

// ---- stages 5 and 6: checksums, directory, header ----------------------------------------------

// The CRC32C byte table (reflected polynomial 0x82F63B78), entry b.
KDN_HD_INLINE uint32_t crc32c_table_entry(uint32_t b) {
  uint32_t c = b;
  for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1u) ? 0x82F63B78u : 0u);
  return c;
}

KDN_HD_INLINE uint32_t crc32c_with(const uint32_t* table, const uint8_t* p, uint64_t n) {
  uint32_t c = 0xffffffffu;
  for (uint64_t i = 0; i < n; ++i) c = (c >> 8) ^ table[(c ^ p[i]) & 0xffu];
  return ~c;
}

KDN_HD_INLINE void enc_layer_crc(const EncodeJob& j, const uint32_t* table, uint32_t c, uint32_t l) {
  const PlaneMeta& k = j.meta[plane_unit(j, c, 2 * l)];
  const uint64_t end = l + 1 < j.layers ? j.meta[plane_unit(j, c, 2 * l + 2)].offset : j.written[c];
  uint8_t* e = j.outs[c] + kHeaderBytes + uint64_t{l} * kLayerEntryBytes;
  st64_at(e, k.offset);
  st64_at(e + 8, end - k.offset);
  st32_at(e + 16, crc32c_with(table, j.outs[c] + k.offset, end - k.offset));
  e[20] = j.specs[2 * l].codec;
  e[21] = j.specs[2 * l + 1].codec;
  e[22] = j.specs[2 * l].bits;
  e[23] = j.specs[2 * l + 1].bits;
}

KDN_HD_INLINE void enc_header(const EncodeJob& j, const uint32_t* table, uint32_t c) {
  uint8_t* p = j.outs[c];
  const char magic[8] = {'K', 'D', 'N', 'K', 'V', 'C', '1', 0};
  for (uint32_t i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(magic[i]);
  st16_at(p + kHfVersionMajor, kVersionMajor);
  st16_at(p + kHfVersionMinor, static_cast<uint16_t>(j.version_minor));
  st32_at(p + kHfHeaderBytes, kHeaderBytes);
  st64_at(p + kHfTotalBytes, j.written[c]);
  st64_at(p + kHfFingerprint, j.fingerprint_lo);
  st64_at(p + kHfFingerprint + 8, j.fingerprint_hi);
  st64_at(p + kHfChunkKey, j.chunk_key_lo);
  st64_at(p + kHfChunkKey + 8, j.chunk_key_hi);
  st32_at(p + kHfTokens, j.tokens);
  st32_at(p + kHfLayers, j.layers);
  st32_at(p + kHfKvHeads, j.kv_heads);
  st32_at(p + kHfHeadDim, j.head_dim);
  p[kHfDtype] = static_cast<uint8_t>(j.dtype);
  p[kHfMode] = static_cast<uint8_t>(j.mode);
  st16_at(p + kHfBlockTokens, static_cast<uint16_t>(j.block_tokens));
  st64_at(p + kHfPosBase, static_cast<uint64_t>(j.pos_base));
  st64_at(p + kHfDirOff, kHeaderBytes);
  st32_at(p + kHfDirBytes, j.layers * kLayerEntryBytes);
  st32_at(p + kHfDirCrc, crc32c_with(table, p + kHeaderBytes, uint64_t{j.layers} * kLayerEntryBytes));
  st32_at(p + kHfHeaderCrc, crc32c_with(table, p, kHeaderCrcOffset));
}

}  // namespace kdn::kernels::kvc1
