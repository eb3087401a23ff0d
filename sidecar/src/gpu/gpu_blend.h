// GPU_BLEND_SELECT (docs/blend.md, docs/gpu.md): what kdnd compares and where the work lives.
//
// Plain C++ (no CUDA), so the whole plan is unit-tested on the CPU: which tokens are candidates,
// how many are selected, how the device's bounce area and the request's pinned metadata tail are
// laid out, and the checks of the device's answer before it reaches a client.
//
// Chunk i of a plan is the i-th compared chunk; its row t is compared token i * T + t (T: chunk
// tokens), which is slot first_token[i] + t of the request's layout.
//
// Not thread-safe; values only.
#pragma once

#include <kdn/common/status.h>
#include <kdn/ipc/protocol.h>
#include <kdn/kernels/layout.h>

#include <cstdint>
#include <span>
#include <vector>

namespace kdn::sidecar::gpu {

struct BlendQuery {
  uint32_t check_layer = 0;
  uint32_t plane = ipc::kGpuBlendPlaneK;
  uint32_t ratio_ppm = 0;
};

// floor(candidates * ratio), at least 1 when there is a candidate and the ratio is not 0: the
// kernels' recompute_count in integers, so kdnd and a client agree on every ratio.
uint32_t recompute_count_ppm(uint32_t candidates, uint32_t ratio_ppm) noexcept;

struct BlendPlan {
  kernels::ChunkGeometry layer;     // one layer (K then V) of one chunk: what is compared
  uint64_t layer_offset_bytes = 0;  // where the check layer starts in a canonical chunk
  uint64_t layer_bytes = 0;         // its K and V planes
  uint32_t check_layer = 0;
  uint32_t plane = ipc::kGpuBlendPlaneK;
  std::vector<int64_t> first_token;  // per compared chunk: its token 0 in the layout's slots
  std::vector<uint8_t> candidates;   // per compared token: its slot is not -1
  uint32_t n_tokens = 0;             // compared chunks * T
  uint32_t n_candidates = 0;
  uint32_t k = 0;  // tokens to select

  // The bounce area (device), from its start: the cached rows, the fresh rows, the deviations
  // (n_tokens floats), the count (8 bytes) and the selection (n_tokens int32), the top-k scratch.
  uint64_t cached_off = 0, fresh_off = 0, dev_off = 0, count_off = 0, selected_off = 0, topk_off = 0;
  uint64_t topk_bytes = 0, bounce_need = 0;
  // The metadata tail (pinned host, mirrored on the device), from its start: the RoPE table
  // (`table_bytes`), the candidates mask, then room for the count and k indices copied back.
  uint64_t table_bytes = 0, mask_off = 0, result_off = 0, tail_bytes = 0;
};

// The plan for the compared chunks `recs` (the ones a segment retrieve would copy) of a request
// whose layout has `slots` (the slot of every layout token; -1: no row). kInvalidArgument for a
// layer past the model, an unknown plane or ratio, chunks whose tokens overlap or leave the
// layout; kLimit when the output has room for fewer than k indices or the tokens overflow 2^31.
// The scratch offsets are filled by place_blend.
Result<BlendPlan> plan_blend(const kernels::ChunkGeometry& chunk, std::span<const int64_t> slots,
                             std::span<const ipc::GpuSegmentChunkRecord> recs, const BlendQuery& q, uint64_t out_room);

// Lays out the bounce area (top-k scratch of `topk_bytes`) and the metadata tail (after a RoPE
// table of `table_bytes`). kLimit, naming tier.gpu.staging_bytes, when the bounce area is short.
Status place_blend(BlendPlan& p, uint64_t topk_bytes, uint64_t table_bytes, uint64_t bounce_bytes);

// The metadata tail's bytes to stage: the table, the mask, zeroed room for the answer.
std::vector<std::byte> blend_tail(const BlendPlan& p, std::span<const float> table);

// The device's answer (the count and indices at the tail's result_off) checked and turned into
// layout tokens: at most k, each a candidate, strictly ascending. kInternal otherwise (a broken
// device result never reaches a client).
Result<std::vector<int32_t>> blend_answer(const BlendPlan& p, const std::byte* result);

}  // namespace kdn::sidecar::gpu
