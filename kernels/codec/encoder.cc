// KVC1 encoder: configuration, sizes, the file header and the layer directory.
#include "encoder.h"

#include "crc32c.h"
#include "encode_transform.h"
#include "transform_format.h"

#include <algorithm>
#include <bit>
#include <cstring>

namespace kdn::kernels {
namespace kvc1 {
namespace {

bool quantized(CodecMode m) { return m == CodecMode::kInt8 || m == CodecMode::kKivi4 || m == CodecMode::kKivi2; }

// Modes whose planes keep exact sink and recent rows.
bool lossy(CodecMode m) { return quantized(m) || m == CodecMode::kTransform; }

constexpr double kDefaultTransformBits = 2.0;

// The transform mode's own settings: a calibration of this geometry, a usable mean width.
Status plan_transform(const ChunkGeometry& g, const CodecConfig& cfg, EncodePlan& p) {
  const Kvc1Calibration* c = cfg.calibration;
  if (!c || !c->data) return Status(Code::kInvalidArgument, "the transform mode needs a calibration");
  if (c->layers != g.layers || c->kv_heads != g.kv_heads || c->head_dim != g.head_dim)
    return Status(Code::kInvalidArgument, "the calibration is for another geometry");
  if (uint64_t{g.kv_heads} * g.head_dim > kMaxHeadDim)
    return Status(Code::kUnsupported, "the transform mode needs kv_heads * head_dim <= 4096");
  if (cfg.k_bits || cfg.v_bits || cfg.layer_k_bits || cfg.layer_v_bits || cfg.rotate)
    return Status(Code::kInvalidArgument, "the transform mode takes transform_mean_bits, not bit widths or rotate");
  const double bits = cfg.transform_mean_bits ? cfg.transform_mean_bits : kDefaultTransformBits;
  if (!(bits > 0.0 && bits <= 8.0)) return Status(Code::kInvalidArgument, "transform_mean_bits must be in (0, 8]");
  p.calibration = c;
  p.transform_bits = bits;
  return OkStatus();
}

bool bits_ok(uint8_t b) { return b >= 1 && b <= 8; }

Status check_layer_bits(const uint8_t* bits, uint32_t layers) {
  if (!bits) return OkStatus();
  for (uint32_t l = 0; l < layers; ++l)
    if (!bits_ok(bits[l])) return Status(Code::kInvalidArgument, "per-layer bit widths must be 1..8");
  return OkStatus();
}

uint64_t layer_max_bytes(const ChunkGeometry& g, const EncodePlan& plan, uint32_t layer) {
  return align16(plane_max_bytes(g, plane_spec(plan, g, layer, 0))) +
         align16(plane_max_bytes(g, plane_spec(plan, g, layer, 1)));
}

void write_header(const ChunkGeometry& g, const kdn_key& fp, const CodecConfig& cfg, const EncodePlan& plan,
                  OutBuf& out, uint64_t total, uint32_t dir_crc) {
  uint8_t* p = out.data;
  std::memset(p, 0, kHeaderBytes);
  std::memcpy(p, "KDNKVC1", 8);
  out.st16(kHfVersionMajor, kVersionMajor);
  out.st16(kHfVersionMinor, plan.calibration         ? kVersionMinorCalibrated
                            : plan.exact_tail_tokens ? kVersionMinorExactTail
                            : plan.exact_tokens      ? kVersionMinorExact
                            : plan.rotate            ? kVersionMinorTransform
                                                     : kVersionMinor);
  out.st32(kHfHeaderBytes, kHeaderBytes);
  out.st64(kHfTotalBytes, total);
  out.st64(kHfFingerprint, fp.lo);
  out.st64(kHfFingerprint + 8, fp.hi);
  out.st64(kHfChunkKey, cfg.chunk_key.lo);
  out.st64(kHfChunkKey + 8, cfg.chunk_key.hi);
  out.st32(kHfTokens, g.tokens);
  out.st32(kHfLayers, g.layers);
  out.st32(kHfKvHeads, g.kv_heads);
  out.st32(kHfHeadDim, g.head_dim);
  p[kHfDtype] = static_cast<uint8_t>(g.dtype);
  p[kHfMode] = static_cast<uint8_t>(plan.mode);
  out.st16(kHfBlockTokens, static_cast<uint16_t>(plan.block_tokens));
  out.st64(kHfPosBase, static_cast<uint64_t>(cfg.pos_base));
  out.st64(kHfDirOff, kHeaderBytes);
  out.st32(kHfDirBytes, g.layers * kLayerEntryBytes);
  out.st32(kHfDirCrc, dir_crc);
  if (plan.calibration) {
    out.st64(kHfCalibrationId, plan.calibration->id.lo);
    out.st64(kHfCalibrationId + 8, plan.calibration->id.hi);
  }
  out.st32(kHfHeaderCrc, crc32c(p, kHeaderCrcOffset));
}

void write_layer_entry(OutBuf& out, uint32_t layer, uint64_t off, uint64_t bytes, const PlaneSpec spec[2]) {
  const size_t at = kHeaderBytes + size_t{layer} * kLayerEntryBytes;
  out.st64(at, off);
  out.st64(at + 8, bytes);
  out.st32(at + 16, crc32c(out.data + off, bytes));
  out.data[at + 20] = spec[0].codec;
  out.data[at + 21] = spec[1].codec;
  out.data[at + 22] = spec[0].bits;
  out.data[at + 23] = spec[1].bits;
  out.st64(at + 24, 0);
}

}  // namespace

Status check_codec_geometry(const ChunkGeometry& g) noexcept {
  if (g.layers == 0 || g.layers > kMaxLayers || g.kv_heads == 0 || g.kv_heads > kMaxHeads || g.head_dim == 0 ||
      g.head_dim > kMaxHeadDim || g.tokens == 0 || g.tokens > kMaxChunkTokens)
    return Status(Code::kInvalidArgument, "chunk geometry out of range");
  if (!dtype_valid(static_cast<uint32_t>(g.dtype))) return Status(Code::kInvalidArgument, "unknown chunk dtype");
  const uint64_t bytes = uint64_t{g.layers} * 2 * g.tokens * g.kv_heads * g.head_dim * dtype_size(g.dtype);
  if (bytes > kMaxChunkBytes) return Status(Code::kInvalidArgument, "chunk larger than 4 GiB");
  return OkStatus();
}

Status make_encode_plan(const ChunkGeometry& g, const CodecConfig& cfg, EncodePlan* out) noexcept {
  KDN_RETURN_IF_ERROR(check_codec_geometry(g));
  if (static_cast<uint8_t>(cfg.mode) > static_cast<uint8_t>(CodecMode::kTransform))
    return Status(Code::kInvalidArgument, "unknown codec mode");
  EncodePlan& p = *out;
  p = EncodePlan{};
  p.mode = cfg.mode;
  const bool q = quantized(cfg.mode);
  if (cfg.mode == CodecMode::kTransform) {
    if (g.dtype == DType::kFP8E4M3) return Status(Code::kUnsupported, "fp8 chunks can only be stored raw");
    KDN_RETURN_IF_ERROR(plan_transform(g, cfg, p));
  }
  if (g.dtype == DType::kFP8E4M3 && cfg.mode != CodecMode::kRaw)
    return Status(Code::kUnsupported, "fp8 chunks can only be stored raw");
  if (!q && (cfg.k_bits || cfg.v_bits || cfg.layer_k_bits || cfg.layer_v_bits))
    return Status(Code::kInvalidArgument, "bit widths apply to quantized modes only");
  p.k_bits = cfg.k_bits ? cfg.k_bits : codec_mode_default_bits(cfg.mode);
  p.v_bits = cfg.v_bits ? cfg.v_bits : codec_mode_default_bits(cfg.mode);
  if (q && (!bits_ok(p.k_bits) || !bits_ok(p.v_bits))) return Status(Code::kInvalidArgument, "bit widths must be 1..8");
  KDN_RETURN_IF_ERROR(check_layer_bits(cfg.layer_k_bits, g.layers));
  KDN_RETURN_IF_ERROR(check_layer_bits(cfg.layer_v_bits, g.layers));
  p.layer_bits[0] = cfg.layer_k_bits;
  p.layer_bits[1] = cfg.layer_v_bits;
  const uint32_t kg = cfg.k_group_tokens ? cfg.k_group_tokens : kDefaultKGroupTokens;
  p.k_group = kg < g.tokens ? kg : g.tokens;
  p.v_group = cfg.v_group_channels ? cfg.v_group_channels : g.head_dim;
  if (g.head_dim % p.v_group != 0) return Status(Code::kInvalidArgument, "v_group_channels must divide head_dim");
  const uint32_t tb = cfg.block_tokens ? cfg.block_tokens : kDefaultBlockTokens;
  if (tb > 0xffff) return Status(Code::kInvalidArgument, "block_tokens must be at most 65535");
  p.block_tokens = tb < g.tokens ? tb : g.tokens;
  p.entropy = cfg.entropy;
  p.token_delta = cfg.token_delta;
  p.f32_scales = cfg.f32_scales;
  p.rotate = cfg.rotate;
  if (p.rotate && !q) return Status(Code::kInvalidArgument, "rotate applies to quantized modes only");
  if (p.rotate && !std::has_single_bit(g.head_dim))
    return Status(Code::kInvalidArgument, "rotate needs a power-of-two head_dim");
  p.exact_tokens = lossy(cfg.mode) && cfg.pos_base == 0 ? (cfg.sink_tokens < g.tokens ? cfg.sink_tokens : g.tokens) : 0;
  // The sinks come first when a chunk has both; at least one token row stays coded.
  const uint32_t rest = std::min(g.tokens - p.exact_tokens, g.tokens - 1);
  p.exact_tail_tokens = lossy(cfg.mode) && cfg.ends_context ? std::min(cfg.recent_tokens, rest) : 0;
  return OkStatus();
}

PlaneSpec plane_spec(const EncodePlan& plan, const ChunkGeometry& g, uint32_t layer, uint32_t plane) noexcept {
  switch (plan.mode) {
    case CodecMode::kTransform:  // the width is the plane's largest, known once allotted
      return {kCodecTransform, 8, 0, kTransformNone, plan.exact_tokens, plan.exact_tail_tokens};
    case CodecMode::kRaw:
      return {kCodecRaw, 0, 0};
    case CodecMode::kLossless:
      return {kCodecBytePlanes, 8, 0};
    default:
      break;
  }
  const uint8_t bits = plan.layer_bits[plane] ? plan.layer_bits[plane][layer] : (plane ? plan.v_bits : plan.k_bits);
  // int8 is per (token, head) for both planes; the kivi modes are per channel for K, unless
  // rows are rotated, which makes K per (token, head) too.
  if (plane == 0 && plan.mode != CodecMode::kInt8 && !plan.rotate)
    return {kCodecUintChannel, bits, plan.k_group, kTransformNone, plan.exact_tokens, plan.exact_tail_tokens};
  return {kCodecUintToken,
          bits,
          plane == 0 ? g.head_dim : plan.v_group,
          plan.rotate ? kTransformHadamard : kTransformNone,
          plan.exact_tokens,
          plan.exact_tail_tokens};
}

Header geometry_header(const ChunkGeometry& g) noexcept {
  Header h{};
  h.tokens = g.tokens;
  h.kv_heads = g.kv_heads;
  h.head_dim = g.head_dim;
  h.dtype = static_cast<uint8_t>(g.dtype);
  return h;
}

Plane spec_plane(const PlaneSpec& spec, uint8_t scale_dtype) noexcept {
  Plane pl{};
  pl.codec = spec.codec;
  pl.bits = spec.bits;
  pl.group = spec.group;
  pl.transform = spec.transform;
  pl.scale_dtype = scale_dtype;
  pl.exact_tokens = spec.exact_tokens;
  pl.exact_tail_tokens = spec.exact_tail_tokens;
  return pl;
}

uint64_t plane_max_bytes(const ChunkGeometry& g, const PlaneSpec& spec) noexcept {
  const uint64_t elems = uint64_t{g.tokens} * g.kv_heads * g.head_dim;
  if (spec.codec == kCodecTransform) {  // f32 scales, and at most 8 packed band segments of 8-bit codes
    const uint64_t exact = uint64_t{spec.exact_tokens} + spec.exact_tail_tokens;
    const uint64_t params =
        align16(elems / g.tokens) + 8 * (elems / g.tokens) + 16 + exact * g.kv_heads * g.head_dim * dtype_size(g.dtype);
    return kPlaneHeaderBytes + align16(params) + 8 * 8 + 8 * (kSegmentHeaderBytes + 32) + elems;
  }
  if (spec.codec == kCodecRaw) return kPlaneHeaderBytes + elems * dtype_size(g.dtype);
  uint64_t params = 0;
  uint64_t segments = g.kv_heads;
  if (spec.codec == kCodecBytePlanes) {
    params = uint64_t{g.kv_heads} * g.head_dim;
    segments *= dtype_size(g.dtype);
  } else if (spec.codec == kCodecUintChannel) {
    params = 2 * 4 * uint64_t{g.kv_heads} * ((g.tokens + spec.group - 1) / spec.group) * g.head_dim;
  } else {
    params = 2 * 4 * uint64_t{g.tokens} * g.kv_heads * (g.head_dim / spec.group);
  }
  const uint64_t exact = uint64_t{spec.exact_tokens} + spec.exact_tail_tokens;
  if (exact) params = align16(params) + exact * g.kv_heads * g.head_dim * dtype_size(g.dtype);
  const uint64_t seg = align16(kSegmentHeaderBytes + 4 * ((uint64_t{g.tokens} * g.head_dim * spec.bits + 31) / 32));
  return kPlaneHeaderBytes + align16(params) + align16(segments * kSegmentDirEntryBytes) + segments * seg;
}

}  // namespace kvc1

size_t kvc1_max_encoded_size(const ChunkGeometry& g, const CodecConfig& cfg) noexcept {
  kvc1::EncodePlan plan;
  if (!kvc1::make_encode_plan(g, cfg, &plan).ok()) return 0;
  uint64_t total = kvc1::align16(kvc1::kHeaderBytes + uint64_t{g.layers} * kvc1::kLayerEntryBytes);
  for (uint32_t l = 0; l < g.layers; ++l) total += kvc1::layer_max_bytes(g, plan, l);
  return static_cast<size_t>(total);
}

size_t kvc1_encode_scratch_bytes(const ChunkGeometry& g, const CodecConfig& cfg) noexcept {
  kvc1::EncodePlan plan;
  if (!kvc1::make_encode_plan(g, cfg, &plan).ok()) return 0;
  if (plan.mode == CodecMode::kTransform) return kvc1::transform_scratch_bytes(g, plan.block_tokens);
  return kvc1::encode_scratch_bytes(g, plan.block_tokens);
}

Status kvc1_encode(const ChunkGeometry& g, const kdn_key& fingerprint, const void* chunk, const CodecConfig& cfg,
                   uint8_t* out, size_t cap, size_t* written, void* scratch, size_t scratch_bytes) noexcept {
  using namespace kvc1;
  if (!chunk || !out || !written) return Status(Code::kInvalidArgument, "null argument");
  EncodePlan plan;
  KDN_RETURN_IF_ERROR(make_encode_plan(g, cfg, &plan));
  EncodeScratch sc;
  TransformScratch ts{};
  const bool transform = plan.mode == CodecMode::kTransform;
  if (transform && !(plan.calibration->fingerprint == fingerprint))
    return Status(Code::kInvalidArgument, "the calibration belongs to another model");
  if (transform ? !carve_transform_scratch(scratch, scratch_bytes, g, plan.block_tokens, &ts, &sc)
                : !carve_scratch(scratch, scratch_bytes, g, plan.block_tokens, &sc))
    return Status(Code::kInvalidArgument, "encode scratch too small (see kvc1_encode_scratch_bytes)");
  OutBuf ob{out, cap, 0};
  if (!ob.zeros(kHeaderBytes + size_t{g.layers} * kLayerEntryBytes) || !ob.pad16())
    return Status(Code::kNoSpace, "KVC1 output buffer too small");
  for (uint32_t l = 0; l < g.layers; ++l) {
    const size_t rec = ob.pos;
    PlaneSpec spec[2] = {plane_spec(plan, g, l, 0), plane_spec(plan, g, l, 1)};
    for (uint32_t p = 0; p < 2; ++p)
      KDN_RETURN_IF_ERROR(transform ? write_transform_plane(g, chunk, l, p, spec[p], plan, ts, sc, ob)
                                    : write_plane(g, chunk, l, p, spec[p], plan, sc, ob));
    write_layer_entry(ob, l, rec, ob.pos - rec, spec);
  }
  write_header(g, fingerprint, cfg, plan, ob, ob.pos, crc32c(out + kHeaderBytes, size_t{g.layers} * kLayerEntryBytes));
  *written = ob.pos;
  return OkStatus();
}

}  // namespace kdn::kernels
