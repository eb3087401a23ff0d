// Host side of the device encoder: the batch plan and the scratch layout.
#include "encode_device_plan.h"

#include "encoder.h"

namespace kdn::kernels::kvc1 {
namespace {

uint16_t version_minor_of(const EncodePlan& plan) {
  if (plan.exact_tail_tokens) return kVersionMinorExactTail;
  if (plan.exact_tokens) return kVersionMinorExact;
  return plan.rotate ? kVersionMinorTransform : kVersionMinor;
}

// Largest parameters of a plane: S and Z as f32, then the exact rows.
uint64_t params_max_bytes(const ChunkGeometry& g, const PlaneSpec& spec) {
  return align16(quant_params_bytes(geometry_header(g), spec_plane(spec, kScaleF32)));
}

}  // namespace

Status plan_device_encode(const ChunkGeometry& g, const kdn_key& fingerprint, const CodecConfig& cfg, uint32_t n,
                          uint8_t* base, EncodeJob* job, DevicePlaneSpec* specs, uint64_t* bytes) noexcept {
  EncodePlan plan;
  KDN_RETURN_IF_ERROR(make_encode_plan(g, cfg, &plan));
  if (plan.mode == CodecMode::kRaw || plan.mode == CodecMode::kLossless || plan.mode == CodecMode::kTransform)
    return Status(Code::kUnsupported, "the device encoder runs the quantized modes only");
  if (n == 0) return Status(Code::kInvalidArgument, "empty batch");
  EncodeJob j{};
  uint64_t params_slot = 0;
  uint32_t max_bits = 1;
  for (uint32_t lp = 0; lp < 2 * g.layers; ++lp) {
    const PlaneSpec s = plane_spec(plan, g, lp / 2, lp % 2);
    if (specs)
      specs[lp] = DevicePlaneSpec{s.codec, s.bits, s.transform, 0, s.group, s.exact_tokens, s.exact_tail_tokens};
    const uint64_t p = params_max_bytes(g, s);
    params_slot = p > params_slot ? p : params_slot;
    max_bits = s.bits > max_bits ? s.bits : max_bits;
  }
  const uint64_t planes = uint64_t{n} * 2 * g.layers, segs = planes * g.kv_heads;
  j.params_slot = params_slot;
  j.seg_slot = align16(kSegmentHeaderBytes + 4 * ((uint64_t{g.tokens} * g.head_dim * max_bits + 31) / 32));
  j.max_syms = 1u << max_bits;
  j.seg_work = segment_work_bytes(g.tokens, g.head_dim, plan.block_tokens, j.max_syms);
  // Regions, each 16-aligned: head words, written[n], chunks[n], outs[n], specs, meta, seg_bytes,
  // params, segments, work.
  uint64_t at = kDeviceEncodeHeadBytes;
  auto take = [&at](uint64_t size) {
    const uint64_t off = at;
    at = align16(at + size);
    return off;
  };
  const uint64_t o_written = take(8 * uint64_t{n}), o_chunks = take(8 * uint64_t{n}), o_outs = take(8 * uint64_t{n});
  const uint64_t o_specs = take(sizeof(DevicePlaneSpec) * 2 * g.layers), o_meta = take(sizeof(PlaneMeta) * planes);
  const uint64_t o_seg_bytes = take(8 * segs), o_params = take(params_slot * planes);
  const uint64_t o_segments = take(j.seg_slot * segs), o_work = take(j.seg_work * segs);
  *bytes = at;
  if (!base) return OkStatus();
  j.error = reinterpret_cast<uint32_t*>(base);
  j.written = reinterpret_cast<uint64_t*>(base + o_written);
  j.chunks = reinterpret_cast<const uint8_t* const*>(base + o_chunks);
  j.outs = reinterpret_cast<uint8_t* const*>(base + o_outs);
  j.specs = reinterpret_cast<const DevicePlaneSpec*>(base + o_specs);
  j.meta = reinterpret_cast<PlaneMeta*>(base + o_meta);
  j.seg_bytes = reinterpret_cast<uint64_t*>(base + o_seg_bytes);
  j.params = base + o_params;
  j.segments = base + o_segments;
  j.work = base + o_work;
  j.n_chunks = n;
  j.layers = g.layers;
  j.kv_heads = g.kv_heads;
  j.head_dim = g.head_dim;
  j.tokens = g.tokens;
  j.dtype = static_cast<uint32_t>(g.dtype);
  j.mode = static_cast<uint32_t>(plan.mode);
  j.block_tokens = plan.block_tokens;
  j.version_minor = version_minor_of(plan);
  j.entropy = plan.entropy;
  j.token_delta = plan.token_delta;
  j.f32_scales = plan.f32_scales;
  j.pos_base = cfg.pos_base;
  j.fingerprint_lo = fingerprint.lo;
  j.fingerprint_hi = fingerprint.hi;
  j.chunk_key_lo = cfg.chunk_key.lo;
  j.chunk_key_hi = cfg.chunk_key.hi;
  *job = j;
  return OkStatus();
}

}  // namespace kdn::kernels::kvc1
