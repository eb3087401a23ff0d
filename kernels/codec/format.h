// KVC1 byte layout (docs/codec.md is the prose version; keep the two in step).
//
// Everything is little-endian. A blob is
//   FileHeader (128 B) | LayerDir (32 B per layer) | LayerRecord[0] | ... | LayerRecord[L-1]
// with every LayerRecord 16-byte aligned. A LayerRecord is the K PlaneRecord followed by the V
// PlaneRecord, each padded to 16 bytes. A PlaneRecord is a 32-byte header, the quantizer
// parameters (padded to 16) and the payload: for raw planes the source bytes, otherwise a
// segment directory and one segment per (head) or per (head, byte plane).
//
// The parse functions here are KDN_HD: the CUDA decoder locates its segment with the same code
// the CPU uses. They check bounds (never read outside the blob) and field ranges; the host-only
// full validation (validate.cc) adds CRCs and canonical placement on top.
#pragma once

#include <kdn/kdn.h>
#include <kdn/kernels/hd.h>

#include <cstdint>

namespace kdn::kernels::kvc1 {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "KVC1 code assumes a little-endian host");

constexpr uint16_t kVersionMajor = 1;
// Minor 1 adds the plane transform byte (kTransformHadamard), minor 2 the exact leading tokens
// of a quantized plane (Plane::exact_tokens), minor 3 its exact trailing tokens
// (Plane::exact_tail_tokens), which the plane's segments leave out. An encoder writes the
// lowest minor that describes the blob, so every other blob stays readable by older decoders.
constexpr uint16_t kVersionMinor = 0;
constexpr uint16_t kVersionMinorTransform = 1;
constexpr uint16_t kVersionMinorExact = 2;
constexpr uint16_t kVersionMinorExactTail = 3;
// Minor 4 adds transform-coded planes (kCodecTransform) and the calibration id in header bytes
// 104..119 that names the calibration object they were coded with (docs/codec.md §10).
constexpr uint16_t kVersionMinorCalibrated = 4;
constexpr uint32_t kHeaderBytes = 128;
constexpr uint32_t kHeaderCrcOffset = 124;
constexpr uint32_t kLayerEntryBytes = 32;
constexpr uint32_t kPlaneHeaderBytes = 32;
constexpr uint32_t kSegmentHeaderBytes = 16;
constexpr uint32_t kSegmentDirEntryBytes = 8;
constexpr uint32_t kBlockDescBytes = 8 + 4 * 32;  // n_words, word_off, state[32]
constexpr uint32_t kAlign = 16;

// Plane codecs (PlaneRecord.codec).
enum : uint8_t {
  kCodecRaw = 0,          // source bytes [t][h][d]
  kCodecBytePlanes = 1,   // lossless: exponent rebased per channel, bytes split into planes
  kCodecUintChannel = 2,  // asymmetric uint, per (head, token group, channel): K in kivi modes
  kCodecUintToken = 3,    // asymmetric uint, per (token, head, channel group): V, and int8
  kCodecTransform = 4,    // calibrated decorrelating transform, per-coordinate widths, band segments
};

// Plane transforms (PlaneRecord byte 3), applied to each (token, head) row before quantizing.
enum : uint8_t {
  kTransformNone = 0,
  kTransformHadamard = 1,  // y = H x, H the Sylvester Hadamard matrix of order head_dim (a power of 2)
};

// Segment codings (Segment.coding).
enum : uint8_t { kCodingPacked = 0, kCodingRans = 1 };

// Scale dtypes use the kdn_dtype codes.
constexpr uint8_t kScaleF16 = KDN_DTYPE_F16;
constexpr uint8_t kScaleF32 = KDN_DTYPE_F32;

// Parse results. The host maps them onto kdn::Status codes.
enum ParseError : uint32_t {
  kParseOk = 0,
  kParseTruncated,  // a structure runs past the end of the blob
  kParseMagic,      // not a KVC1 blob
  kParseVersion,    // a major version this decoder does not know
  kParseMismatch,   // geometry or fingerprint differs from what the caller expects
  kParseCorrupt,    // a field is out of range or inconsistent
};

KDN_HD_INLINE uint64_t align16(uint64_t v) { return (v + 15u) & ~uint64_t{15}; }

KDN_HD_INLINE uint16_t ld16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (static_cast<uint32_t>(p[1]) << 8));
}
KDN_HD_INLINE uint32_t ld32(const uint8_t* p) {
  return p[0] | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}
