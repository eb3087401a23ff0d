// What the blend needs of llama.cpp's KV cache beyond its public API: the cache tensors' memory
// and which cell holds which position of a sequence (private to kdn_llama_core; kv_cells.cc
// is the second user of llama.cpp's internal headers, beside kv_restore.cc).
#pragma once

#include <kdn/common/status.h>

#include <cstdint>
#include <vector>

struct llama_context;

namespace kdn::llama {

// The cache tensors of a plain, unified, host-resident KV cache.
struct KvTensors {
  std::vector<uint8_t*> k;  // per layer: [cells][row] (row = kv_heads * head_dim elements)
  std::vector<uint8_t*> v;  // per layer: rows like K, or [row][cells] when V is transposed
  uint32_t cells = 0;       // cells of the cache (llama.cpp's kv_size)
};

// kUnsupported unless the context's memory is one plain KV cache in host memory with one
// stream and layers 0 .. n_layer - 1.
Status kv_tensors(llama_context* ctx, uint32_t n_layer, KvTensors* out) noexcept;

// out[p] = the cell holding position p of `seq`, for p in [0, n). kCorrupt if a position has no
// cell or more than one.
Status seq_cells(llama_context* ctx, int32_t seq, uint32_t n, std::vector<int64_t>* out) noexcept;

}  // namespace kdn::llama
