// Blend entry points (validation + CPU launchers): deviation, top-k selection, merge.
#include <kdn/common/model.h>
#include <kdn/kernels/blend.h>
#include <kdn/kernels/cpu_rows.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "copy_impl.h"
#include "cpu_launch.h"

namespace kdn::kernels {
namespace {

constexpr uint32_t kLanes = 32;

Status invalid(const char* what) { return Status(Code::kInvalidArgument, what); }

Status validate_rows(const void* data, DType dtype, uint32_t width, int64_t row_stride) {
  if (data == nullptr) return invalid("token rows: null data");
  if (!dtype_valid(static_cast<uint32_t>(dtype))) return invalid("token rows: unknown dtype");
  if (width == 0 || width > kMaxHeads * kMaxHeadDim) return invalid("token rows: width out of range");
  if (row_stride < width) return invalid("token rows: row_stride < width");
  return OkStatus();
}

Status validate_executor(const Executor& ex) {
  if (ex.kind == Executor::Kind::kCpu) return OkStatus();
  if (ex.kind != Executor::Kind::kCuda) return invalid("unknown executor kind");
  return detail::cuda_is_built() ? OkStatus() : Status(Code::kUnsupported, "built without CUDA");
}

// Same value as deviation_lane_sum over every lane + deviation_reduce: each lane accumulates its
// channels in increasing order; the row is converted to f32 a block at a time (no allocation).
float row_deviation(const TokenRows& f, const TokenRows& c, uint32_t j) {
  constexpr uint32_t kBlock = 1024;  // a multiple of kLanes
  const char* fr = static_cast<const char*>(f.data) + int64_t{j} * f.row_stride * dtype_size(f.dtype);
  const char* cr = static_cast<const char*>(c.data) + int64_t{j} * c.row_stride * dtype_size(c.dtype);
  float fbuf[kBlock], cbuf[kBlock];
  float lanes[kLanes] = {};
  for (uint32_t b0 = 0; b0 < f.width; b0 += kBlock) {
    const uint32_t n = std::min(kBlock, f.width - b0);
    load_row_f32(fr + size_t{b0} * dtype_size(f.dtype), f.dtype, 1.0f, n, fbuf);
    load_row_f32(cr + size_t{b0} * dtype_size(c.dtype), c.dtype, 1.0f, n, cbuf);
    uint32_t ch = 0;
    for (; ch + kLanes <= n; ch += kLanes) {
      for (uint32_t l = 0; l < kLanes; ++l) {
        const float d = fbuf[ch + l] - cbuf[ch + l];
        lanes[l] += d * d;
      }
    }
    for (uint32_t l = 0; ch + l < n; ++l) {
      const float d = fbuf[ch + l] - cbuf[ch + l];
      lanes[l] += d * d;
    }
  }
  return deviation_reduce(lanes);
}

// Total order of the tie rule as one integer: larger deviation, then smaller index, is larger.
uint64_t rank_key(float dev, uint32_t j) { return (uint64_t{deviation_order_key(dev)} << 32) | (0xffffffffu - j); }

}  // namespace

Status kv_deviation(const TokenRows& fresh, const TokenRows& cached, uint32_t n_tokens, const uint8_t* candidates,
                    float* deviation, const Executor& ex) noexcept {
  KDN_RETURN_IF_ERROR(validate_executor(ex));
  KDN_RETURN_IF_ERROR(validate_rows(fresh.data, fresh.dtype, fresh.width, fresh.row_stride));
  KDN_RETURN_IF_ERROR(validate_rows(cached.data, cached.dtype, cached.width, cached.row_stride));
  if (fresh.width != cached.width) return invalid("kv_deviation: widths differ");
  if (deviation == nullptr || n_tokens == 0) return invalid("kv_deviation: no output");
  if (ex.kind == Executor::Kind::kCuda) {
    return detail::kv_deviation_cuda(fresh, cached, n_tokens, candidates, deviation, ex.cuda_stream);
  }
  detail::cpu_for(ex, n_tokens, 16, [&](uint64_t begin, uint64_t end) {
    for (uint64_t j = begin; j < end; ++j) {
      const bool candidate = candidates == nullptr || candidates[j] != 0;
      deviation[j] = candidate ? row_deviation(fresh, cached, static_cast<uint32_t>(j)) : -1.0f;
    }
  });
  return OkStatus();
}

Result<size_t> top_k_scratch_bytes(uint32_t n_tokens, const Executor& ex) noexcept {
  KDN_RETURN_IF_ERROR(validate_executor(ex));
  if (ex.kind == Executor::Kind::kCuda) return detail::top_k_scratch_cuda(n_tokens);
  return size_t{n_tokens} * sizeof(uint64_t);
}

Status select_top_k(const float* deviation, const uint8_t* candidates, uint32_t n_tokens, uint32_t k, int32_t* selected,
                    uint32_t* n_selected, void* scratch, size_t scratch_bytes, const Executor& ex) noexcept {
  KDN_RETURN_IF_ERROR(validate_executor(ex));
  if (deviation == nullptr || (selected == nullptr && k > 0) || n_selected == nullptr || scratch == nullptr) {
    return invalid("select_top_k: null pointer");
  }
  if (n_tokens == 0 || n_tokens > (1u << 31) - 1) return invalid("select_top_k: n_tokens out of range");
  Result<size_t> need = top_k_scratch_bytes(n_tokens, ex);
  if (!need.ok()) return need.status();
  if (scratch_bytes < *need) return invalid("select_top_k: scratch too small");
  if (ex.kind == Executor::Kind::kCuda) {
    return detail::select_top_k_cuda(deviation, candidates, n_tokens, k, selected, n_selected, scratch, scratch_bytes,
                                     ex.cuda_stream);
  }
  uint64_t* keys = static_cast<uint64_t*>(scratch);
  uint32_t m = 0;
  for (uint32_t j = 0; j < n_tokens; ++j) {
    if (candidates == nullptr || candidates[j] != 0) keys[m++] = rank_key(deviation[j], j);
  }
  const uint32_t take = std::min(k, m);
  std::nth_element(keys, keys + take, keys + m, std::greater<uint64_t>());
  for (uint32_t i = 0; i < take; ++i) selected[i] = static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(keys[i]));
  std::sort(selected, selected + take);
  *n_selected = take;
  return OkStatus();
}

