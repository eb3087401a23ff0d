// Blend kernels (CacheBlend): KV deviation at a check layer, top-k selection of the tokens to
// recompute, and merging recomputed rows into the blended context.
//
// Deviation of token j between freshly computed rows F and cached rows C (K or V of one layer,
// all heads, C = kv_heads * head_dim channels):
//     dev[j] = sum_c (f32(F[j][c]) - f32(C[j][c]))^2
// summed in fp32 in a FIXED order so CPU and CUDA agree bit for bit: 32 partial sums,
// s[l] = sum over c = l, l+32, l+64, ... in increasing c; then s[l] += s[l + w] for
// w = 16, 8, 4, 2, 1 (the warp shuffle-down order); dev = s[0].
//
// Selection order (the tie rule): larger deviation first, then the smaller token index; NaN ranks
// above every number (a broken row is recomputed first). Only candidate tokens are ranked, so
// gradual filtering (r1 > r2 > ... across check layers) is a sequence of calls, each with the
// previous selection as the candidate mask (selection_to_mask). Tokens that no cached chunk
// covers (query, gaps) are the engine's to recompute anyway and should not be candidates.
//
// Memory: everything is caller-owned. For CUDA ops every pointer (including n_selected) is device
// memory and scratch comes from top_k_scratch_bytes.
#pragma once

#include <kdn/common/status.h>
#include <kdn/kernels/dtype.h>
#include <kdn/kernels/executor.h>
#include <kdn/kernels/hd.h>

#include <cstddef>
#include <cstdint>

namespace kdn::kernels {

// n_tokens rows of `width` contiguous channels, row r at data + r * row_stride (elements).
struct TokenRows {
  const void* data = nullptr;
  DType dtype = DType::kF16;
  uint32_t width = 0;
  int64_t row_stride = 0;
};

struct MutableTokenRows {
  void* data = nullptr;
  DType dtype = DType::kF16;
  uint32_t width = 0;
  int64_t row_stride = 0;
};

// dev[j] for candidates; non-candidates get -1. candidates may be null (every token).
Status kv_deviation(const TokenRows& fresh, const TokenRows& cached, uint32_t n_tokens, const uint8_t* candidates,
                    float* deviation, const Executor& ex) noexcept;

// Scratch bytes select_top_k needs for n_tokens on this executor kind.
Result<size_t> top_k_scratch_bytes(uint32_t n_tokens, const Executor& ex) noexcept;

// The min(k, #candidates) best candidates by the tie rule, written to selected[] in ascending
// token order; their count to *n_selected. selected needs room for min(k, n_tokens) entries.
Status select_top_k(const float* deviation, const uint8_t* candidates, uint32_t n_tokens, uint32_t k, int32_t* selected,
                    uint32_t* n_selected, void* scratch, size_t scratch_bytes, const Executor& ex) noexcept;

// mask[j] = 1 for selected tokens, 0 otherwise (host memory). Indices must be < n_tokens.
Status selection_to_mask(const int32_t* selected, uint32_t n_selected, uint32_t n_tokens, uint8_t* mask) noexcept;

// Recompute count for a ratio: ceil-free floor(n_candidates * ratio) as LMCache/CacheBlend do,
// at least 1 when there is a candidate and ratio > 0.
uint32_t recompute_count(uint32_t n_candidates, double ratio) noexcept;

// dst row selected[i] = fresh row i (converted to dst dtype), i < n_selected. Every index is
// checked against n_dst_tokens first (kInvalidArgument, nothing written; CPU only — on CUDA an
// out-of-range index is skipped).
Status merge_rows(const TokenRows& fresh, const int32_t* selected, uint32_t n_selected, const MutableTokenRows& dst,
                  uint32_t n_dst_tokens, const Executor& ex) noexcept;

// ---- per-element bodies ---------------------------------------------------------------------

// Monotone map of a float onto uint32 (larger float -> larger key; every NaN -> the maximum).
KDN_HD_INLINE uint32_t deviation_order_key(float f) {
  const uint32_t x = bits_as<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return 0xffffffffu;
  return (x & 0x80000000u) ? ~x : (x | 0x80000000u);
}

// One lane's partial sum: channels lane, lane + 32, ... of row j.
KDN_HD_INLINE float deviation_lane_sum(const TokenRows& f, const TokenRows& c, uint32_t j, uint32_t lane) {
  const int64_t fr = static_cast<int64_t>(j) * f.row_stride;
  const int64_t cr = static_cast<int64_t>(j) * c.row_stride;
  float s = 0.0f;
  for (uint32_t ch = lane; ch < f.width; ch += 32) {
    const float d = fsub_rn(load_f32(f.data, fr + ch, f.dtype, 1.0f), load_f32(c.data, cr + ch, c.dtype, 1.0f));
    s = fadd_rn(s, fmul_rn(d, d));
  }
  return s;
}

// Reduces 32 lane sums in the fixed shuffle-down order; lanes[] is clobbered.
KDN_HD_INLINE float deviation_reduce(float* lanes) {
  for (uint32_t w = 16; w >= 1; w /= 2) {
    for (uint32_t l = 0; l < w; ++l) lanes[l] = fadd_rn(lanes[l], lanes[l + w]);
  }
  return lanes[0];
}

}  // namespace kdn::kernels