KDN_HD_INLINE uint64_t ld64(const uint8_t* p) { return ld32(p) | (static_cast<uint64_t>(ld32(p + 4)) << 32); }

// ---- file header ----------------------------------------------------------------------------

struct Header {
  uint16_t version_major, version_minor;
  uint32_t header_bytes;
  uint64_t total_bytes;
  kdn_key fingerprint, chunk_key;
  uint32_t tokens, layers, kv_heads, head_dim;
  uint8_t dtype, mode;
  uint16_t block_tokens;
  uint32_t flags;
  int64_t pos_base;
  uint64_t dir_off;
  uint32_t dir_bytes, dir_crc, header_crc;
  kdn_key calibration_id;  // minor >= 4: the calibration object transform planes need; else zero
};

// Field offsets inside the 128-byte header.
enum HeaderField : uint32_t {
  kHfMagic = 0,
  kHfVersionMajor = 8,
  kHfVersionMinor = 10,
  kHfHeaderBytes = 12,
  kHfTotalBytes = 16,
  kHfFingerprint = 24,
  kHfChunkKey = 40,
  kHfTokens = 56,
  kHfLayers = 60,
  kHfKvHeads = 64,
  kHfHeadDim = 68,
  kHfDtype = 72,
  kHfMode = 73,
  kHfBlockTokens = 74,
  kHfFlags = 76,
  kHfPosBase = 80,
  kHfDirOff = 88,
  kHfDirBytes = 96,
  kHfDirCrc = 100,
  kHfReserved = 104,
  kHfCalibrationId = 104,  // minor >= 4 (16 bytes); bytes 120..123 stay reserved
  kHfReserved2 = 120,
  kHfHeaderCrc = 124,
};

KDN_HD_INLINE bool magic_ok(const uint8_t* p) {
  const uint8_t m[8] = {'K', 'D', 'N', 'K', 'V', 'C', '1', 0};
  for (int i = 0; i < 8; ++i)
    if (p[i] != m[i]) return false;
  return true;
}

// Reads and range-checks the header (not its CRC). `len` is the blob length.
KDN_HD_INLINE uint32_t parse_header(const uint8_t* p, uint64_t len, Header* h) {
  if (len < kHeaderBytes) return kParseTruncated;
  if (!magic_ok(p)) return kParseMagic;
  h->version_major = ld16(p + kHfVersionMajor);
  h->version_minor = ld16(p + kHfVersionMinor);
  if (h->version_major != kVersionMajor) return kParseVersion;
  h->header_bytes = ld32(p + kHfHeaderBytes);
  h->total_bytes = ld64(p + kHfTotalBytes);
  h->fingerprint = kdn_key{ld64(p + kHfFingerprint), ld64(p + kHfFingerprint + 8)};
  h->chunk_key = kdn_key{ld64(p + kHfChunkKey), ld64(p + kHfChunkKey + 8)};
  h->tokens = ld32(p + kHfTokens);
  h->layers = ld32(p + kHfLayers);
  h->kv_heads = ld32(p + kHfKvHeads);
  h->head_dim = ld32(p + kHfHeadDim);
  h->dtype = p[kHfDtype];
  h->mode = p[kHfMode];
  h->block_tokens = ld16(p + kHfBlockTokens);
  h->flags = ld32(p + kHfFlags);
  h->pos_base = static_cast<int64_t>(ld64(p + kHfPosBase));
  h->dir_off = ld64(p + kHfDirOff);
  h->dir_bytes = ld32(p + kHfDirBytes);
  h->dir_crc = ld32(p + kHfDirCrc);
  h->header_crc = ld32(p + kHfHeaderCrc);
  h->calibration_id = kdn_key{ld64(p + kHfCalibrationId), ld64(p + kHfCalibrationId + 8)};
  if (h->version_minor < kVersionMinorCalibrated && (h->calibration_id.lo || h->calibration_id.hi))
    return kParseCorrupt;
  if (h->header_bytes != kHeaderBytes || h->total_bytes != len) return kParseCorrupt;
  if (h->flags != 0) return kParseCorrupt;  // no flag is defined in version 1
  if (h->tokens == 0 || h->tokens > 65536 || h->layers == 0 || h->layers > 1024) return kParseCorrupt;
  if (h->kv_heads == 0 || h->kv_heads > 1024 || h->head_dim == 0 || h->head_dim > 4096) return kParseCorrupt;
  if (h->dtype < KDN_DTYPE_F16 || h->dtype > KDN_DTYPE_FP8_E4M3 || h->mode > 5) return kParseCorrupt;
  // Mode 5 (transform) exists from minor 4 on, and names its calibration.
  if (h->mode == 5 && (h->version_minor < kVersionMinorCalibrated || !(h->calibration_id.lo || h->calibration_id.hi)))
    return kParseCorrupt;
  if (h->block_tokens == 0) return kParseCorrupt;
  if (h->dir_off != kHeaderBytes || h->dir_bytes != h->layers * kLayerEntryBytes) return kParseCorrupt;
  if (h->dir_off + h->dir_bytes > len) return kParseTruncated;
  return kParseOk;
}