Status selection_to_mask(const int32_t* selected, uint32_t n_selected, uint32_t n_tokens, uint8_t* mask) noexcept {
  if (mask == nullptr || (selected == nullptr && n_selected > 0)) return invalid("selection_to_mask: null pointer");
  for (uint32_t i = 0; i < n_selected; ++i) {
    if (selected[i] < 0 || static_cast<uint32_t>(selected[i]) >= n_tokens)
      return invalid("selection_to_mask: index out of range");
  }
  memset(mask, 0, n_tokens);
  for (uint32_t i = 0; i < n_selected; ++i) mask[selected[i]] = 1;
  return OkStatus();
}

uint32_t recompute_count(uint32_t n_candidates, double ratio) noexcept {
  if (!(ratio > 0.0) || n_candidates == 0) return 0;
  if (ratio >= 1.0) return n_candidates;
  const auto n = static_cast<uint32_t>(std::floor(n_candidates * ratio));
  return std::clamp<uint32_t>(n, 1, n_candidates);
}

Status merge_rows(const TokenRows& fresh, const int32_t* selected, uint32_t n_selected, const MutableTokenRows& dst,
                  uint32_t n_dst_tokens, const Executor& ex) noexcept {
  KDN_RETURN_IF_ERROR(validate_executor(ex));
  KDN_RETURN_IF_ERROR(validate_rows(fresh.data, fresh.dtype, fresh.width, fresh.row_stride));
  KDN_RETURN_IF_ERROR(validate_rows(dst.data, dst.dtype, dst.width, dst.row_stride));
  if (fresh.width != dst.width) return invalid("merge_rows: widths differ");
  if (n_selected == 0) return OkStatus();
  if (selected == nullptr) return invalid("merge_rows: null selection");
  if (ex.kind == Executor::Kind::kCuda) {
    return detail::merge_rows_cuda(fresh, selected, n_selected, dst, n_dst_tokens, ex.cuda_stream);
  }
  for (uint32_t i = 0; i < n_selected; ++i) {
    const bool ascending = i == 0 || selected[i] > selected[i - 1];
    if (!ascending || selected[i] < 0 || static_cast<uint32_t>(selected[i]) >= n_dst_tokens) {
      return invalid("merge_rows: selection must be strictly ascending and < n_dst_tokens");
    }
  }
  const uint32_t fes = dtype_size(fresh.dtype), des = dtype_size(dst.dtype);
  detail::cpu_for(ex, n_selected, 16, [&](uint64_t begin, uint64_t end) {
    for (uint64_t i = begin; i < end; ++i) {
      const char* src = static_cast<const char*>(fresh.data) + static_cast<int64_t>(i) * fresh.row_stride * fes;
      char* out = static_cast<char*>(dst.data) + int64_t{selected[i]} * dst.row_stride * des;
      if (fresh.dtype == dst.dtype) {
        memcpy(out, src, size_t{fresh.width} * fes);
      } else {
        for (uint32_t c = 0; c < fresh.width; ++c) {
          store_f32(out, c, dst.dtype, load_f32(src, c, fresh.dtype, 1.0f), 1.0f);
        }
      }
    }
  });
  return OkStatus();
}

}  // namespace kdn::kernels
