// KVC1 encoder: what each plane codec turns a plane into — quantizer parameters and codes,
// exponent references and byte planes. Rows are read as f32 with the kernels' vectorized
// row loads; every value goes through the same quantizer bodies as before, so the bytes are
// those the format defines (golden_test.cc pins them).
#include "encode_rows.h"
#include "encoder.h"
#include "quant.h"

#include <kdn/kernels/cpu_rows.h>
#include <kdn/kernels/dtype.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kdn::kernels::kvc1 {
namespace {

Status no_space() { return Status(Code::kNoSpace, "KVC1 output buffer too small"); }

void store_scale(uint8_t* params, uint64_t i, uint8_t sd, uint32_t bits) {
  if (sd == kScaleF16) {
    const uint16_t h = static_cast<uint16_t>(bits);
    std::memcpy(params + 2 * i, &h, 2);
  } else {
    std::memcpy(params + 4 * i, &bits, 4);
  }
}

bool store_group(float lo, float hi, uint32_t bits, uint8_t sd, uint8_t* params, uint64_t i, uint64_t per_array) {
  GroupScale gs;
  if (!stored_group_scale(lo, hi, bits, sd, &gs)) return false;
  store_scale(params, i, sd, gs.s_bits);
  store_scale(params, per_array + i, sd, gs.z_bits);
  return true;
}

// K: per (head, token group, channel), over the group's quantized tokens. False if a value
// does not fit the scale dtype. `params` arrives zeroed: groups of exact tokens only keep
// S = Z = 0.
bool write_channel_scales(const Source& src, const Plane& pl, uint8_t sd, EncodeScratch& sc, uint8_t* params,
                          bool* non_finite) {
  const ChunkGeometry& g = src.g;
  const uint32_t ng = (g.tokens + pl.group - 1) / pl.group;
  const uint64_t per_array = uint64_t{g.kv_heads} * ng * g.head_dim;
  const uint32_t quant_end = g.tokens - pl.exact_tail_tokens;  // tokens [exact_tokens, quant_end) are quantized
  for (uint32_t h = 0; h < g.kv_heads; ++h) {
    for (uint32_t gi = 0; gi < ng; ++gi) {
      std::fill(sc.lo, sc.lo + g.head_dim, INFINITY);
      std::fill(sc.hi, sc.hi + g.head_dim, -INFINITY);
      const uint32_t t1 = (gi + 1) * pl.group < quant_end ? (gi + 1) * pl.group : quant_end;
      const uint32_t t0 = gi * pl.group > pl.exact_tokens ? gi * pl.group : pl.exact_tokens;
      if (t0 >= t1) continue;  // every token of the group is exact: S = Z = 0
      for (uint32_t t = t0; t < t1; ++t) {
        if (!src.row_f32(t, h, sc.row)) *non_finite = true;
        accumulate_range(sc.row, g.head_dim, sc.lo, sc.hi);
      }
      if (*non_finite) return true;
      for (uint32_t d = 0; d < g.head_dim; ++d)
        if (!store_group(sc.lo[d], sc.hi[d], pl.bits, sd, params, (uint64_t{h} * ng + gi) * g.head_dim + d, per_array))
          return false;
    }
  }
  return true;
}

// V (and int8 K): per (token, head, channel group). `params` arrives zeroed: exact rows keep
// S = Z = 0.
bool write_token_scales(const Source& src, const Plane& pl, uint8_t sd, EncodeScratch& sc, uint8_t* params,
                        bool* non_finite) {
  const ChunkGeometry& g = src.g;
  const uint32_t ng = g.head_dim / pl.group;
  const uint64_t per_array = uint64_t{g.tokens} * g.kv_heads * ng;
  for (uint32_t t = 0; t < g.tokens; ++t) {
    for (uint32_t h = 0; h < g.kv_heads; ++h) {
      if (is_exact_token(pl, g.tokens, t)) continue;  // stored exactly: S = Z = 0
      if (!src.row_f32(t, h, sc.row)) {
        *non_finite = true;
        return true;
      }
      if (pl.transform == kTransformHadamard) hadamard_row(sc.row, g.head_dim, 1.0f);
      for (uint32_t gi = 0; gi < ng; ++gi) {
        float lo, hi;
        group_range(sc.row + gi * pl.group, pl.group, &lo, &hi);
        if (!store_group(lo, hi, pl.bits, sd, params, (uint64_t{t} * g.kv_heads + h) * ng + gi, per_array))
          return false;
      }
    }
  }
  return true;
}

// The exact rows of a plane, E[row][h][d] in the chunk dtype, in token order (the leading
// exact tokens, then the trailing ones). False if one holds NaN or Inf.
bool write_exact_rows(const Source& src, const Plane& pl, EncodeScratch& sc, uint8_t* at) {
  const ChunkGeometry& g = src.g;
  const size_t row = size_t{g.head_dim} * dtype_size(g.dtype);
  for (uint32_t t = 0; t < g.tokens; ++t) {
    if (!is_exact_token(pl, g.tokens, t)) continue;
    for (uint32_t h = 0; h < g.kv_heads; ++h) {
      if (!src.row_f32(t, h, sc.row)) return false;
      std::memcpy(at, static_cast<const uint8_t*>(src.chunk) + src.index(t, h, 0) * dtype_size(g.dtype), row);
      at += row;
    }
  }
  return true;
}

// `n` stored scales (or zero points) widened to f32.
void load_scales(const uint8_t* p, uint32_t n, uint8_t scale_dtype, float* out) {
  if (scale_dtype == kScaleF16) {
    load_row_f32(p, DType::kF16, 1.0f, n, out);  // the same bits as f16_to_f32 per value
  } else {
    std::memcpy(out, p, size_t{n} * 4);
  }
}

// The stored S and Z of row (t, head) widened to f32: one per channel for per-channel scales
// (K in the kivi modes), one per channel group for per-token scales.
void row_scales(const Header& hdr, const Plane& pl, const uint8_t* params, uint32_t t, uint32_t head, float* s,
                float* z) {
  uint64_t s_off, z_off;
  row_scale_offsets(hdr, pl, t, head, &s_off, &z_off);
  const uint32_t n = pl.codec == kCodecUintChannel ? hdr.head_dim : hdr.head_dim / pl.group;
  load_scales(params + s_off, n, pl.scale_dtype, s);
  load_scales(params + z_off, n, pl.scale_dtype, z);
}

}  // namespace