KDN_HD_INLINE uint32_t dtype_bytes_of(uint32_t dtype) {
  return dtype == KDN_DTYPE_F32 ? 4 : dtype == KDN_DTYPE_FP8_E4M3 ? 1 : 2;
}

// ---- layer directory ------------------------------------------------------------------------

struct LayerEntry {
  uint64_t offset, bytes;
  uint32_t crc;
  uint8_t codec[2], bits[2];
};

KDN_HD_INLINE uint32_t parse_layer_entry(const uint8_t* blob, const Header& h, uint32_t layer, LayerEntry* e) {
  const uint8_t* p = blob + h.dir_off + static_cast<uint64_t>(layer) * kLayerEntryBytes;
  e->offset = ld64(p);
  e->bytes = ld64(p + 8);
  e->crc = ld32(p + 16);
  e->codec[0] = p[20];
  e->codec[1] = p[21];
  e->bits[0] = p[22];
  e->bits[1] = p[23];
  if (ld64(p + 24) != 0) return kParseCorrupt;
  if (e->offset % kAlign != 0 || e->offset < h.dir_off + h.dir_bytes) return kParseCorrupt;
  if (e->offset > h.total_bytes || e->bytes > h.total_bytes - e->offset) return kParseTruncated;
  return kParseOk;
}

// ---- plane records ----------------------------------------------------------------------------

struct Plane {
  uint64_t offset;       // blob offset of the plane header
  uint64_t params_off;   // blob offset of the parameters
  uint64_t payload_off;  // blob offset of the payload
  uint64_t end;          // blob offset just past the payload
  uint8_t codec, bits, scale_dtype, transform;
  uint32_t group, n_segments, params_bytes, payload_bytes;
  uint32_t exact_tokens;       // quantized planes: leading tokens stored exactly after S and Z
  uint32_t exact_tail_tokens;  // and trailing ones, stored after the leading ones
};

// Parses the plane header at `off`, which must lie inside [off, limit).
KDN_HD_INLINE uint32_t parse_plane(const uint8_t* blob, uint64_t off, uint64_t limit, Plane* pl) {
  if (off > limit || limit - off < kPlaneHeaderBytes) return kParseTruncated;
  const uint8_t* p = blob + off;
  pl->offset = off;
  pl->codec = p[0];
  pl->bits = p[1];
  pl->scale_dtype = p[2];
  pl->transform = p[3];
  pl->group = ld32(p + 4);
  pl->n_segments = ld32(p + 8);
  pl->params_bytes = ld32(p + 12);
  pl->payload_bytes = ld32(p + 16);
  pl->exact_tokens = ld32(p + 20);
  pl->exact_tail_tokens = ld32(p + 24);
  if (ld32(p + 28) != 0) return kParseCorrupt;
  pl->params_off = off + kPlaneHeaderBytes;
  pl->payload_off = pl->params_off + align16(pl->params_bytes);
  pl->end = pl->payload_off + pl->payload_bytes;
  if (pl->end > limit) return kParseTruncated;
  if (pl->codec > kCodecTransform) return kParseCorrupt;
  // Only per-token quantized rows are transformed (the transform mixes a row's channels).
  if (pl->transform > kTransformHadamard || (pl->transform && pl->codec != kCodecUintToken)) return kParseCorrupt;
  // Only quantized planes have rows that could be anything but exact.
  if ((pl->exact_tokens || pl->exact_tail_tokens) && pl->codec < kCodecUintChannel) return kParseCorrupt;
  return kParseOk;
}

