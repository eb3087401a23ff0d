// KV memory layouts: the canonical chunk and the one strided/paged engine descriptor.
//
// Canonical chunk (what kdn stores): [layer][K|V][token][kv_head][head_dim], dense, one dtype.
//     offset(l, kv, t, h, d) = (((l * 2 + kv) * T + t) * H + h) * D + d        (elements)
//
// Engine buffers (what engines own) are described by one POD, EngineView, the validated form of
// the public kdn_engine_layout (kdn/kdn.h). For plane p (0 = K, 1 = V), layer l, engine token t:
//     slot   = slot_mapping ? slot_mapping[first_token + t] : first_token + t    (slot < 0: skip)
//     blk    = slot / block_size,  off = slot % block_size
//     elem   = layer_base[p][l] + plane_offset[p] + blk * stride_block[p] + off * stride_offset[p]
//              + h * stride_head[p] + engine_channel(d) * stride_dim[p]
// with strides in elements of the engine dtype. This covers
//     vLLM flash-attn NHD (2,NB,BS,H,D) and HND (2,NB,H,BS,D), flashinfer NHD (NB,2,BS,H,D) and HND,
//     SGLang's token pool (block_size 1, separate K and V bases), llama.cpp K rows and V rows, and
//     llama.cpp's transposed V (stride_offset 1, stride_dim kv_size).
// engine_channel(d) is d, or llama.cpp's K channel permutation when kPermuteK is set: canonical
// (Hugging Face) channel c*D/2 + i of a head lives at engine channel 2i + c (V is never permuted).
//
// Ownership: a view only borrows. layer_base arrays, slot_mapping and the buffers they point to are
// caller-owned and must outlive the op; for CUDA ops they must be device-readable.
// Thread safety: views are plain values; ops on disjoint destinations may run concurrently.
#pragma once

#include <kdn/common/status.h>
#include <kdn/kdn.h>
#include <kdn/kernels/dtype.h>
#include <kdn/kernels/hd.h>

#include <cstdint>

namespace kdn {
struct ModelInfo;
}

namespace kdn::kernels {

// Shape of one canonical chunk (or of a token range of one: `tokens` may be any count).
struct ChunkGeometry {
  uint32_t layers = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t tokens = 0;
  DType dtype = DType::kF16;
};

// OK if every field is in range (kdn/common/model.h limits) and the byte size fits in 2^63.
Status validate_geometry(const ChunkGeometry& g) noexcept;
// Elements and bytes of the whole chunk (the geometry must be valid).
uint64_t chunk_elements(const ChunkGeometry& g) noexcept;
uint64_t chunk_bytes(const ChunkGeometry& g) noexcept;

// The geometry of one full chunk of a registered model (tokens = chunk_tokens, dtype = model dtype).
ChunkGeometry chunk_geometry_of(const ModelInfo& model) noexcept;

KDN_HD_INLINE int64_t chunk_offset(const ChunkGeometry& g, uint32_t layer, uint32_t plane, uint32_t token,
                                   uint32_t head, uint32_t dim) {
  const int64_t row = (static_cast<int64_t>(layer) * 2 + plane) * g.tokens + token;
  return (row * g.kv_heads + head) * static_cast<int64_t>(g.head_dim) + dim;
}

enum EngineViewFlags : uint32_t {
  kPermuteK = 1u << 0,  // engine K channels are in llama.cpp's per-head permuted order
};

struct EngineView {
  DType dtype = DType::kF16;
  uint32_t flags = 0;
  uint32_t layers = 0, kv_heads = 0, head_dim = 0;
  void* const* layer_base[2] = {nullptr, nullptr};  // per plane: `layers` base pointers
  int64_t plane_offset[2] = {0, 0};                 // K/V sharing a base: V's offset is stride_kv
  int64_t stride_block[2] = {0, 0};
  int64_t stride_offset[2] = {0, 0};
  int64_t stride_head[2] = {0, 0};
  int64_t stride_dim[2] = {1, 1};
  int64_t block_size = 1;
  const int64_t* slot_mapping = nullptr;  // nullptr: identity mapping
  int64_t first_token = 0;                // engine token of chunk token 0
  int64_t slot_limit = 0;                 // slots must be < slot_limit; 0: not bounded
  float scale[2] = {1.0f, 1.0f};          // fp8 k_scale / v_scale (engine = x / scale)
};

// What kdn_engine_layout cannot say; zero-initialized means "no bound, no permutation, scale 1".
struct ViewOptions {
  int64_t slot_limit = 0;  // exclusive bound on slots (e.g. num_blocks * block_size); 0: unchecked
  int64_t first_token = 0;
  bool permute_k = false;  // engine K is in llama.cpp channel order, chunks in HF order
  float k_scale = 1.0f, v_scale = 1.0f;
};

// Builds the view a shim call describes. Validates everything the struct says (sizes, dtype,
// non-null bases, block size, strides against the model geometry) and returns
// kInvalidArgument on any inconsistency. `abi` is caller input: never trusted.
Status view_from_abi(const kdn_engine_layout& abi, const ChunkGeometry& model, const ViewOptions& opt,
                     EngineView* out) noexcept;

// Validates a hand-built view against the chunk geometry it will be used with.
Status validate_view(const EngineView& v, const ChunkGeometry& g) noexcept;

// ---- per-element addressing bodies ------------------------------------------------------------

KDN_HD_INLINE int64_t token_slot(const EngineView& v, uint32_t token) {
  const int64_t t = v.first_token + token;
  return v.slot_mapping ? v.slot_mapping[t] : t;
}

// True if `slot` names a row that may be touched (skip slots < 0; refuse slots beyond the limit).
KDN_HD_INLINE bool slot_in_bounds(const EngineView& v, int64_t slot) {
  return slot >= 0 && (v.slot_limit == 0 || slot < v.slot_limit);
}

// Engine channel of canonical channel `d` in plane `plane`.
KDN_HD_INLINE uint32_t engine_channel(const EngineView& v, uint32_t plane, uint32_t d) {
  if (plane != 0 || !(v.flags & kPermuteK)) return d;
  const uint32_t half = v.head_dim / 2;
  return d < half ? 2 * d : 2 * (d - half) + 1;
}

// Element offset (from layer_base[plane][layer]) of the start of head `head`'s row at `slot`.
KDN_HD_INLINE int64_t engine_row_offset(const EngineView& v, uint32_t plane, int64_t slot, uint32_t head) {
  const int64_t blk = slot / v.block_size;
  const int64_t off = slot - blk * v.block_size;
  return v.plane_offset[plane] + blk * v.stride_block[plane] + off * v.stride_offset[plane] +
         static_cast<int64_t>(head) * v.stride_head[plane];
}

KDN_HD_INLINE void* engine_layer_base(const EngineView& v, uint32_t plane, uint32_t layer) {
  return v.layer_base[plane][layer];
}

}  // namespace kdn::kernels
