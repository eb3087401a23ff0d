// Engine KV layouts by name: the strides of each engine's buffers, as EngineView values.
//
// Per layer (elements of the engine dtype; NB blocks of BS tokens; H kv heads; D head dim):
//   kVllmFlashNhd      (2, NB, BS, H, D)   vLLM flash-attn, NHD (default)
//   kVllmFlashHnd      (2, NB, H, BS, D)   vLLM flash-attn, VLLM_KV_CACHE_LAYOUT=HND
//   kFlashinferNhd     (NB, 2, BS, H, D)   vLLM flashinfer, NHD
//   kFlashinferHnd     (NB, 2, H, BS, D)   vLLM flashinfer, HND
//   kSglangTokenPool   K and V separately (S, H, D), S = NB * BS token slots (slot = loc)
//   kLlamaCppRows      K and V separately, one row of H*D per cell (cells = NB * BS; flash attn on)
//   kLlamaCppVTrans    K rows; V transposed: element (cell i, channel c) at c * cells + i (flash attn off)
// The llama.cpp kinds take `permute_k` for Llama-family GGUFs (see layout.h).
// Fused layouts (one base per layer, K and V inside) use `layer_base` only; split ones (SGLang,
// llama.cpp) also need `v_layer_base`.
#pragma once

#include <kdn/common/status.h>
#include <kdn/kernels/layout.h>

#include <cstdint>

namespace kdn::kernels {

enum class EngineLayoutKind : uint32_t {
  kVllmFlashNhd,
  kVllmFlashHnd,
  kFlashinferNhd,
  kFlashinferHnd,
  kSglangTokenPool,
  kLlamaCppRows,
  kLlamaCppVTrans,
};

inline constexpr EngineLayoutKind kAllEngineLayouts[] = {
    EngineLayoutKind::kVllmFlashNhd,   EngineLayoutKind::kVllmFlashHnd,    EngineLayoutKind::kFlashinferNhd,
    EngineLayoutKind::kFlashinferHnd,  EngineLayoutKind::kSglangTokenPool, EngineLayoutKind::kLlamaCppRows,
    EngineLayoutKind::kLlamaCppVTrans,
};

const char* engine_layout_name(EngineLayoutKind kind) noexcept;

struct PagedShape {
  uint32_t layers = 0, kv_heads = 0, head_dim = 0;
  int64_t num_blocks = 0;  // token-slot layouts: slots = num_blocks * block_size
  int64_t block_size = 1;
  DType dtype = DType::kF16;
};

// True if K and V live in separate per-layer buffers.
bool engine_layout_splits_kv(EngineLayoutKind kind) noexcept;

// Elements each per-layer buffer holds (the K+V buffer for fused kinds, each of K and V for split).
int64_t engine_layer_elements(EngineLayoutKind kind, const PagedShape& shape) noexcept;

// The view of `kind` over caller-owned buffers (slot mapping, first_token: set afterwards).
// slot_limit is set to num_blocks * block_size.
Status preset_view(EngineLayoutKind kind, const PagedShape& shape, void* const* layer_base, void* const* v_layer_base,
                   bool permute_k, EngineView* out) noexcept;

}  // namespace kdn::kernels
