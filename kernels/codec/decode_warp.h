// The KVC1 warp decoder: what one warp of the CUDA decoder does, written against a handful of
// warp primitives so that the same code runs on the device (decode_cuda.cu, CUDA intrinsics)
// and, in tests, on the CPU with 32 threads standing in for the lanes (gpu_emulation_test.cc).
//
// One warp decodes one (chunk, layer, plane, head). The 32 rANS lanes of a block are the 32
// lanes of the warp. After each step the lanes whose state fell below 2^16 take the next words:
// a ballot gives the needy mask, each needy lane reads word p + popc(mask & lanes below it),
// and p advances by popc(mask) — the order of the format's definition. Symbol lookup uses the
// same bodies as the CPU decoder (compare-count for up to 16 symbols, a slot->symbol table in
// shared memory for more), dequantization the same fmaf and rounding bodies, so the output
// equals kvc1_decode's bit for bit.
//
// Includers define, before including this header:
//   KDN_WARP_FN                     function qualifier (__device__ on the GPU, inline on the CPU)
//   uint32_t warp_ballot(bool)      bit j set iff lane j's predicate holds (all 32 lanes take part)
//   bool warp_all(bool), warp_any(bool)
//   uint32_t warp_broadcast0(uint32_t)   lane 0's value on every lane
//   void warp_sync()                memory barrier among the warp's lanes
//   void atomic_or(uint32_t*, uint32_t)
// and call only with blobs the host validated (validate.h).
#pragma once

#include "format.h"
#include "quant.h"
#include "rans.h"
#include "transform_body.h"

#include <kdn/kernels/dtype.h>
#include <kdn/kernels/hd.h>
#include <kdn/kernels/layout.h>

#include <cstdint>

#if defined(__CUDACC__)
#define KDN_WARP_UNROLL _Pragma("unroll")
#else
#define KDN_WARP_UNROLL _Pragma("GCC unroll 16")
#endif