// The K and V planes of a layer record, checked against the directory entry.
KDN_HD_INLINE uint32_t locate_planes(const uint8_t* blob, const Header& h, uint32_t layer, Plane out[2]) {
  LayerEntry e;
  if (uint32_t err = parse_layer_entry(blob, h, layer, &e)) return err;
  const uint64_t end = e.offset + e.bytes;
  if (uint32_t err = parse_plane(blob, e.offset, end, &out[0])) return err;
  if (uint32_t err = parse_plane(blob, align16(out[0].end), end, &out[1])) return err;
  if (align16(out[1].end) != end) return kParseCorrupt;
  for (int p = 0; p < 2; ++p)
    if (out[p].codec != e.codec[p] || out[p].bits != e.bits[p]) return kParseCorrupt;
  return kParseOk;
}

// ---- segments -------------------------------------------------------------------------------

// Segment predictors (Segment.predictor).
enum : uint8_t {
  kPredictNone = 0,
  kPredictTokenDelta = 1,  // flagged channels store (q[t] - q[t-1]) mod 2^bits, q[-1] = 0
};

struct Segment {
  uint64_t offset;  // blob offset of the segment header
  uint64_t bytes;
  uint8_t coding, bits, predictor;
  uint16_t n_syms;         // rANS table entries
  uint32_t n_symbols;      // symbols in the segment (coded_tokens * head_dim)
  uint32_t block_symbols;  // rANS: symbols per block (block_tokens * head_dim; the last may be shorter)
  uint32_t n_blocks;
  uint64_t mask_off;    // predictor: blob offset of the channel bitmask (ceil(head_dim / 8) bytes)
  uint64_t table_off;   // rANS: blob offset of u16 freq[n_syms]
  uint64_t blocks_off;  // rANS: blob offset of the block descriptors
};

KDN_HD_INLINE uint32_t effective_block_tokens(const Header& h) {
  return h.block_tokens < h.tokens ? h.block_tokens : h.tokens;
}

// Token rows 0 .. coded_tokens - 1 have codes in each segment of the plane: every row but the
// exact trailing ones (minor 3), which are stored only exactly. Exact leading rows (minor 2)
// keep zero placeholder codes. parse_segment guarantees exact_tail_tokens < tokens.
KDN_HD_INLINE uint32_t coded_tokens(const Header& h, const Plane& pl) { return h.tokens - pl.exact_tail_tokens; }

// Segment `s` of a plane: directory entry, header, and the rANS table/descriptor extents.
KDN_HD_INLINE uint32_t parse_segment(const uint8_t* blob, const Header& h, const Plane& pl, uint32_t s, Segment* sg) {
  if (s >= pl.n_segments) return kParseCorrupt;
  const uint64_t dir_bytes = static_cast<uint64_t>(pl.n_segments) * kSegmentDirEntryBytes;
  if (dir_bytes > pl.payload_bytes) return kParseTruncated;
  const uint8_t* d = blob + pl.payload_off + static_cast<uint64_t>(s) * kSegmentDirEntryBytes;
  const uint64_t rel = ld32(d);
  sg->bytes = ld32(d + 4);
  if (rel % kAlign != 0 || rel < dir_bytes) return kParseCorrupt;
  if (rel > pl.payload_bytes || sg->bytes > pl.payload_bytes - rel) return kParseTruncated;
  if (sg->bytes < kSegmentHeaderBytes) return kParseTruncated;
  sg->offset = pl.payload_off + rel;
  const uint8_t* p = blob + sg->offset;
  sg->coding = p[0];
  sg->bits = p[1];
  sg->n_syms = ld16(p + 2);
  sg->n_symbols = ld32(p + 4);
  sg->n_blocks = ld32(p + 8);
  sg->predictor = p[12];
  sg->block_symbols = effective_block_tokens(h) * h.head_dim;
  if (p[13] != 0 || ld16(p + 14) != 0) return kParseCorrupt;
  if (pl.exact_tail_tokens >= h.tokens) return kParseCorrupt;
  if (sg->bits == 0 || sg->bits > 8 || sg->n_symbols != coded_tokens(h, pl) * h.head_dim) return kParseCorrupt;
  if (sg->coding == kCodingPacked) {
    if (sg->n_syms != 0 || sg->n_blocks != 0 || sg->predictor != kPredictNone) return kParseCorrupt;
    const uint64_t words = (static_cast<uint64_t>(sg->n_symbols) * sg->bits + 31) / 32;
    if (sg->bytes != kSegmentHeaderBytes + 4 * words) return kParseCorrupt;
    sg->mask_off = sg->table_off = sg->blocks_off = 0;
    return kParseOk;
  }
  if (sg->coding != kCodingRans) return kParseCorrupt;
  if (sg->n_syms == 0 || sg->n_syms > (1u << sg->bits)) return kParseCorrupt;
  // The token delta needs every channel at most once per 32-symbol step (the GPU warp's unit).
  if (sg->predictor > kPredictTokenDelta || (sg->predictor && h.head_dim < 32)) return kParseCorrupt;
  const uint64_t blocks = (static_cast<uint64_t>(sg->n_symbols) + sg->block_symbols - 1) / sg->block_symbols;
  if (blocks != sg->n_blocks) return kParseCorrupt;
  sg->mask_off = sg->offset + kSegmentHeaderBytes;
  sg->table_off = sg->mask_off + (sg->predictor ? align16((h.head_dim + 7) / 8) : 0);
  sg->blocks_off = sg->table_off + align16(2u * sg->n_syms);
  const uint64_t need = sg->blocks_off - sg->offset + blocks * kBlockDescBytes;
  if (need > sg->bytes) return kParseTruncated;
  return kParseOk;
}

