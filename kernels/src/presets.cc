// Strides of the engine layouts kdn knows by name (kdn/kernels/presets.h).
#include <kdn/kernels/presets.h>

namespace kdn::kernels {
namespace {

struct Strides {
  int64_t kv, block, offset, head, dim;
};

// Plane strides of fused layouts (K and V in one buffer per layer).
Strides fused_strides(EngineLayoutKind kind, int64_t nb, int64_t bs, int64_t h, int64_t d) {
  switch (kind) {
    case EngineLayoutKind::kVllmFlashNhd:
      return {nb * bs * h * d, bs * h * d, h * d, d, 1};
    case EngineLayoutKind::kVllmFlashHnd:
      return {nb * h * bs * d, h * bs * d, d, bs * d, 1};
    case EngineLayoutKind::kFlashinferNhd:
      return {bs * h * d, 2 * bs * h * d, h * d, d, 1};
    case EngineLayoutKind::kFlashinferHnd:
      return {h * bs * d, 2 * h * bs * d, d, bs * d, 1};
    default:
      return {0, 0, 0, 0, 0};
  }
}

}  // namespace

const char* engine_layout_name(EngineLayoutKind kind) noexcept {
  switch (kind) {
    case EngineLayoutKind::kVllmFlashNhd:
      return "vllm_flash_nhd";
    case EngineLayoutKind::kVllmFlashHnd:
      return "vllm_flash_hnd";
    case EngineLayoutKind::kFlashinferNhd:
      return "flashinfer_nhd";
    case EngineLayoutKind::kFlashinferHnd:
      return "flashinfer_hnd";
    case EngineLayoutKind::kSglangTokenPool:
      return "sglang_token_pool";
    case EngineLayoutKind::kLlamaCppRows:
      return "llama_cpp_rows";
    case EngineLayoutKind::kLlamaCppVTrans:
      return "llama_cpp_v_trans";
  }
  return "unknown";
}

bool engine_layout_splits_kv(EngineLayoutKind kind) noexcept {
  return kind == EngineLayoutKind::kSglangTokenPool || kind == EngineLayoutKind::kLlamaCppRows ||
         kind == EngineLayoutKind::kLlamaCppVTrans;
}

int64_t engine_layer_elements(EngineLayoutKind kind, const PagedShape& s) noexcept {
  const int64_t plane = s.num_blocks * s.block_size * s.kv_heads * s.head_dim;
  return engine_layout_splits_kv(kind) ? plane : 2 * plane;
}

Status preset_view(EngineLayoutKind kind, const PagedShape& s, void* const* layer_base, void* const* v_layer_base,
                   bool permute_k, EngineView* out) noexcept {
  if (out == nullptr || layer_base == nullptr) return Status(Code::kInvalidArgument, "preset_view: null pointer");
  const bool split = engine_layout_splits_kv(kind);
  if (split && v_layer_base == nullptr) return Status(Code::kInvalidArgument, "preset_view: layout needs V bases");
  if (s.num_blocks <= 0 || s.block_size <= 0) return Status(Code::kInvalidArgument, "preset_view: empty pool");
  EngineView v;
  v.dtype = s.dtype;
  v.flags = permute_k ? uint32_t{kPermuteK} : 0u;
  v.layers = s.layers;
  v.kv_heads = s.kv_heads;
  v.head_dim = s.head_dim;
  v.block_size = s.block_size;
  v.slot_limit = s.num_blocks * s.block_size;
  const int64_t h = s.kv_heads, d = s.head_dim;
  if (!split) {
    const Strides st = fused_strides(kind, s.num_blocks, s.block_size, h, d);
    for (uint32_t p = 0; p < 2; ++p) {
      v.layer_base[p] = layer_base;
      v.plane_offset[p] = p * st.kv;
      v.stride_block[p] = st.block;
      v.stride_offset[p] = st.offset;
      v.stride_head[p] = st.head;
      v.stride_dim[p] = st.dim;
    }
  } else {
    // Token-slot pools: one "block" per slot-block of rows, rows of H * D.
    const int64_t cells = s.num_blocks * s.block_size;
    v.layer_base[0] = layer_base;
    v.layer_base[1] = v_layer_base;
    for (uint32_t p = 0; p < 2; ++p) {
      v.stride_block[p] = s.block_size * h * d;
      v.stride_offset[p] = h * d;
      v.stride_head[p] = d;
      v.stride_dim[p] = 1;
    }
    if (kind == EngineLayoutKind::kLlamaCppVTrans) {
      v.stride_block[1] = s.block_size;
      v.stride_offset[1] = 1;
      v.stride_head[1] = d * cells;
      v.stride_dim[1] = cells;
    }
  }
  const ChunkGeometry g{s.layers, s.kv_heads, s.head_dim, 1, s.dtype};
  KDN_RETURN_IF_ERROR(validate_geometry(g));
  KDN_RETURN_IF_ERROR(validate_view(v, g));
  *out = v;
  return OkStatus();
}

}  // namespace kdn::kernels
