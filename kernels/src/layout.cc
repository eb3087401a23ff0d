// Validation of chunk geometries and engine views, and the kdn_engine_layout conversion.
#include <kdn/common/model.h>
#include <kdn/kernels/layout.h>

#include <cmath>
#include <cstddef>

namespace kdn::kernels {
namespace {

constexpr uint32_t kMaxTokens = 1u << 24;  // a blend context, not just a chunk
constexpr int64_t kMaxStride = int64_t{1} << 40;

Status invalid(const char* what) { return Status(Code::kInvalidArgument, what); }

bool stride_ok(int64_t s) { return s >= 0 && s <= kMaxStride; }

// Largest element offset plane p can reach for slots < slot_limit, or false on overflow.
bool max_offset_fits(const EngineView& v, uint32_t p) {
  const int64_t last_slot = v.slot_limit - 1;
  const int64_t terms[4][2] = {
      {last_slot / v.block_size, v.stride_block[p]},
      {v.block_size - 1, v.stride_offset[p]},
      {static_cast<int64_t>(v.kv_heads) - 1, v.stride_head[p]},
      {static_cast<int64_t>(v.head_dim) - 1, v.stride_dim[p]},
  };
  int64_t total = v.plane_offset[p];
  for (const auto& t : terms) {
    int64_t prod;
    if (__builtin_mul_overflow(t[0], t[1], &prod) || __builtin_add_overflow(total, prod, &total)) return false;
  }
  return true;
}

Status validate_plane(const EngineView& v, uint32_t p) {
  if (v.layer_base[p] == nullptr) return invalid("engine view: null layer_base");
  if (!stride_ok(v.stride_block[p]) || !stride_ok(v.stride_offset[p]) || !stride_ok(v.stride_head[p]) ||
      !stride_ok(v.plane_offset[p])) {
    return invalid("engine view: stride out of range");
  }
  if (v.stride_dim[p] < 1 || v.stride_dim[p] > kMaxStride) return invalid("engine view: stride_dim must be >= 1");
  if (v.kv_heads > 1 && v.stride_head[p] == 0) return invalid("engine view: heads alias (stride_head 0)");
  if (v.block_size > 1 && v.stride_offset[p] == 0) return invalid("engine view: tokens alias (stride_offset 0)");
  if (!(v.scale[p] > 0.0f) || !std::isfinite(v.scale[p])) return invalid("engine view: scale must be finite, > 0");
  if (v.slot_limit > 0 && !max_offset_fits(v, p)) return invalid("engine view: offsets overflow");
  return OkStatus();
}

}  // namespace

Status validate_geometry(const ChunkGeometry& g) noexcept {
  if (g.layers == 0 || g.layers > kMaxLayers) return invalid("geometry: layers out of range");
  if (g.kv_heads == 0 || g.kv_heads > kMaxHeads) return invalid("geometry: kv_heads out of range");
  if (g.head_dim == 0 || g.head_dim > kMaxHeadDim) return invalid("geometry: head_dim out of range");
  if (g.tokens == 0 || g.tokens > kMaxTokens) return invalid("geometry: tokens out of range");
  if (!dtype_valid(static_cast<uint32_t>(g.dtype))) return invalid("geometry: unknown dtype");
  return OkStatus();  // the limits above keep chunk_bytes below 2^62
}

ChunkGeometry chunk_geometry_of(const ModelInfo& m) noexcept {
  return ChunkGeometry{m.desc.num_layers, m.desc.num_kv_heads, m.desc.head_dim, m.chunk_tokens,
                       static_cast<DType>(m.desc.dtype)};
}

uint64_t chunk_elements(const ChunkGeometry& g) noexcept {
  return uint64_t{g.layers} * 2 * g.tokens * g.kv_heads * g.head_dim;
}

uint64_t chunk_bytes(const ChunkGeometry& g) noexcept { return chunk_elements(g) * dtype_size(g.dtype); }

Status validate_view(const EngineView& v, const ChunkGeometry& g) noexcept {
  if (!dtype_valid(static_cast<uint32_t>(v.dtype))) return invalid("engine view: unknown dtype");
  if (v.layers != g.layers || v.kv_heads != g.kv_heads || v.head_dim != g.head_dim) {
    return Status(Code::kModelMismatch, "engine view: geometry differs from the chunk's");
  }
  if (v.flags & ~uint32_t{kPermuteK}) return invalid("engine view: unknown flags");
  if ((v.flags & kPermuteK) && (v.head_dim % 2) != 0) return invalid("engine view: K permutation needs even head_dim");
  if (v.block_size < 1 || v.block_size > kMaxStride) return invalid("engine view: block_size out of range");
  if (v.first_token < 0 || v.first_token > kMaxStride) return invalid("engine view: first_token out of range");
  if (v.slot_limit < 0) return invalid("engine view: negative slot_limit");
  KDN_RETURN_IF_ERROR(validate_plane(v, 0));
  return validate_plane(v, 1);
}

Status view_from_abi(const kdn_engine_layout& abi, const ChunkGeometry& model, const ViewOptions& opt,
                     EngineView* out) noexcept {
  if (out == nullptr) return invalid("view_from_abi: null output");
  if (abi.struct_size < sizeof(kdn_engine_layout))
    return Status(Code::kVersion, "kdn_engine_layout: struct_size too small");
  if (!dtype_valid(abi.engine_dtype)) return invalid("kdn_engine_layout: unknown engine_dtype");
  const bool split_v = abi.v_layer_base != nullptr;
  if (!split_v && abi.stride_kv <= 0) return invalid("kdn_engine_layout: K and V alias (stride_kv <= 0)");
  EngineView v;
  v.dtype = static_cast<DType>(abi.engine_dtype);
  v.flags = opt.permute_k ? uint32_t{kPermuteK} : 0u;
  v.layers = model.layers;
  v.kv_heads = model.kv_heads;
  v.head_dim = model.head_dim;
  v.layer_base[0] = abi.layer_base;
  v.layer_base[1] = split_v ? abi.v_layer_base : abi.layer_base;
  v.plane_offset[1] = split_v ? 0 : abi.stride_kv;
  v.stride_block[0] = abi.stride_block;
  v.stride_offset[0] = abi.stride_offset;
  v.stride_head[0] = abi.stride_head;
  v.stride_dim[0] = abi.stride_dim;
  v.stride_block[1] = split_v ? abi.v_stride_block : abi.stride_block;
  v.stride_offset[1] = split_v ? abi.v_stride_offset : abi.stride_offset;
  v.stride_head[1] = split_v ? abi.v_stride_head : abi.stride_head;
  v.stride_dim[1] = split_v ? abi.v_stride_dim : abi.stride_dim;
  v.block_size = abi.block_size;
  v.slot_mapping = abi.slot_mapping;
  v.first_token = opt.first_token;
  v.slot_limit = opt.slot_limit;
  v.scale[0] = opt.k_scale;
  v.scale[1] = opt.v_scale;
  KDN_RETURN_IF_ERROR(validate_geometry(model));
  KDN_RETURN_IF_ERROR(validate_view(v, model));
  *out = v;
  return OkStatus();
}

}  // namespace kdn::kernels
