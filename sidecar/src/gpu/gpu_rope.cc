#include "gpu_rope.h"

#include <kdn/common/model.h>
#include <kdn/kernels/segment.h>

#include <unordered_map>

namespace kdn::sidecar::gpu {

std::vector<uint8_t> leading_chunks(std::span<const ipc::GpuSegmentChunkRecord> recs, std::span<const uint8_t> cached) {
  std::vector<uint8_t> keep(recs.size(), 0);
  bool run = true;  // the segment of the current record has no miss yet
  for (size_t i = 0; i < recs.size(); ++i) {
    if (recs[i].flags & ipc::kGpuSegmentStart) run = true;
    run = run && i < cached.size() && cached[i] != 0;
    keep[i] = run ? 1 : 0;
  }
  return keep;
}

RopeRows group_deltas(std::span<const int64_t> deltas) {
  RopeRows out;
  out.row.reserve(deltas.size());
  std::unordered_map<int64_t, int32_t> seen;
  for (int64_t d : deltas) {
    if (d == 0) {
      out.row.push_back(-1);
      continue;
    }
    auto [it, added] = seen.emplace(d, int32_t(out.distinct.size()));
    if (added) out.distinct.push_back(d);
    out.row.push_back(it->second);
  }
  return out;
}

Result<SegmentPlacement> place_segment_chunks(const kdn_model_desc& model,
                                              std::span<const ipc::GpuSegmentChunkRecord> recs) {
  SegmentPlacement p;
  std::vector<int64_t> deltas;
  deltas.reserve(recs.size());
  for (const ipc::GpuSegmentChunkRecord& r : recs) {
    if (r.delta > KDN_MAX_POSITION || r.delta < -KDN_MAX_POSITION)
      return Status(Code::kInvalidArgument, "GPU_SEGMENT_RETRIEVE: position delta out of range");
    p.first_token.push_back(int64_t(r.first_token));
    deltas.push_back(r.delta);
  }
  RopeRows rows = group_deltas(deltas);
  p.row = std::move(rows.row);
  if (rows.distinct.empty()) return p;
  if (model.rope_style == KDN_ROPE_NONE)
    return Status(Code::kUnsupported, "segment: moving KV needs a model with RoPE");
  float inv[kMaxHeadDim / 2];
  kernels::SegmentRope rope;
  KDN_RETURN_IF_ERROR(kernels::segment_rope_from_desc(model, inv, kMaxHeadDim / 2, &rope));
  p.style = rope.style;
  p.rotary_dim = rope.rotary_dim;
  const size_t floats = kernels::rope_table_floats(uint32_t(rows.distinct.size()), rope.rotary_dim);
  p.table.resize(floats);
  KDN_RETURN_IF_ERROR(kernels::build_rope_table(inv, rope.rotary_dim, rows.distinct.data(),
                                                uint32_t(rows.distinct.size()), p.table.data(), floats));
  return p;
}

}  // namespace kdn::sidecar::gpu
