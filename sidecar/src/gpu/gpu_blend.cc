#include "gpu_blend.h"

#include <kdn/kernels/dtype.h>

#include <algorithm>
#include <cstring>

namespace kdn::sidecar::gpu {
namespace {

constexpr uint64_t kAlign = 256;
uint64_t aligned(uint64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

}  // namespace

uint32_t recompute_count_ppm(uint32_t candidates, uint32_t ratio_ppm) noexcept {
  if (ratio_ppm == 0 || candidates == 0) return 0;
  if (ratio_ppm >= ipc::kGpuBlendRatioOne) return candidates;
  const uint64_t n = uint64_t(candidates) * ratio_ppm / ipc::kGpuBlendRatioOne;
  return uint32_t(std::clamp<uint64_t>(n, 1, candidates));
}

Result<BlendPlan> plan_blend(const kernels::ChunkGeometry& chunk, std::span<const int64_t> slots,
                             std::span<const ipc::GpuSegmentChunkRecord> recs, const BlendQuery& q, uint64_t out_room) {
  if (q.check_layer >= chunk.layers)
    return Status(Code::kInvalidArgument, "GPU_BLEND_SELECT: check layer past the model's layers");
  if (q.plane != ipc::kGpuBlendPlaneK && q.plane != ipc::kGpuBlendPlaneV)
    return Status(Code::kInvalidArgument, "GPU_BLEND_SELECT: plane is neither K nor V");
  if (q.ratio_ppm > ipc::kGpuBlendRatioOne) return Status(Code::kInvalidArgument, "GPU_BLEND_SELECT: ratio above 1");
  const uint64_t T = chunk.tokens;
  if (uint64_t(recs.size()) * T > uint64_t(INT32_MAX))
    return Status(Code::kLimit, "GPU_BLEND_SELECT: more than 2^31 tokens compared");
  BlendPlan p;
  p.layer = chunk;
  p.layer.layers = 1;
  const uint64_t esize = kernels::dtype_size(chunk.dtype);
  p.layer_offset_bytes = uint64_t(kernels::chunk_offset(chunk, q.check_layer, 0, 0, 0, 0)) * esize;
  p.layer_bytes = kernels::chunk_bytes(p.layer);
  p.check_layer = q.check_layer;
  p.plane = q.plane;
  p.n_tokens = uint32_t(recs.size() * T);
  p.first_token.reserve(recs.size());
  p.candidates.assign(p.n_tokens, 0);
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (size_t i = 0; i < recs.size(); ++i) {
    const uint64_t first = recs[i].first_token;
    if (first + T > slots.size())
      return Status(Code::kInvalidArgument, "GPU_BLEND_SELECT: a chunk's tokens leave the layout");
    p.first_token.push_back(int64_t(first));
    spans.emplace_back(first, first + T);
    for (uint64_t t = 0; t < T; ++t) {
      const bool row = slots[first + t] >= 0;
      p.candidates[i * T + t] = row ? 1 : 0;
      p.n_candidates += row ? 1 : 0;
    }
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i].first < spans[i - 1].second)
      return Status(Code::kInvalidArgument, "GPU_BLEND_SELECT: two compared chunks cover the same tokens");
  p.k = recompute_count_ppm(p.n_candidates, q.ratio_ppm);
  if (p.k > out_room)
    return Status(Code::kLimit, "GPU_BLEND_SELECT: the output has room for fewer tokens than it selects");
  return p;
}

Status place_blend(BlendPlan& p, uint64_t topk_bytes, uint64_t table_bytes, uint64_t bounce_bytes) {
  p.cached_off = 0;
  p.fresh_off = aligned(p.layer_bytes);
  p.dev_off = p.fresh_off + aligned(p.layer_bytes);
  p.count_off = p.dev_off + aligned(uint64_t(p.n_tokens) * 4);
  p.selected_off = p.count_off + 8;
  p.topk_off = aligned(p.selected_off + uint64_t(p.n_tokens) * 4);
  p.topk_bytes = topk_bytes;
  p.bounce_need = p.topk_off + topk_bytes;
  if (p.bounce_need > bounce_bytes)
    return Status(Code::kLimit,
                  "GPU_BLEND_SELECT needs more device scratch than the bounce buffer (half of tier.gpu.staging_bytes)");
  p.table_bytes = table_bytes;
  p.mask_off = aligned(table_bytes);
  p.result_off = aligned(p.mask_off + p.n_tokens);
  p.tail_bytes = p.result_off + 8 + uint64_t(p.k) * 4;
  return OkStatus();
}

std::vector<std::byte> blend_tail(const BlendPlan& p, std::span<const float> table) {
  std::vector<std::byte> tail(p.tail_bytes, std::byte{0});
  std::memcpy(tail.data(), table.data(), std::min<uint64_t>(table.size_bytes(), p.table_bytes));
  std::memcpy(tail.data() + p.mask_off, p.candidates.data(), p.candidates.size());
  return tail;
}

Result<std::vector<int32_t>> blend_answer(const BlendPlan& p, const std::byte* result) {
  uint32_t count = 0;
  std::memcpy(&count, result, 4);
  if (count != p.k)  // every candidate ranks; k <= candidates, so exactly k come back
    return Status(Code::kInternal, "GPU_BLEND_SELECT: the device selected another number of tokens than asked");
  const uint32_t T = p.layer.tokens;
  std::vector<int32_t> out(count);
  int64_t prev = -1;
  for (uint32_t i = 0; i < count; ++i) {
    int32_t idx = 0;
    std::memcpy(&idx, result + 8 + uint64_t(i) * 4, 4);
    if (idx < 0 || uint32_t(idx) >= p.n_tokens || idx <= prev || p.candidates[size_t(idx)] == 0)
      return Status(Code::kInternal, "GPU_BLEND_SELECT: the device selected a token that is not a candidate");
    prev = idx;
    out[i] = int32_t(p.first_token[size_t(idx) / T] + idx % T);
  }
  // Chunks need not come in layout order: the client reads ascending layout tokens.
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace kdn::sidecar::gpu