uint32_t Source::bits(uint32_t t, uint32_t h, uint32_t d) const {
  const int64_t i = index(t, h, d);
  if (g.dtype == DType::kF32) return static_cast<const uint32_t*>(chunk)[i];
  return static_cast<const uint16_t*>(chunk)[i];
}

void Source::load_row(uint32_t t, uint32_t h, float* out) const {
  load_row_f32(static_cast<const uint8_t*>(chunk) + index(t, h, 0) * dtype_size(g.dtype), g.dtype, 1.0f, g.head_dim,
               out);
}

bool Source::row_f32(uint32_t t, uint32_t h, float* out) const {
  load_row(t, h, out);
  return row_finite(out, g.head_dim);
}

Status write_quant_params(const Source& src, const Header& hdr, Plane& pl, const EncodePlan& plan, EncodeScratch& sc,
                          OutBuf& out) noexcept {
  const size_t at = out.pos;
  for (uint8_t sd : {kScaleF16, kScaleF32}) {
    if (sd == kScaleF16 && plan.f32_scales) continue;
    pl.scale_dtype = sd;
    const uint64_t bytes = quant_params_bytes(hdr, pl);
    out.pos = at;
    if (!out.reserve(bytes)) return no_space();
    std::memset(out.data + at, 0, bytes);  // S and Z of exact rows, the padding before the exact rows
    bool non_finite = false;
    const bool fits = pl.codec == kCodecUintChannel ? write_channel_scales(src, pl, sd, sc, out.data + at, &non_finite)
                                                    : write_token_scales(src, pl, sd, sc, out.data + at, &non_finite);
    if (!non_finite && exact_rows(pl))
      non_finite = !write_exact_rows(src, pl, sc, out.data + at + exact_rows_offset(hdr, pl));
    if (non_finite) return Status(Code::kInvalidArgument, "NaN or Inf in a chunk to quantize");
    if (fits) {
      pl.params_bytes = static_cast<uint32_t>(bytes);
      out.pos = at + bytes;
      return OkStatus();
    }
  }
  return Status(Code::kInvalidArgument, "chunk values span more than fp32 scales can hold");
}

