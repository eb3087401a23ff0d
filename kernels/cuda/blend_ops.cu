// CUDA launchers of the blend ops. Deviation: one warp per token, lanes summing channels
// lane, lane + 32, ... and a shuffle-down reduction, the order blend.h fixes. Top-k: one radix
// sort of (deviation, index) keys (CUB), then the first k indices are flagged and compacted in
// ascending order.
#include <kdn/kernels/blend.h>
#include <kdn/kernels/copy.h>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_select.cuh>

#include <algorithm>

#include "../src/copy_impl.h"
#include "cuda_check.h"

namespace kdn::kernels::detail {
namespace {

constexpr int kWarpsPerBlock = 8;

__global__ void deviation_kernel(TokenRows f, TokenRows c, uint32_t n, const uint8_t* cand, float* dev) {
  const uint32_t lane = threadIdx.x % 32;
  const uint32_t j = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  if (j >= n) return;
  if (cand != nullptr && cand[j] == 0) {
    if (lane == 0) dev[j] = -1.0f;
    return;
  }
  float s = deviation_lane_sum(f, c, j, lane);
  for (int w = 16; w >= 1; w /= 2) s = fadd_rn(s, __shfl_down_sync(0xffffffffu, s, w));
  if (lane == 0) dev[j] = s;
}

__global__ void make_keys_kernel(const float* dev, const uint8_t* cand, uint32_t n, uint64_t* keys, int32_t* iota,
                                 uint8_t* flags) {
  const uint32_t j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= n) return;
  const bool candidate = cand == nullptr || cand[j] != 0;
  // Tie rule as one integer: larger deviation, then smaller index, is the larger key. A
  // candidate's key is never 0 (its upper half is deviation_order_key >= 2^23), so 0 marks
  // non-candidates.
  keys[j] = candidate ? (uint64_t{deviation_order_key(dev[j])} << 32) | (0xffffffffu - j) : 0;
  iota[j] = static_cast<int32_t>(j);
  flags[j] = 0;
}

__global__ void flag_top_kernel(const uint64_t* sorted, uint32_t take, uint8_t* flags) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= take || sorted[i] == 0) return;
  flags[0xffffffffu - static_cast<uint32_t>(sorted[i])] = 1;
}

__global__ void merge_kernel(TokenRows f, const int32_t* sel, MutableTokenRows d, uint32_t n_dst) {
  const uint32_t i = blockIdx.x;
  const int32_t row = sel[i];
  if (row < 0 || static_cast<uint32_t>(row) >= n_dst) return;  // never write out of bounds
  for (uint32_t ch = threadIdx.x; ch < f.width; ch += blockDim.x) {
    copy_value(f.data, int64_t{i} * f.row_stride + ch, f.dtype, 1.0f, d.data, int64_t{row} * d.row_stride + ch, d.dtype,
               1.0f);
  }
}

size_t align256(size_t x) { return (x + 255) & ~size_t{255}; }

// Scratch layout: keys_in | keys_out | iota | flags | CUB temporary storage.
struct TopKScratch {
  size_t keys_in, keys_out, iota, flags, temp, temp_bytes, total;
};

Result<TopKScratch> top_k_layout(uint32_t n) {
  size_t sort_bytes = 0, select_bytes = 0;
  KDN_RETURN_IF_ERROR(cuda_status(cub::DeviceRadixSort::SortKeysDescending(
      nullptr, sort_bytes, static_cast<const uint64_t*>(nullptr), static_cast<uint64_t*>(nullptr), n)));
  KDN_RETURN_IF_ERROR(cuda_status(cub::DeviceSelect::Flagged(
      nullptr, select_bytes, static_cast<const int32_t*>(nullptr), static_cast<const uint8_t*>(nullptr),
      static_cast<int32_t*>(nullptr), static_cast<uint32_t*>(nullptr), n)));
  TopKScratch s{};
  s.keys_in = 0;
  s.keys_out = align256(size_t{n} * 8);
  s.iota = s.keys_out + align256(size_t{n} * 8);
  s.flags = s.iota + align256(size_t{n} * 4);
  s.temp = s.flags + align256(n);
  s.temp_bytes = std::max(sort_bytes, select_bytes);
  s.total = s.temp + s.temp_bytes;
  return s;
}

unsigned blocks_for(uint64_t n, unsigned threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

}  // namespace

Status kv_deviation_cuda(const TokenRows& fresh, const TokenRows& cached, uint32_t n_tokens, const uint8_t* candidates,
                         float* deviation, void* stream) {
  deviation_kernel<<<blocks_for(n_tokens, kWarpsPerBlock), kWarpsPerBlock * 32, 0, as_stream(stream)>>>(
      fresh, cached, n_tokens, candidates, deviation);
  return launch_status();
}

Result<size_t> top_k_scratch_cuda(uint32_t n_tokens) {
  Result<TopKScratch> s = top_k_layout(n_tokens);
  if (!s.ok()) return s.status();
  return s->total;
}

Status select_top_k_cuda(const float* deviation, const uint8_t* candidates, uint32_t n_tokens, uint32_t k,
                         int32_t* selected, uint32_t* n_selected, void* scratch, size_t scratch_bytes, void* stream) {
  Result<TopKScratch> lay = top_k_layout(n_tokens);
  if (!lay.ok()) return lay.status();
  if (scratch_bytes < lay->total) return Status(Code::kInvalidArgument, "select_top_k: scratch too small");
  char* base = static_cast<char*>(scratch);
  auto* keys_in = reinterpret_cast<uint64_t*>(base + lay->keys_in);
  auto* keys_out = reinterpret_cast<uint64_t*>(base + lay->keys_out);
  auto* iota = reinterpret_cast<int32_t*>(base + lay->iota);
  auto* flags = reinterpret_cast<uint8_t*>(base + lay->flags);
  size_t temp_bytes = lay->temp_bytes;
  cudaStream_t s = as_stream(stream);
  make_keys_kernel<<<blocks_for(n_tokens, 256), 256, 0, s>>>(deviation, candidates, n_tokens, keys_in, iota, flags);
  KDN_RETURN_IF_ERROR(launch_status());
  KDN_RETURN_IF_ERROR(cuda_status(
      cub::DeviceRadixSort::SortKeysDescending(base + lay->temp, temp_bytes, keys_in, keys_out, n_tokens, 0, 64, s)));
  const uint32_t take = std::min(k, n_tokens);
  if (take == 0) return cuda_status(cudaMemsetAsync(n_selected, 0, sizeof(uint32_t), s));
  flag_top_kernel<<<blocks_for(take, 256), 256, 0, s>>>(keys_out, take, flags);
  KDN_RETURN_IF_ERROR(launch_status());
  temp_bytes = lay->temp_bytes;
  return cuda_status(
      cub::DeviceSelect::Flagged(base + lay->temp, temp_bytes, iota, flags, selected, n_selected, n_tokens, s));
}

Status merge_rows_cuda(const TokenRows& fresh, const int32_t* selected, uint32_t n_selected,
                       const MutableTokenRows& dst, uint32_t n_dst_tokens, void* stream) {
  merge_kernel<<<n_selected, 128, 0, as_stream(stream)>>>(fresh, selected, dst, n_dst_tokens);
  return launch_status();
}

}  // namespace kdn::kernels::detail