// True if channel d of a predicted segment is token-delta coded.
KDN_HD_INLINE bool channel_predicted(const uint8_t* blob, const Segment& sg, uint32_t d) {
  return sg.predictor == kPredictTokenDelta && ((blob[sg.mask_off + d / 8] >> (d % 8)) & 1u);
}

struct Block {
  uint32_t n_words;
  uint32_t n_symbols;
  uint64_t words_off;   // blob offset of u16 words[n_words]
  const uint8_t* desc;  // descriptor (state[j] at desc + 8 + 4j)
};

KDN_HD_INLINE uint32_t parse_block(const uint8_t* blob, const Segment& sg, uint32_t b, Block* bk) {
  if (b >= sg.n_blocks) return kParseCorrupt;
  bk->desc = blob + sg.blocks_off + static_cast<uint64_t>(b) * kBlockDescBytes;
  bk->n_words = ld32(bk->desc);
  const uint64_t rel = ld32(bk->desc + 4);
  const uint64_t first = static_cast<uint64_t>(b) * sg.block_symbols;
  const uint64_t rest = sg.n_symbols - first;
  bk->n_symbols = static_cast<uint32_t>(rest < sg.block_symbols ? rest : sg.block_symbols);
  const uint64_t desc_end = sg.blocks_off - sg.offset + static_cast<uint64_t>(sg.n_blocks) * kBlockDescBytes;
  if (rel % kAlign != 0 || rel < desc_end) return kParseCorrupt;
  if (rel > sg.bytes || 2ull * bk->n_words > sg.bytes - rel) return kParseTruncated;
  bk->words_off = sg.offset + rel;
  for (uint32_t j = 0; j < 32; ++j) {
    if (ld32(bk->desc + 8 + 4 * j) < (1u << 16)) return kParseCorrupt;  // states live in [2^16, 2^32)
  }
  return kParseOk;
}

// ---- plane geometry helpers -------------------------------------------------------------------

// Segments a plane must have: 0 (raw), kv_heads * element bytes (byte planes) or kv_heads.
KDN_HD_INLINE uint32_t expected_segments(const Header& h, uint8_t codec) {
  if (codec == kCodecRaw) return 0;
  if (codec == kCodecBytePlanes) return h.kv_heads * dtype_bytes_of(h.dtype);
  return h.kv_heads;
}

// Scale groups: uint_chan, token groups per head; uint_tok, channel groups per (token, head).
// The plane's group must be validated (non-zero) first.
KDN_HD_INLINE uint32_t scale_groups(const Header& h, const Plane& pl) {
  if (pl.codec == kCodecUintChannel) return (h.tokens + pl.group - 1) / pl.group;
  if (pl.codec == kCodecUintToken) return h.head_dim / pl.group;
  return 0;
}

KDN_HD_INLINE uint32_t scale_bytes(uint8_t scale_dtype) { return scale_dtype == kScaleF16 ? 2u : 4u; }

// Byte offsets (from params_off) of the S and Z values of the first channel of a row (t, head).
// uint_chan stores S[head][group][d] then Z likewise; uint_tok stores S[t][head][group] then Z.
KDN_HD_INLINE void row_scale_offsets(const Header& h, const Plane& pl, uint32_t t, uint32_t head, uint64_t* s_off,
                                     uint64_t* z_off) {
  const uint64_t sb = scale_bytes(pl.scale_dtype);
  const uint64_t ng = scale_groups(h, pl);
  if (pl.codec == kCodecUintChannel) {
    const uint64_t per_array = uint64_t{h.kv_heads} * ng * h.head_dim;
    *s_off = ((uint64_t{head} * ng + t / pl.group) * h.head_dim) * sb;
    *z_off = *s_off + per_array * sb;
  } else {
    const uint64_t per_array = uint64_t{h.tokens} * h.kv_heads * ng;
    *s_off = ((uint64_t{t} * h.kv_heads + head) * ng) * sb;
    *z_off = *s_off + per_array * sb;
  }
}