void quantize_head(const Source& src, const Header& hdr, const Plane& pl, const uint8_t* params, uint32_t head,
                   EncodeScratch& sc) noexcept {
  const uint32_t qmax = (1u << pl.bits) - 1;
  for (uint32_t t = 0; t < coded_tokens(hdr, pl); ++t) {  // the trailing exact rows have no codes
    uint8_t* codes = sc.symbols + size_t{t} * hdr.head_dim;
    if (is_exact_token(pl, hdr.tokens, t)) {  // the decoder takes these rows from the exact rows
      std::memset(codes, 0, hdr.head_dim);
      continue;
    }
    // Per-channel scales change once per token group; per-token ones every row.
    if (pl.codec != kCodecUintChannel || t % pl.group == 0 || t == pl.exact_tokens)
      row_scales(hdr, pl, params, t, head, sc.lo, sc.hi);
    src.load_row(t, head, sc.row);  // finiteness was checked with the scales
    if (pl.transform == kTransformHadamard) hadamard_row(sc.row, hdr.head_dim, 1.0f);
    if (pl.codec == kCodecUintChannel)
      quantize_row(sc.row, sc.lo, sc.hi, hdr.head_dim, qmax, codes);
    else
      quantize_row_grouped(sc.row, sc.lo, sc.hi, pl.group, hdr.head_dim, qmax, codes);
  }
}

namespace {

// Row (t, h) of a 16- or 32-bit plane as its raw bit patterns.
template <typename W>
const W* row_bits(const Source& src, uint32_t t, uint32_t h) {
  return static_cast<const W*>(src.chunk) + src.index(t, h, 0);
}

template <typename W>
void exponent_refs(const Source& src, const ExponentField& f, uint8_t* params) {
  const uint32_t dim = src.g.head_dim;
  for (uint32_t t = 0; t < src.g.tokens; ++t)
    for (uint32_t h = 0; h < src.g.kv_heads; ++h) {
      const W* row = row_bits<W>(src, t, h);
      uint8_t* m = params + h * dim;
      for (uint32_t d = 0; d < dim; ++d) {  // a plain loop over the row: the compiler vectorizes it
        const uint32_t e = (rotate_sign_down(row[d], f.width) >> f.shift) & f.mask;
        m[d] = e > m[d] ? static_cast<uint8_t>(e) : m[d];
      }
    }
}

template <typename W>
void byte_plane(const Source& src, const ExponentField& f, const uint8_t* emax, uint32_t head, uint32_t k,
                uint8_t* sym) {
  const uint32_t shift = f.width - 8 * (k + 1);
  const uint32_t low = (1u << f.shift) - 1;
  const uint32_t dim = src.g.head_dim;
  for (uint32_t t = 0; t < src.g.tokens; ++t) {
    const W* row = row_bits<W>(src, t, head);
    uint8_t* out = sym + size_t{t} * dim;
    for (uint32_t d = 0; d < dim; ++d) {
      const uint32_t r = rotate_sign_down(row[d], f.width);
      out[d] = static_cast<uint8_t>((((emax[d] - (r >> f.shift)) << f.shift) | (r & low)) >> shift);
    }
  }
}

#if defined(__x86_64__)
#define KDN_TARGET_PLANES __attribute__((target("avx2")))

bool planes_simd(const Source& src) {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2 && src.g.dtype != DType::kF32 && src.g.head_dim % 16 == 0;
}

// 16 elements rotated sign-down (r = rotl16(u, 1)).
KDN_TARGET_PLANES inline __m256i rotated16(const uint16_t* row) {
  const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row));
  return _mm256_or_si256(_mm256_slli_epi16(u, 1), _mm256_srli_epi16(u, 15));
}

