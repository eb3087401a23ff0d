// Segments as chunks: a segment of n tokens is stored as ceil(n / T) canonical chunks, chunk i
// holding tokens [iT, min((i+1)T, n)); the last chunk may be partial, and then its rows past the
// segment's end are zero (a chunk is always the model's full chunk size, so every tier stores
// it like any other chunk). These ops move a segment between such chunks and an engine buffer:
// segment token t is engine token view.first_token + t of the view's slot mapping, and on the
// way in K is rotated by delta = (target position - base position), fused into the scatter.
//
// CPU executors only: the partial chunk's slots are staged in a small host table.
// Ownership: chunks and views are the caller's; nothing is retained. Thread safety: as ops.h.
#pragma once

#include <kdn/common/status.h>
#include <kdn/kernels/executor.h>
#include <kdn/kernels/layout.h>
#include <kdn/kernels/ops.h>
#include <kdn/kernels/rope.h>

#include <cstdint>
#include <span>

namespace kdn::kernels {

// The rotation a segment load applies: inv_freq of the model (rotary_dim / 2 entries).
struct SegmentRope {
  RopeStyle style = RopeStyle::kNeox;
  uint32_t rotary_dim = 0;
  const float* inv_freq = nullptr;
};

// Builds a SegmentRope from a model descriptor into `inv_freq` (room for head_dim / 2 floats).
Status segment_rope_from_desc(const kdn_model_desc& desc, float* inv_freq, size_t n, SegmentRope* out) noexcept;

// Chunks [0, chunks.size()) of a segment -> engine, tokens [0, n_tokens) where n_tokens is at
// most chunks.size() * T and more than (chunks.size() - 1) * T (the tokens those chunks hold;
// a leading part of a longer segment is allowed: pass its whole chunks). K is rotated by
// `delta` (|delta| <= 2^40); delta 0 is a plain scatter. Every slot is checked first (see ops.h).
Status scatter_segment(std::span<const void* const> chunks, uint64_t n_tokens, const ChunkGeometry& geo,
                       const EngineView& dst, const SegmentRope& rope, int64_t delta, const Executor& ex,
                       LayerRange layers = {}) noexcept;

// Engine -> chunks of a segment of n_tokens tokens (chunks.size() == ceil(n_tokens / T)); a
// partial last chunk's rows past n_tokens are zeroed. Chunks that are null are skipped (already
// stored elsewhere).
Status gather_segment(const EngineView& src, std::span<void* const> chunks, uint64_t n_tokens, const ChunkGeometry& geo,
                      const Executor& ex) noexcept;

}  // namespace kdn::kernels