// Elements in each of the S and Z arrays of a uint plane (group validated first).
KDN_HD_INLINE uint64_t scale_array_elems(const Header& h, const Plane& pl) {
  const uint64_t ng = scale_groups(h, pl);
  return pl.codec == kCodecUintChannel ? uint64_t{h.kv_heads} * ng * h.head_dim : uint64_t{h.tokens} * h.kv_heads * ng;
}

// Exact rows of a plane: E[exact_tokens + exact_tail_tokens][kv_heads][head_dim], the leading
// tokens 0.. then the trailing tokens T - exact_tail_tokens.., in the chunk dtype. Full
// validation guarantees exact_tokens + exact_tail_tokens <= T.
KDN_HD_INLINE uint64_t exact_rows(const Plane& pl) { return uint64_t{pl.exact_tokens} + pl.exact_tail_tokens; }

// Whether token t of a `tokens`-token plane is stored exactly.
KDN_HD_INLINE bool is_exact_token(const Plane& pl, uint32_t tokens, uint32_t t) {
  return t < pl.exact_tokens || uint64_t{t} + pl.exact_tail_tokens >= tokens;
}

// The row of E that holds exact token t.
KDN_HD_INLINE uint32_t exact_row_of(const Plane& pl, uint32_t tokens, uint32_t t) {
  return t < pl.exact_tokens ? t : pl.exact_tokens + (t - (tokens - pl.exact_tail_tokens));
}

// Byte offset (from params_off) of the exact rows, stored after S and Z at the next 16-byte
// boundary.
KDN_HD_INLINE uint64_t exact_rows_offset(const Header& h, const Plane& pl) {
  return align16(2 * scale_array_elems(h, pl) * scale_bytes(pl.scale_dtype));
}

// params_bytes of a uint plane: S and Z, then (any exact rows) the padding and exact rows.
KDN_HD_INLINE uint64_t quant_params_bytes(const Header& h, const Plane& pl) {
  const uint64_t rows = exact_rows(pl);
  if (rows == 0) return 2 * scale_array_elems(h, pl) * scale_bytes(pl.scale_dtype);
  return exact_rows_offset(h, pl) + rows * h.kv_heads * h.head_dim * dtype_bytes_of(h.dtype);
}

// ---- lossless byte-plane transform ---------------------------------------------------------------
//
// An element's bits u (16 or 32 of them) are rotated left by one, which moves the sign to bit 0
// and puts the exponent at the top; the exponent e is then replaced by emax - e, emax being
// the largest exponent of that channel in the chunk (params: u8 emax[head][d]). Byte k of the
// result (k = 0 the most significant) is byte plane k.

struct ExponentField {
  uint32_t width;  // element bits (16 or 32)
  uint32_t shift;  // exponent position after the rotation
  uint32_t mask;   // exponent mask after shifting down (2^bits - 1)
};

KDN_HD_INLINE ExponentField exponent_field(uint32_t dtype) {
  if (dtype == KDN_DTYPE_F16) return {16, 11, 0x1fu};
  if (dtype == KDN_DTYPE_BF16) return {16, 8, 0xffu};
  return {32, 24, 0xffu};
}

KDN_HD_INLINE uint32_t rotate_sign_down(uint32_t u, uint32_t width) {
  const uint32_t all = width == 32 ? 0xffffffffu : (1u << width) - 1;
  return ((u << 1) | (u >> (width - 1))) & all;
}

KDN_HD_INLINE uint32_t rotate_sign_up(uint32_t r, uint32_t width) { return (r >> 1) | ((r & 1u) << (width - 1)); }

// Element bits from the transformed value r' and the channel's emax. Sets *bad if r' carries
// an exponent delta larger than emax (only a corrupt blob does).
KDN_HD_INLINE uint32_t untransform_element(uint32_t rp, uint32_t emax, const ExponentField& f, bool* bad) {
  const uint32_t delta = rp >> f.shift;
  *bad |= delta > emax;
  const uint32_t low = rp & ((1u << f.shift) - 1);
  return rotate_sign_up((((emax - delta) & f.mask) << f.shift) | low, f.width);
}

}  // namespace kdn::kernels::kvc1
