// Launchers behind the validating entry points of kdn/kernels/ops.h and kdn/kernels/blend.h.
// Arguments reaching these functions have been validated; layers are resolved to [l0, l1).
#pragma once

#include <kdn/common/status.h>
#include <kdn/kernels/blend.h>
#include <kdn/kernels/executor.h>
#include <kdn/kernels/layout.h>
#include <kdn/kernels/rope.h>

#include <cstddef>
#include <cstdint>

namespace kdn::kernels::detail {

struct Layers {
  uint32_t l0, l1;
};

// ---- CPU (copy_cpu.cc, blend.cc) ----
void scatter_cpu(const void* chunk, const ChunkGeometry& g, const EngineView& v, Layers ls, const Executor& ex);
void gather_cpu(const EngineView& v, void* chunk, const ChunkGeometry& g, Layers ls, const Executor& ex);
void rope_scatter_cpu(const void* chunk, const ChunkGeometry& g, const EngineView& v, const RopeTable& t, Layers ls,
                      const Executor& ex);
void rope_chunk_cpu(void* chunk, const ChunkGeometry& g, const RopeTable& t, Layers ls, const Executor& ex);

// ---- CUDA (cuda/*.cu, or no_cuda.cc returning kUnsupported) ----
bool cuda_is_built();
int cuda_devices();
Status scatter_cuda(const void* chunk, const ChunkGeometry& g, const EngineView& v, Layers ls, void* stream);
Status gather_cuda(const EngineView& v, void* chunk, const ChunkGeometry& g, Layers ls, void* stream);
Status rope_scatter_cuda(const void* chunk, const ChunkGeometry& g, const EngineView& v, const RopeTable& t, Layers ls,
                         void* stream);
Status rope_chunk_cuda(void* chunk, const ChunkGeometry& g, const RopeTable& t, Layers ls, void* stream);

Status kv_deviation_cuda(const TokenRows& fresh, const TokenRows& cached, uint32_t n_tokens, const uint8_t* candidates,
                         float* deviation, void* stream);
Result<size_t> top_k_scratch_cuda(uint32_t n_tokens);
Status select_top_k_cuda(const float* deviation, const uint8_t* candidates, uint32_t n_tokens, uint32_t k,
                         int32_t* selected, uint32_t* n_selected, void* scratch, size_t scratch_bytes, void* stream);
Status merge_rows_cuda(const TokenRows& fresh, const int32_t* selected, uint32_t n_selected,
                       const MutableTokenRows& dst, uint32_t n_dst_tokens, void* stream);

}  // namespace kdn::kernels::detail
