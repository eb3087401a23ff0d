#include "validate.h"

#include "crc32c.h"
#include "quant.h"
#include "rans.h"

#include <algorithm>
#include <bit>
#include <cmath>

namespace kdn::kernels::kvc1 {
namespace {

Status corrupt(const char* what) { return Status(Code::kCorrupt, what); }

// Canonical placement of the segments of a plane: the directory first, then the segments in
// order, each 16-byte aligned, the payload ending with the last one.
Status check_segment_placement(const uint8_t* blob, const Plane& pl) {
  const uint8_t* dir = blob + pl.payload_off;
  uint64_t expect = align16(uint64_t{pl.n_segments} * kSegmentDirEntryBytes);
  uint64_t end = uint64_t{pl.n_segments} * kSegmentDirEntryBytes;
  for (uint32_t s = 0; s < pl.n_segments; ++s) {
    if (ld32(dir + 8 * s) != expect) return corrupt("KVC1 segment not at its canonical offset");
    end = expect + ld32(dir + 8 * s + 4);
    expect = align16(end);
  }
  if (end != pl.payload_bytes) return corrupt("KVC1 plane payload size disagrees with its segments");
  return OkStatus();
}

Status check_rans_segment(const uint8_t* blob, const Segment& sg) {
  uint16_t freq[rans::kMaxSymbols];
  uint16_t cum[rans::kMaxSymbols + 1];
  for (uint32_t s = 0; s < sg.n_syms; ++s) freq[s] = ld16(blob + sg.table_off + 2 * s);
  if (!rans::build_cumulative(freq, sg.n_syms, cum)) return corrupt("KVC1 frequency table does not sum to 4096");
  uint64_t expect = align16(sg.blocks_off - sg.offset + uint64_t{sg.n_blocks} * kBlockDescBytes);
  uint64_t end = expect;
  for (uint32_t b = 0; b < sg.n_blocks; ++b) {
    Block bk;
    if (uint32_t e = parse_block(blob, sg, b, &bk)) return parse_status(e);
    if (bk.words_off - sg.offset != expect) return corrupt("KVC1 block words not at their canonical offset");
    end = expect + 2ull * bk.n_words;
    expect = align16(end);
  }
  if (end != sg.bytes) return corrupt("KVC1 segment size disagrees with its blocks");
  return OkStatus();
}

Status check_segments(const uint8_t* blob, const Header& h, const Plane& pl) {
  if (pl.codec == kCodecRaw) return OkStatus();
  KDN_RETURN_IF_ERROR(check_segment_placement(blob, pl));
  for (uint32_t s = 0; s < pl.n_segments; ++s) {
    Segment sg;
    if (uint32_t e = parse_segment(blob, h, pl, s, &sg)) return parse_status(e);
    if (sg.bits != pl.bits) return corrupt("KVC1 segment bit width disagrees with its plane");
    if (sg.predictor != kPredictNone && h.head_dim % 8 != 0 &&
        (blob[sg.mask_off + h.head_dim / 8] >> (h.head_dim % 8)) != 0)
      return corrupt("KVC1 predictor mask flags channels beyond head_dim");
    if (sg.coding == kCodingRans) KDN_RETURN_IF_ERROR(check_rans_segment(blob, sg));
  }
  return OkStatus();
}

// Every stored scale finite and non-negative, every zero point finite.
Status check_scales(const uint8_t* blob, const Plane& pl, uint64_t per_array) {
  const uint8_t* s = blob + pl.params_off;
  const uint8_t* z = s + per_array * scale_bytes(pl.scale_dtype);
  for (uint64_t i = 0; i < per_array; ++i) {
    const float sv = load_scale(s, i, pl.scale_dtype);
    if (!std::isfinite(sv) || !(sv >= 0.0f) || !std::isfinite(load_scale(z, i, pl.scale_dtype)))
      return corrupt("KVC1 quantizer scale is not finite and non-negative");
  }
  return OkStatus();
}

// Rows stored exactly have S = Z = 0 (bits zero): per token-head row for UINT_TOK, per token
// group whose every token is exact for UINT_CHAN.
Status check_exact_scales_zero(const uint8_t* blob, const Header& h, const Plane& pl, uint64_t per_array) {
  const uint64_t sb = scale_bytes(pl.scale_dtype);
  const uint8_t* s = blob + pl.params_off;
  auto zero_at = [&](uint64_t i) {
    for (uint64_t b = 0; b < sb; ++b)
      if (s[i * sb + b] != 0 || s[(per_array + i) * sb + b] != 0) return false;
    return true;
  };
  const uint64_t ng = scale_groups(h, pl);
  if (pl.codec == kCodecUintToken) {
    for (uint32_t t = 0; t < h.tokens; ++t) {
      if (!is_exact_token(pl, h.tokens, t)) continue;
      for (uint64_t i = uint64_t{t} * h.kv_heads * ng; i < (t + 1ull) * h.kv_heads * ng; ++i)
        if (!zero_at(i)) return corrupt("KVC1 exact row has a non-zero scale");
    }
    return OkStatus();
  }
  // Group [g0, g1) is wholly exact when the quantized tokens [P, T - Q) miss it.
  const uint64_t quant_begin = pl.exact_tokens, quant_end = h.tokens - pl.exact_tail_tokens;
  for (uint32_t head = 0; head < h.kv_heads; ++head)
    for (uint64_t gi = 0; gi < ng; ++gi) {
      const uint64_t g0 = gi * pl.group, g1 = std::min<uint64_t>(g0 + pl.group, h.tokens);
      if (std::max(g0, quant_begin) < std::min(g1, quant_end)) continue;
      for (uint32_t d = 0; d < h.head_dim; ++d)
        if (!zero_at((head * ng + gi) * h.head_dim + d)) return corrupt("KVC1 exact token group has a non-zero scale");
    }
  return OkStatus();
}

// Quantized planes decode to finite values, their exact rows included.
Status check_exact_values(const uint8_t* e, uint64_t elems, uint32_t dtype) {
  const ExponentField f = exponent_field(dtype);
  for (uint64_t i = 0; i < elems; ++i) {
    const uint32_t u = f.width == 32 ? ld32(e + 4 * i) : ld16(e + 2 * i);
    if (((rotate_sign_down(u, f.width) >> f.shift) & f.mask) == f.mask)
      return corrupt("KVC1 exact row holds NaN or Inf");
  }
  return OkStatus();
}

Status check_exponent_refs(const uint8_t* blob, const Header& h, const Plane& pl) {
  const uint32_t mask = exponent_field(h.dtype).mask;
  for (uint32_t i = 0; i < pl.params_bytes; ++i)
    if (blob[pl.params_off + i] > mask) return corrupt("KVC1 exponent reference out of range");
  return OkStatus();
}

// Codec-specific header fields and parameter sizes.
Status check_plane_params(const uint8_t* blob, const Header& h, const Plane& pl) {
  const uint64_t elems = uint64_t{h.tokens} * h.kv_heads * h.head_dim;
  const bool float_src = h.dtype != KDN_DTYPE_FP8_E4M3;
  switch (pl.codec) {
    case kCodecRaw:
      if (pl.bits || pl.scale_dtype || pl.group || pl.params_bytes) return corrupt("KVC1 raw plane has parameters");
      if (pl.payload_bytes != elems * dtype_bytes_of(h.dtype)) return corrupt("KVC1 raw plane has the wrong size");
      return OkStatus();
    case kCodecBytePlanes:
      if (!float_src || pl.bits != 8 || pl.scale_dtype || pl.group) return corrupt("KVC1 byte-plane header invalid");
      if (pl.params_bytes != uint64_t{h.kv_heads} * h.head_dim) return corrupt("KVC1 byte-plane parameters size");
      return check_exponent_refs(blob, h, pl);
    default:
      break;
  }
  if (!float_src || pl.bits == 0 || pl.bits > 8) return corrupt("KVC1 quantized plane header invalid");
  if (pl.scale_dtype != kScaleF16 && pl.scale_dtype != kScaleF32) return corrupt("KVC1 unknown scale dtype");
  if (pl.codec == kCodecUintChannel && (pl.group == 0 || pl.group > h.tokens))
    return corrupt("KVC1 token group out of range");
  if (pl.codec == kCodecUintToken && (pl.group == 0 || h.head_dim % pl.group != 0))
    return corrupt("KVC1 channel group does not divide head_dim");
  if (pl.transform != kTransformNone && (h.version_minor < kVersionMinorTransform || !std::has_single_bit(h.head_dim)))
    return corrupt("KVC1 Hadamard plane in a minor-0 blob or with a head_dim that is not a power of two");
  const uint64_t per_array = scale_array_elems(h, pl);
  if (exact_rows(pl) == 0) {
    if (pl.params_bytes != quant_params_bytes(h, pl)) return corrupt("KVC1 scale array size");
    return check_scales(blob, pl, per_array);
  }
  if ((pl.exact_tokens && h.version_minor < kVersionMinorExact) ||
      (pl.exact_tail_tokens && h.version_minor < kVersionMinorExactTail))
    return corrupt("KVC1 exact leading rows in a blob of minor < 2 or exact trailing rows in one of minor < 3");
  if (exact_rows(pl) > h.tokens) return corrupt("KVC1 exact rows beyond the chunk's tokens");
  if (pl.exact_tail_tokens >= h.tokens) return corrupt("KVC1 exact trailing rows leave no token to code");
  if (pl.params_bytes != quant_params_bytes(h, pl)) return corrupt("KVC1 exact rows size");
  const uint64_t exact_off = exact_rows_offset(h, pl);
  const uint64_t exact_elems = exact_rows(pl) * h.kv_heads * h.head_dim;
  for (uint64_t i = 2 * per_array * scale_bytes(pl.scale_dtype); i < exact_off; ++i)
    if (blob[pl.params_off + i] != 0) return corrupt("KVC1 padding before the exact rows is not zero");
  KDN_RETURN_IF_ERROR(check_scales(blob, pl, per_array));
  KDN_RETURN_IF_ERROR(check_exact_scales_zero(blob, h, pl, per_array));
  return check_exact_values(blob + pl.params_off + exact_off, exact_elems, h.dtype);
}

}  // namespace

Status parse_status(uint32_t err) noexcept {
  switch (err) {
    case kParseOk:
      return OkStatus();
    case kParseTruncated:
      return Status(Code::kCorrupt, "KVC1 blob truncated or a length runs past its end");
    case kParseMagic:
      return Status(Code::kCorrupt, "not a KVC1 blob (bad magic)");
    case kParseVersion:
      return Status(Code::kVersion, "KVC1 major version not supported");
    case kParseMismatch:
      return Status(Code::kModelMismatch, "KVC1 blob is for another geometry or model");
    default:
      return Status(Code::kCorrupt, "KVC1 blob has an invalid field");
  }
}

Status open_blob(const uint8_t* blob, uint64_t len, bool verify_crc, Header* h) noexcept {
  if (uint32_t e = parse_header(blob, len, h)) return parse_status(e);
  if (verify_crc) {
    if (crc32c(blob, kHeaderCrcOffset) != h->header_crc) return corrupt("KVC1 header CRC mismatch");
    if (crc32c(blob + h->dir_off, h->dir_bytes) != h->dir_crc) return corrupt("KVC1 layer directory CRC mismatch");
  }
  // parse_header checked the calibration id's bytes (zero before minor 4).
  for (uint32_t i = kHfReserved2; i < kHfHeaderCrc; ++i)
    if (blob[i] != 0) return corrupt("KVC1 reserved header bytes are not zero");
  uint64_t expect = align16(h->dir_off + h->dir_bytes);
  for (uint32_t l = 0; l < h->layers; ++l) {
    LayerEntry e;
    if (uint32_t err = parse_layer_entry(blob, *h, l, &e)) return parse_status(err);
    if (e.offset != expect || e.bytes % kAlign != 0) return corrupt("KVC1 layer record not at its canonical offset");
    expect = e.offset + e.bytes;
  }
  if (expect != len) return corrupt("KVC1 blob length disagrees with its layer records");
  return OkStatus();
}

Status match_expected(const Header& h, const ChunkGeometry& g, const kdn_key& fingerprint) noexcept {
  if (h.tokens != g.tokens || h.layers != g.layers || h.kv_heads != g.kv_heads || h.head_dim != g.head_dim ||
      h.dtype != static_cast<uint32_t>(g.dtype))
    return Status(Code::kModelMismatch, "KVC1 blob has another chunk geometry");
  if (h.fingerprint.lo != fingerprint.lo || h.fingerprint.hi != fingerprint.hi)
    return Status(Code::kModelMismatch, "KVC1 blob belongs to another model");
  return OkStatus();
}

Status validate_layer(const uint8_t* blob, const Header& h, uint32_t layer, bool verify_crc, Plane out[2]) noexcept {
  LayerEntry e;
  if (uint32_t err = parse_layer_entry(blob, h, layer, &e)) return parse_status(err);
  if (verify_crc && crc32c(blob + e.offset, e.bytes) != e.crc) return corrupt("KVC1 layer record CRC mismatch");
  if (uint32_t err = locate_planes(blob, h, layer, out)) return parse_status(err);
  for (int p = 0; p < 2; ++p) {
    const Plane& pl = out[p];
    if (pl.codec == kCodecTransform) {
      KDN_RETURN_IF_ERROR(check_transform_plane(blob, h, pl));
      continue;
    }
    if (pl.n_segments != expected_segments(h, pl.codec)) return corrupt("KVC1 plane has the wrong segment count");
    KDN_RETURN_IF_ERROR(check_plane_params(blob, h, pl));
    KDN_RETURN_IF_ERROR(check_segments(blob, h, pl));
  }
  return OkStatus();
}

Status validate_segment_placement(const uint8_t* blob, const Plane& pl) noexcept {
  return check_segment_placement(blob, pl);
}

Status validate_rans_segment(const uint8_t* blob, const Segment& sg) noexcept { return check_rans_segment(blob, sg); }

Status validate_exact_values(const uint8_t* e, uint64_t elems, uint32_t dtype) noexcept {
  return check_exact_values(e, elems, dtype);
}

}  // namespace kdn::kernels::kvc1