// exponent_refs for 16-bit dtypes, 16 channels at a time (the exponent field is the top
// 16 - shift bits of r, so r >> shift is it).
KDN_TARGET_PLANES void exponent_refs16(const Source& src, uint32_t shift, uint8_t* params) {
  const uint32_t dim = src.g.head_dim;
  const __m128i sh = _mm_cvtsi32_si128(static_cast<int>(shift));
  for (uint32_t h = 0; h < src.g.kv_heads; ++h)
    for (uint32_t d = 0; d < dim; d += 16) {
      __m256i m = _mm256_setzero_si256();
      for (uint32_t t = 0; t < src.g.tokens; ++t)
        m = _mm256_max_epu16(m, _mm256_srl_epi16(rotated16(row_bits<uint16_t>(src, t, h) + d), sh));
      const __m128i b = _mm_packus_epi16(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(params + h * dim + d), b);
    }
}

KDN_TARGET_PLANES void byte_plane16(const Source& src, uint32_t shift, const uint8_t* emax, uint32_t head, uint32_t k,
                                    uint8_t* sym) {
  const uint32_t dim = src.g.head_dim;
  const __m128i sh = _mm_cvtsi32_si128(static_cast<int>(shift));
  const __m256i low = _mm256_set1_epi16(static_cast<int16_t>((1u << shift) - 1));
  const __m256i byte = _mm256_set1_epi16(0xff);
  for (uint32_t t = 0; t < src.g.tokens; ++t) {
    const uint16_t* row = row_bits<uint16_t>(src, t, head);
    uint8_t* out = sym + size_t{t} * dim;
    for (uint32_t d = 0; d < dim; d += 16) {
      const __m256i r = rotated16(row + d);
      const __m256i em = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(emax + d)));
      const __m256i rp = _mm256_or_si256(_mm256_sll_epi16(_mm256_sub_epi16(em, _mm256_srl_epi16(r, sh)), sh),
                                         _mm256_and_si256(r, low));
      const __m256i b = k == 0 ? _mm256_srli_epi16(rp, 8) : _mm256_and_si256(rp, byte);
      const __m128i packed = _mm_packus_epi16(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + d), packed);
    }
  }
}
#endif

}  // namespace

void write_exponent_refs(const Source& src, uint8_t* params) noexcept {
  const ExponentField f = exponent_field(static_cast<uint32_t>(src.g.dtype));
  std::memset(params, 0, size_t{src.g.kv_heads} * src.g.head_dim);
#if defined(__x86_64__)
  if (planes_simd(src)) return exponent_refs16(src, f.shift, params);
#endif
  if (src.g.dtype == DType::kF32) return exponent_refs<uint32_t>(src, f, params);
  exponent_refs<uint16_t>(src, f, params);
}

void byte_plane_symbols(const Source& src, const uint8_t* emax, uint32_t head, uint32_t k, uint8_t* sym) noexcept {
  const ExponentField f = exponent_field(static_cast<uint32_t>(src.g.dtype));
#if defined(__x86_64__)
  if (planes_simd(src)) return byte_plane16(src, f.shift, emax, head, k, sym);
#endif
  if (src.g.dtype == DType::kF32) return byte_plane<uint32_t>(src, f, emax, head, k, sym);
  byte_plane<uint16_t>(src, f, emax, head, k, sym);
}

}  // namespace kdn::kernels::kvc1
