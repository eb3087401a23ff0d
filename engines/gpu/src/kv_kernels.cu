#include <kdn/gpu_engine/kv_kernels.h>

#include "cuda_check.h"

#include <cuda_runtime.h>

#include <algorithm>

namespace kdn::gpu_engine {
namespace {

constexpr int kThreads = 256;
constexpr uint64_t kMaxGrid = 1u << 20;

// One row = (layer, plane, slot): token_elems() consecutive elements.
__device__ __forceinline__ void row_coords(const PagedKvShape& s, uint64_t row, uint32_t* layer, uint32_t* plane,
                                           uint64_t* slot) {
  const uint64_t slots = s.slots();
  *slot = row % slots;
  const uint64_t lp = row / slots;
  *plane = uint32_t(lp & 1);
  *layer = uint32_t(lp >> 1);
}

__global__ void fill_kernel(PagedKvView v) {
  uint16_t* kv = reinterpret_cast<uint16_t*>(v.alloc + kGuardBytes);
  const uint64_t rows = uint64_t(v.shape.layers) * 2 * v.shape.slots();
  const uint32_t row_elems = uint32_t(v.shape.token_elems());
  for (uint64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    uint32_t layer, plane;
    uint64_t slot;
    row_coords(v.shape, row, &layer, &plane, &slot);
    const int64_t owner = v.owners[slot];
    uint16_t* dst = kv + row * row_elems;
    for (uint32_t e = threadIdx.x; e < row_elems; e += blockDim.x) {
      dst[e] = expected_element(v.seed, owner, layer, plane, slot, e / v.shape.head_dim, e % v.shape.head_dim);
    }
  }
}

__global__ void guard_fill_kernel(uint8_t* alloc, uint64_t tail_begin, uint64_t alloc_bytes) {
  const uint64_t n = kGuardBytes + (alloc_bytes - tail_begin);
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x) {
    const uint64_t off = i < kGuardBytes ? i : tail_begin + (i - kGuardBytes);
    alloc[off] = guard_byte(off);
  }
}

__global__ void verify_kernel(PagedKvView v, unsigned long long* mismatches) {
  const uint16_t* kv = reinterpret_cast<const uint16_t*>(v.alloc + kGuardBytes);
  const uint64_t rows = uint64_t(v.shape.layers) * 2 * v.shape.slots();
  const uint32_t row_elems = uint32_t(v.shape.token_elems());
  unsigned long long bad = 0;
  for (uint64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    uint32_t layer, plane;
    uint64_t slot;
    row_coords(v.shape, row, &layer, &plane, &slot);
    const int64_t owner = v.owners[slot];
    const uint16_t* src = kv + row * row_elems;
    for (uint32_t e = threadIdx.x; e < row_elems; e += blockDim.x) {
      bad += src[e] != expected_element(v.seed, owner, layer, plane, slot, e / v.shape.head_dim, e % v.shape.head_dim);
    }
  }
  if (bad) atomicAdd(mismatches, bad);
}

__global__ void guard_verify_kernel(const uint8_t* alloc, uint64_t tail_begin, uint64_t alloc_bytes,
                                    unsigned long long* mismatches) {
  const uint64_t n = kGuardBytes + (alloc_bytes - tail_begin);
  unsigned long long bad = 0;
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x) {
    const uint64_t off = i < kGuardBytes ? i : tail_begin + (i - kGuardBytes);
    bad += alloc[off] != guard_byte(off);
  }
  if (bad) atomicAdd(mismatches, bad);
}

__global__ void read_all_kernel(const uint4* p, uint64_t n, unsigned long long* sink) {
  uint32_t acc = 0;
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x) {
    const uint4 q = __ldcs(p + i);  // streamed once: keep it out of L2's way
    acc ^= q.x + q.y + q.z + q.w;
  }
  if (acc == 0x9E3779B9u && threadIdx.x == 0x3FF) *sink = acc;  // never true for blockDim 256; keeps the loads
}

unsigned grid_for(uint64_t items, uint64_t per_block) {
  return unsigned(std::max<uint64_t>(1, std::min<uint64_t>((items + per_block - 1) / per_block, kMaxGrid)));
}

EngineStatus check_view(const PagedKvView& v) {
  if (!v.alloc || !v.owners || v.shape.kv_bytes() == 0 || v.alloc_bytes < 2 * kGuardBytes + v.shape.kv_bytes()) {
    return {KDN_ERR_INVALID_ARGUMENT, "paged KV view: empty or larger than its allocation"};
  }
  return {};
}

}  // namespace

EngineStatus launch_fill(const PagedKvView& v, void* stream) {
  if (auto st = check_view(v); !st.ok()) return st;
  auto s = static_cast<cudaStream_t>(stream);
  const uint64_t rows = uint64_t(v.shape.layers) * 2 * v.shape.slots();
  fill_kernel<<<grid_for(rows, 1), kThreads, 0, s>>>(v);
  KDN_CUDA_TRY(cudaGetLastError());
  const uint64_t tail = kGuardBytes + v.shape.kv_bytes();
  guard_fill_kernel<<<grid_for(kGuardBytes + v.alloc_bytes - tail, kThreads), kThreads, 0, s>>>(v.alloc, tail,
                                                                                                v.alloc_bytes);
  KDN_CUDA_TRY(cudaGetLastError());
  return {};
}

EngineStatus launch_verify(const PagedKvView& v, unsigned long long* mismatches, void* stream) {
  if (auto st = check_view(v); !st.ok()) return st;
  if (!mismatches) return {KDN_ERR_INVALID_ARGUMENT, "verify: no counter"};
  auto s = static_cast<cudaStream_t>(stream);
  const uint64_t rows = uint64_t(v.shape.layers) * 2 * v.shape.slots();
  verify_kernel<<<grid_for(rows, 1), kThreads, 0, s>>>(v, mismatches);
  KDN_CUDA_TRY(cudaGetLastError());
  const uint64_t tail = kGuardBytes + v.shape.kv_bytes();
  guard_verify_kernel<<<grid_for(kGuardBytes + v.alloc_bytes - tail, kThreads), kThreads, 0, s>>>(
      v.alloc, tail, v.alloc_bytes, mismatches);
  KDN_CUDA_TRY(cudaGetLastError());
  return {};
}

EngineStatus launch_read_all(const void* p, uint64_t bytes, unsigned long long* sink, void* stream) {
  if (!p || !sink || bytes % 16)
    return {KDN_ERR_INVALID_ARGUMENT, "read_all: null pointer or bytes not a multiple of 16"};
  const uint64_t n = bytes / 16;
  int device = 0, sms = 0;
  KDN_CUDA_TRY(cudaGetDevice(&device));
  KDN_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const unsigned grid = unsigned(std::min<uint64_t>(std::max(1, sms) * 8, std::max<uint64_t>(1, n / kThreads)));
  read_all_kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<const uint4*>(p), n, sink);
  KDN_CUDA_TRY(cudaGetLastError());
  return {};
}

}  // namespace kdn::gpu_engine
