// CUDA launchers of gather, scatter, rope_scatter and rope_chunk. One CTA per (token, layer,
// plane) row group; threads stride over the row's elements and run the element bodies of
// kdn/kernels/copy.h. Same-dtype unit-stride rows whose addresses allow it move 16-byte words
// instead: the bytes written are the ones the element body would write.
#include <kdn/kernels/copy.h>

#include <cstdint>

#include "../src/copy_impl.h"
#include "cuda_check.h"

namespace kdn::kernels::detail {
namespace {

constexpr int kThreads = 128;

// Host-decided: may plane p's rows move as 16-byte words (given a 16-byte-aligned layer base)?
struct VectorPlan {
  bool plane[2];
};

VectorPlan plan_vectors(const ChunkGeometry& g, const EngineView& v) {
  VectorPlan plan{{false, false}};
  const int64_t es = dtype_size(v.dtype);
  for (uint32_t p = 0; p < 2; ++p) {
    const bool permuted = p == 0 && (v.flags & kPermuteK);
    const int64_t byte_strides[] = {g.head_dim * es, v.stride_block[p] * es, v.stride_offset[p] * es,
                                    v.stride_head[p] * es, v.plane_offset[p] * es};
    bool aligned = true;
    for (int64_t s : byte_strides) aligned = aligned && (s % 16) == 0;
    plan.plane[p] = g.dtype == v.dtype && v.stride_dim[p] == 1 && !permuted && aligned;
  }
  return plan;
}

// Moves one row group as 16-byte words; kToChunk selects gather's direction.
template <bool kToChunk>
__device__ void move_words(char* chunk, const ChunkGeometry& g, const EngineView& v, uint32_t layer, uint32_t plane,
                           uint32_t token, int64_t slot) {
  const uint32_t es = dtype_size(g.dtype);
  const uint32_t words_per_head = g.head_dim * es / 16;
  char* base = static_cast<char*>(engine_layer_base(v, plane, layer));
  for (uint32_t u = threadIdx.x; u < g.kv_heads * words_per_head; u += blockDim.x) {
    const uint32_t h = u / words_per_head, w = u % words_per_head;
    uint4* e = reinterpret_cast<uint4*>(base + engine_row_offset(v, plane, slot, h) * es) + w;
    uint4* c = reinterpret_cast<uint4*>(chunk + chunk_offset(g, layer, plane, token, h, 0) * es) + w;
    if (kToChunk) {
      *c = *e;
    } else {
      *e = *c;
    }
  }
}

template <bool kToChunk>
__global__ void copy_kernel(char* chunk, ChunkGeometry g, EngineView v, uint32_t l0, VectorPlan plan) {
  const uint32_t token = blockIdx.x, layer = l0 + blockIdx.y, plane = blockIdx.z;
  const int64_t slot = token_slot(v, token);
  if (!slot_in_bounds(v, slot)) return;
  const bool base_aligned =
      ((reinterpret_cast<uintptr_t>(engine_layer_base(v, plane, layer)) | reinterpret_cast<uintptr_t>(chunk)) % 16) ==
      0;
  if (plan.plane[plane] && base_aligned) return move_words<kToChunk>(chunk, g, v, layer, plane, token, slot);
  for (uint32_t i = threadIdx.x; i < g.kv_heads * g.head_dim; i += blockDim.x) {
    const uint32_t h = i / g.head_dim, d = i % g.head_dim;
    if (kToChunk) {
      gather_element(v, chunk, g, layer, plane, token, h, d);
    } else {
      scatter_element(chunk, g, v, layer, plane, token, h, d);
    }
  }
}

__global__ void rope_scatter_kernel(const char* chunk, ChunkGeometry g, EngineView v, RopeTable rt, uint32_t l0,
                                    VectorPlan plan) {
  const uint32_t token = blockIdx.x, layer = l0 + blockIdx.y, plane = blockIdx.z;
  const int64_t slot = token_slot(v, token);
  if (!slot_in_bounds(v, slot)) return;
  if (plane == 1) {
    const bool base_aligned =
        ((reinterpret_cast<uintptr_t>(engine_layer_base(v, 1, layer)) | reinterpret_cast<uintptr_t>(chunk)) % 16) == 0;
    if (plan.plane[1] && base_aligned) return move_words<false>(const_cast<char*>(chunk), g, v, layer, 1, token, slot);
    for (uint32_t i = threadIdx.x; i < g.kv_heads * g.head_dim; i += blockDim.x) {
      scatter_element(chunk, g, v, layer, 1, token, i / g.head_dim, i % g.head_dim);
    }
    return;
  }
  const uint32_t half = rt.rotary_dim / 2, tail = g.head_dim - rt.rotary_dim;
  const uint32_t per_head = half + tail;  // rotated pairs, then pass-through channels
  for (uint32_t i = threadIdx.x; i < g.kv_heads * per_head; i += blockDim.x) {
    const uint32_t h = i / per_head, j = i % per_head;
    if (j < half) {
      rope_scatter_pair(chunk, g, v, rt, layer, token, h, j);
    } else {
      scatter_element(chunk, g, v, layer, 0, token, h, rt.rotary_dim + (j - half));
    }
  }
}

__global__ void rope_chunk_kernel(char* chunk, ChunkGeometry g, RopeTable rt, uint32_t l0) {
  const uint32_t token = blockIdx.x, layer = l0 + blockIdx.y, half = rt.rotary_dim / 2;
  for (uint32_t i = threadIdx.x; i < g.kv_heads * half; i += blockDim.x) {
    rope_chunk_pair(chunk, g, rt, layer, token, i / half, i % half);
  }
}

dim3 grid_of(const ChunkGeometry& g, Layers ls, uint32_t planes) { return dim3(g.tokens, ls.l1 - ls.l0, planes); }

}  // namespace

bool cuda_is_built() { return true; }

int cuda_devices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

Status scatter_cuda(const void* chunk, const ChunkGeometry& g, const EngineView& v, Layers ls, void* stream) {
  copy_kernel<false><<<grid_of(g, ls, 2), kThreads, 0, as_stream(stream)>>>(
      static_cast<char*>(const_cast<void*>(chunk)), g, v, ls.l0, plan_vectors(g, v));
  return launch_status();
}

Status gather_cuda(const EngineView& v, void* chunk, const ChunkGeometry& g, Layers ls, void* stream) {
  copy_kernel<true><<<grid_of(g, ls, 2), kThreads, 0, as_stream(stream)>>>(static_cast<char*>(chunk), g, v, ls.l0,
                                                                           plan_vectors(g, v));
  return launch_status();
}

Status rope_scatter_cuda(const void* chunk, const ChunkGeometry& g, const EngineView& v, const RopeTable& t, Layers ls,
                         void* stream) {
  rope_scatter_kernel<<<grid_of(g, ls, 2), kThreads, 0, as_stream(stream)>>>(static_cast<const char*>(chunk), g, v, t,
                                                                             ls.l0, plan_vectors(g, v));
  return launch_status();
}

Status rope_chunk_cuda(void* chunk, const ChunkGeometry& g, const RopeTable& t, Layers ls, void* stream) {
  rope_chunk_kernel<<<grid_of(g, ls, 1), kThreads, 0, as_stream(stream)>>>(static_cast<char*>(chunk), g, t, ls.l0);
  return launch_status();
}

}  // namespace kdn::kernels::detail