namespace kdn::kernels::kvc1 {

constexpr uint32_t kWarpsPerBlock = 4;
constexpr uint32_t kErrorCorrupt = 1;    // a rANS stream failed its checks
constexpr uint32_t kErrorStructure = 2;  // a blob the host validated did not parse on the device

struct Job {
  const uint8_t* const* blobs;  // device pointer arrays in scratch
  const uint64_t* lens;
  uint8_t* const* outs;
  uint32_t* error;
  uint32_t n_chunks, layer_begin, layers, kv_heads, head_dim, tokens, dtype;
  uint32_t smem_per_warp;
  uint32_t cols;       // columns the per-warp tables hold: head_dim, or kv_heads * head_dim with transform planes
  const uint8_t* cal;  // the calibration object's bytes, for transform planes (null without)
};

KDN_HD_INLINE uint32_t popcount32(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint32_t>(__popc(x));
#else
  return static_cast<uint32_t>(__builtin_popcount(x));
#endif
}

// Per-warp shared memory: the rANS table, the slot->symbol table and the predictor's state, for
// segments of up to `cols` columns (head_dim; a transform plane's band segments have up to
// kv_heads * head_dim).
struct WarpSmem {
  uint32_t* fc;     // [256] freq | cum << 16
  uint16_t* cum;    // [272] cumulative frequencies, 4096 past n_syms
  uint8_t* lut;     // [4096] slot -> symbol (bits > 4)
  uint8_t* select;  // [cols] 0xff on token-delta channels
  uint8_t* prev;    // [cols] previous token's codes
  float* rot;       // [cols] the row being rotated back (kTransformHadamard; a transform row's coordinates)
  uint16_t* col_of;  // [cols] a band column's coordinate (transform planes)
};

KDN_HD_INLINE uint32_t smem_bytes_per_warp(uint32_t cols) {
  const uint32_t c16 = (cols + 15) / 16 * 16;
  return 1024 + 544 + 4096 + 2 * c16 + 4 * c16 + 2 * c16;
}

KDN_WARP_FN WarpSmem carve(uint8_t* base, uint32_t cols) {
  const uint32_t c16 = (cols + 15) / 16 * 16;
  WarpSmem s;
  s.fc = reinterpret_cast<uint32_t*>(base);
  s.cum = reinterpret_cast<uint16_t*>(base + 1024);
  s.lut = base + 1024 + 544;
  s.select = s.lut + 4096;
  s.prev = s.select + c16;
  s.rot = reinterpret_cast<float*>(s.prev + c16);
  s.col_of = reinterpret_cast<uint16_t*>(s.rot + c16);
  return s;
}

KDN_WARP_FN uint32_t lanemask_lt(uint32_t lane) { return (1u << lane) - 1u; }

// Loads the segment's table (validated on the host) and, for wide alphabets, the slot table.
KDN_WARP_FN bool load_table(const uint8_t* blob, const Segment& sg, const WarpSmem& s, uint32_t lane) {
  uint32_t sum = 0;
  if (lane == 0) {
    for (uint32_t y = 0; y < sg.n_syms; ++y) {
      const uint32_t f = ld16(blob + sg.table_off + 2 * y);
      s.cum[y] = static_cast<uint16_t>(sum > 4096 ? 4096 : sum);
      s.fc[y] = f | ((sum > 4096 ? 4096 : sum) << 16);
      sum += f;
    }
    for (uint32_t y = sg.n_syms; y < 272; ++y) s.cum[y] = 4096;
  }
  sum = warp_broadcast0(sum);
  warp_sync();
  if (sum != rans::kProbScale) return false;
  if (sg.bits > 4) {
    for (uint32_t slot = lane; slot < rans::kProbScale; slot += 32) {
      uint32_t lo = 0, hi = sg.n_syms - 1;  // largest y with cum[y] <= slot
      while (lo < hi) {
        const uint32_t mid = (lo + hi + 1) / 2;
        if (s.cum[mid] <= slot)
          lo = mid;
        else
          hi = mid - 1;
      }
      s.lut[slot] = static_cast<uint8_t>(lo);
    }
    warp_sync();
  }
  return true;
}

KDN_WARP_FN void load_predictor(const uint8_t* blob, const Segment& sg, const WarpSmem& s, uint32_t head_dim,
                                uint32_t lane) {
  for (uint32_t d = lane; d < head_dim; d += 32) {
    s.select[d] = channel_predicted(blob, sg, d) ? 0xffu : 0u;
    s.prev[d] = 0;
  }
  warp_sync();
}

// Decodes every symbol of a segment in order; emit(index, symbol) runs on the lane that
// decoded it (consecutive indices on consecutive lanes). Returns false on corruption.
template <class Emit>
KDN_WARP_FN bool decode_segment(const uint8_t* blob, const Segment& sg, const WarpSmem& s, uint32_t lane, Emit&& emit) {
  if (sg.coding == kCodingPacked) {
    const uint8_t* bits = blob + sg.offset + kSegmentHeaderBytes;
    const uint32_t mask = (1u << sg.bits) - 1;
    for (uint32_t base = 0; base < sg.n_symbols; base += 32) {
      const uint32_t i = base + lane;
      if (i < sg.n_symbols) {
        const uint64_t pos = uint64_t{i} * sg.bits;
        uint32_t v = bits[pos / 8];
        if (pos % 8 + sg.bits > 8) v |= uint32_t{bits[pos / 8 + 1]} << 8;
        emit(i, (v >> (pos % 8)) & mask);
      }
      warp_sync();
    }
    return true;
  }
  if (!load_table(blob, sg, s, lane)) return false;
  uint32_t cr[15];
  KDN_WARP_UNROLL
  for (uint32_t k = 0; k < 15; ++k) cr[k] = s.cum[k + 1];
  for (uint32_t b = 0; b < sg.n_blocks; ++b) {
    Block bk;
    if (parse_block(blob, sg, b, &bk) != kParseOk) return false;
    const uint16_t* words = reinterpret_cast<const uint16_t*>(blob + bk.words_off);  // 2-aligned: see host check
    uint32_t x = ld32(bk.desc + 8 + 4 * lane);
    uint32_t p = 0;
    const uint32_t first = b * sg.block_symbols;
    for (uint32_t base = 0; base < bk.n_symbols; base += 32) {
      const uint32_t i = base + lane;
      const bool active = i < bk.n_symbols;
      uint32_t y = 0;
      if (active) {
        const uint32_t slot = x & (rans::kProbScale - 1);
        if (sg.bits <= 4) {
          KDN_WARP_UNROLL
          for (uint32_t k = 0; k < 15; ++k) y += cr[k] <= slot ? 1u : 0u;
        } else {
          y = s.lut[slot];
        }
        x = rans::decode_advance(x, s.fc[y] & 0xffffu, s.fc[y] >> 16);
      }
      const bool needy = active && x < rans::kLower;
      const uint32_t m = warp_ballot(needy);
      if (needy) {
        const uint32_t at = p + popcount32(m & lanemask_lt(lane));
        if (at < bk.n_words) x = (x << 16) | words[at];
      }
      p += popcount32(m);
      if (p > bk.n_words) return false;  // p is the same on every lane
      if (active) emit(first + i, y);
      warp_sync();
    }
    if (p != bk.n_words || !warp_all(x == rans::kLower)) return false;
  }
  return true;
}

KDN_WARP_FN uint8_t undo_delta(const WarpSmem& s, bool predicted, uint32_t d, uint32_t y, uint32_t mask) {
  if (!predicted) return static_cast<uint8_t>(y);
  const uint8_t code = static_cast<uint8_t>((y + (s.prev[d] & s.select[d])) & mask);
  s.prev[d] = code;
  return code;
}

struct Where {
  const uint8_t* blob;
  uint8_t* out;
  const Header* h;
  ChunkGeometry g;
  uint32_t layer, plane, head;
};

// Code q of channel d in a row whose S and Z arrays start at params + s_off / z_off.
KDN_WARP_FN float dequantize_code(const uint8_t* params, const Plane& pl, uint64_t s_off, uint64_t z_off, uint32_t d,
                                  uint32_t per, uint32_t q) {
  return dequantize_value(q, load_scale(params + s_off, d / per, pl.scale_dtype),
                          load_scale(params + z_off, d / per, pl.scale_dtype));
}

// A Hadamard plane: the codes of row (t, head) are first parked in the first head_dim bytes of
// that row's output slot; then, row by row, the warp dequantizes them into shared memory,
// runs the butterfly stages (lanes split each stage, a barrier between stages), scales by 1/n
// and writes the row, rounded once, over its codes.
KDN_WARP_FN bool decode_rotated(const Where& w, const Plane& pl, const Segment& sg, const WarpSmem& s, uint32_t lane,
                                bool predicted) {
  const uint32_t n = w.g.head_dim, e = dtype_bytes_of(static_cast<uint32_t>(w.g.dtype));
  const uint32_t mask = (1u << pl.bits) - 1;
  const bool ok = decode_segment(w.blob, sg, s, lane, [&](uint32_t i, uint32_t y) {
    const uint32_t t = i / n, d = i % n;
    w.out[chunk_offset(w.g, w.layer, w.plane, t, w.head, 0) * e + d] = undo_delta(s, predicted, d, y, mask);
  });
  if (!ok) return false;
  warp_sync();
  const uint8_t* params = w.blob + pl.params_off;
  const float inv = hadamard_inverse_scale(n);
  for (uint32_t t = 0; t < coded_tokens(*w.h, pl); ++t) {  // the trailing exact rows have no codes
    const int64_t row = chunk_offset(w.g, w.layer, w.plane, t, w.head, 0);
    uint64_t s_off, z_off;
    row_scale_offsets(*w.h, pl, t, w.head, &s_off, &z_off);
    for (uint32_t d = lane; d < n; d += 32)
      s.rot[d] = dequantize_code(params, pl, s_off, z_off, d, pl.group, w.out[row * e + d]);
    warp_sync();
    for (uint32_t len = 1; len < n; len *= 2) {
      for (uint32_t j = lane; j < n / 2; j += 32) hadamard_butterfly(s.rot, len, j);
      warp_sync();
    }
    for (uint32_t d = lane; d < n; d += 32) store_f32(w.out, row + d, w.g.dtype, fmul_rn(s.rot[d], inv), 1.0f);
    warp_sync();
  }
  return true;
}

KDN_WARP_FN bool decode_quantized(const Where& w, const Plane& pl, const WarpSmem& s, uint32_t lane) {
  Segment sg;
  if (parse_segment(w.blob, *w.h, pl, w.head, &sg) != kParseOk) return false;
  const bool predicted = sg.predictor == kPredictTokenDelta;
  if (predicted) load_predictor(w.blob, sg, s, w.g.head_dim, lane);
  if (pl.transform == kTransformHadamard) return decode_rotated(w, pl, sg, s, lane, predicted);
  const uint32_t mask = (1u << pl.bits) - 1, per = pl.codec == kCodecUintChannel ? 1 : pl.group;
  const uint8_t* params = w.blob + pl.params_off;
  return decode_segment(w.blob, sg, s, lane, [&](uint32_t i, uint32_t y) {
    const uint32_t t = i / w.g.head_dim, d = i % w.g.head_dim;
    const uint8_t q = undo_delta(s, predicted, d, y, mask);
    uint64_t s_off, z_off;
    row_scale_offsets(*w.h, pl, t, w.head, &s_off, &z_off);
    store_f32(w.out, chunk_offset(w.g, w.layer, w.plane, t, w.head, d), w.g.dtype,
              dequantize_code(params, pl, s_off, z_off, d, per, q), 1.0f);
  });
}

// Lossless: every byte plane lands in its byte of the output element, then the elements are
// transformed back in place (exponent rebase, sign rotation).
KDN_WARP_FN bool decode_byteplanes(const Where& w, const Plane& pl, const WarpSmem& s, uint32_t lane) {
  const uint32_t e = dtype_bytes_of(w.h->dtype);
  for (uint32_t k = 0; k < e; ++k) {
    Segment sg;
    if (parse_segment(w.blob, *w.h, pl, w.head * e + k, &sg) != kParseOk) return false;
    const bool predicted = sg.predictor == kPredictTokenDelta;
    if (predicted) load_predictor(w.blob, sg, s, w.g.head_dim, lane);
    const bool ok = decode_segment(w.blob, sg, s, lane, [&](uint32_t i, uint32_t y) {
      const uint32_t t = i / w.g.head_dim, d = i % w.g.head_dim;
      const int64_t at = chunk_offset(w.g, w.layer, w.plane, t, w.head, d) * e + (e - 1 - k);
      w.out[at] = undo_delta(s, predicted, d, y, 0xffu);
    });
    if (!ok) return false;
    warp_sync();
  }
  const ExponentField f = exponent_field(static_cast<uint32_t>(w.g.dtype));
  const uint8_t* emax = w.blob + pl.params_off + uint64_t{w.head} * w.g.head_dim;
  bool bad = false;
  for (uint32_t i = lane; i < w.g.tokens * w.g.head_dim; i += 32) {
    const uint32_t t = i / w.g.head_dim, d = i % w.g.head_dim;
    const int64_t at = chunk_offset(w.g, w.layer, w.plane, t, w.head, d);
    if (e == 4) {
      uint32_t* p = reinterpret_cast<uint32_t*>(w.out) + at;
      *p = untransform_element(*p, emax[d], f, &bad);
    } else {
      uint16_t* p = reinterpret_cast<uint16_t*>(w.out) + at;
      *p = static_cast<uint16_t>(untransform_element(*p, emax[d], f, &bad));
    }
  }
  return !warp_any(bad);
}

// Rows [0, tokens) of the head from `src` ([t][head][d] in the chunk dtype): a raw plane's
// payload, or the exact rows of a quantized plane.
KDN_WARP_FN void copy_rows(const Where& w, const uint8_t* rows, uint32_t first, uint32_t tokens, uint32_t lane) {
  const uint32_t e = dtype_bytes_of(static_cast<uint32_t>(w.g.dtype));
  const uint64_t row = uint64_t{w.g.head_dim} * e;
  for (uint32_t t = 0; t < tokens; ++t) {
    const uint8_t* src = rows + (uint64_t{t} * w.g.kv_heads + w.head) * row;
    uint8_t* dst = w.out + chunk_offset(w.g, w.layer, w.plane, first + t, w.head, 0) * e;
    for (uint64_t b = lane; b < row; b += 32) dst[b] = src[b];
  }
}

// A transform plane, first pass (the warp of head 0): every band segment's codes are parked in
// their rows' output slots, as the CPU decoder parks them (decode_transform.cc): band column c
// holds coordinate col_of[c] = head * head_dim + axis, so its code goes to byte `axis` of row
// (t, head)'s slot.
KDN_WARP_FN bool park_transform(const Where& w, const Plane& pl, const WarpSmem& s, uint32_t lane) {
  const uint32_t n = w.g.kv_heads * w.g.head_dim, e = dtype_bytes_of(static_cast<uint32_t>(w.g.dtype));
  const uint8_t* widths = w.blob + pl.params_off;
  const uint32_t present = widths_present(widths, n);
  for (uint32_t b = 0; b < pl.n_segments; ++b) {
    const uint32_t width = band_width(present, b);
    uint32_t cols = 0;
    if (lane == 0) cols = band_column_list(widths, n, width, s.col_of);
    cols = warp_broadcast0(cols);
    warp_sync();
    Segment sg;
    if (width == 0 || cols == 0 || parse_segment(w.blob, band_header(*w.h, cols), pl, b, &sg) != kParseOk) return false;
    const bool predicted = sg.predictor == kPredictTokenDelta;
    if (predicted) load_predictor(w.blob, sg, s, cols, lane);
    const uint32_t mask = (1u << width) - 1;
    const bool ok = decode_segment(w.blob, sg, s, lane, [&](uint32_t i, uint32_t y) {
      const uint32_t t = i / cols, c = i % cols, col = s.col_of[c];
      const int64_t row = chunk_offset(w.g, w.layer, w.plane, t, col / w.g.head_dim, 0);
      w.out[row * e + col % w.g.head_dim] = undo_delta(s, predicted, c, y, mask);
    });
    if (!ok) return false;
    warp_sync();
  }
  return true;
}

// A transform plane, second pass (one warp per head, after every band was parked): each row is
// the exact row, or its coordinates (one lane per axis, from the parked codes, into shared
// memory) moved back from the calibrated axes (one lane per output channel k, summing the axes
// j in order with the CPU's steps) and rounded once over its codes.
KDN_WARP_FN void rebuild_transform(const Where& w, const Plane& pl, const uint8_t* cal, const WarpSmem& s,
                                   uint32_t lane) {
  const uint32_t d = w.g.head_dim, e = dtype_bytes_of(static_cast<uint32_t>(w.g.dtype));
  const uint8_t* params = w.blob + pl.params_off;
  const float* head = tc_calibration_head(cal, *w.h, w.layer, w.plane, w.head);
  const float* axes = head + 2 * d;
  const uint8_t* exact = params + tc_exact_offset(*w.h, pl);
  const uint64_t row_bytes = uint64_t{d} * e;
  for (uint32_t t = 0; t < w.g.tokens; ++t) {
    const int64_t row = chunk_offset(w.g, w.layer, w.plane, t, w.head, 0);
    uint8_t* slot = w.out + row * e;
    if (is_exact_token(pl, w.g.tokens, t)) {
      const uint8_t* src = exact + (uint64_t{exact_row_of(pl, w.g.tokens, t)} * w.g.kv_heads + w.head) * row_bytes;
      for (uint64_t b = lane; b < row_bytes; b += 32) slot[b] = src[b];
      continue;
    }
    for (uint32_t j = lane; j < d; j += 32) s.rot[j] = tc_coordinate(params, *w.h, pl, w.head, j, slot[j]);
    warp_sync();
    for (uint32_t k = lane; k < d; k += 32) {
      float x = head[k];
      for (uint32_t j = 0; j < d; ++j) x = tc_accumulate(x, axes[uint64_t{j} * d + k], s.rot[j]);
      store_f32(w.out, row + k, w.g.dtype, x, 1.0f);
    }
    warp_sync();
  }
}

// Opens warp `warp`'s (chunk, layer, plane, head): false (the structure error set) when the
// blob does not parse; false without an error for a warp past the job.
KDN_WARP_FN bool open_warp(const Job& job, uint64_t warp, uint32_t lane, Header* h, Where* w, Plane* planes) {
  const uint64_t per_chunk = uint64_t{job.layers} * 2 * job.kv_heads;
  if (warp >= per_chunk * job.n_chunks) return false;  // whole warps only: the ballots stay full
  const uint32_t chunk = static_cast<uint32_t>(warp / per_chunk);
  const uint32_t rem = static_cast<uint32_t>(warp % per_chunk);
  w->blob = job.blobs[chunk];
  w->out = job.outs[chunk];
  w->h = h;
  w->layer = job.layer_begin + rem / (2 * job.kv_heads);
  w->plane = (rem / job.kv_heads) % 2;
  w->head = rem % job.kv_heads;
  if (parse_header(w->blob, job.lens[chunk], h) != kParseOk ||
      locate_planes(w->blob, *h, w->layer, planes) != kParseOk) {
    if (lane == 0) atomic_or(job.error, kErrorStructure);
    return false;
  }
  w->g.layers = h->layers;
  w->g.kv_heads = h->kv_heads;
  w->g.head_dim = h->head_dim;
  w->g.tokens = h->tokens;
  w->g.dtype = static_cast<DType>(h->dtype);
  return true;
}

// The work of warp `warp` (global index), run by its 32 lanes; `smem` is the warp's own part
// of the block's shared memory (job.smem_per_warp bytes).
KDN_WARP_FN void decode_warp(const Job& job, uint64_t warp, uint32_t lane, uint8_t* smem) {
  Header h;
  Where w;
  Plane planes[2];
  if (!open_warp(job, warp, lane, &h, &w, planes)) return;
  const Plane& pl = planes[w.plane];
  const WarpSmem s = carve(smem, job.cols);
  bool ok = true;
  if (pl.codec == kCodecTransform) {
    // Bands span every head: head 0's warp parks them all; rebuild_warp (a second launch) makes
    // the rows, exact ones included.
    if (w.head == 0)
      ok = job.cal != nullptr && uint64_t{h.kv_heads} * h.head_dim <= job.cols && park_transform(w, pl, s, lane);
  } else if (pl.codec == kCodecRaw) {
    copy_rows(w, w.blob + pl.payload_off, 0, w.g.tokens, lane);
  } else if (pl.codec == kCodecBytePlanes) {
    ok = decode_byteplanes(w, pl, s, lane);
  } else {
    ok = decode_quantized(w, pl, s, lane);
    warp_sync();
    // Exact rows: the leading ones replace what their placeholder codes decoded to; the
    // trailing ones, which follow them in the parameters, have no codes.
    const uint8_t* exact = w.blob + pl.params_off + exact_rows_offset(h, pl);
    if (ok && pl.exact_tokens) copy_rows(w, exact, 0, pl.exact_tokens, lane);
    if (ok && pl.exact_tail_tokens) {
      const uint64_t skip = uint64_t{pl.exact_tokens} * h.kv_heads * h.head_dim * dtype_bytes_of(h.dtype);
      copy_rows(w, exact + skip, h.tokens - pl.exact_tail_tokens, pl.exact_tail_tokens, lane);
    }
  }
  if (!ok && lane == 0) atomic_or(job.error, kErrorCorrupt);
}

// The second launch of a batch with transform planes: warp `warp` rebuilds its head's rows of a
// transform plane once decode_warp parked every band (other planes: nothing). Skipped after a
// corrupt band (the rows would be built from codes that were never all parked).
KDN_WARP_FN void rebuild_warp(const Job& job, uint64_t warp, uint32_t lane, uint8_t* smem) {
  Header h;
  Where w;
  Plane planes[2];
  if (*job.error != 0 || job.cal == nullptr || !open_warp(job, warp, lane, &h, &w, planes)) return;
  const Plane& pl = planes[w.plane];
  if (pl.codec == kCodecTransform) rebuild_transform(w, pl, job.cal, carve(smem, job.cols), lane);
}

}  // namespace kdn::kernels::kvc1
