// Validating entry points of kdn/kernels/ops.h: check everything the host can check, then hand
// the op to the CPU or CUDA launcher.
#include <kdn/kernels/ops.h>

#include "copy_impl.h"

namespace kdn::kernels {
namespace {

using detail::Layers;

Status invalid(const char* what) { return Status(Code::kInvalidArgument, what); }

Result<Layers> resolve_layers(const ChunkGeometry& g, LayerRange r) {
  const uint32_t end = r.end == 0 ? g.layers : r.end;
  if (r.begin >= end || end > g.layers) return Status(Code::kInvalidArgument, "layer range out of bounds");
  return Layers{r.begin, end};
}

Status validate_executor(const Executor& ex) {
  if (ex.kind == Executor::Kind::kCpu) return OkStatus();
  if (ex.kind != Executor::Kind::kCuda) return invalid("unknown executor kind");
  if (!detail::cuda_is_built()) return Status(Code::kUnsupported, "built without CUDA");
  return OkStatus();
}

// CPU only (host-readable memory): per-layer bases must be non-null and every mapped slot must
// be below the view's limit. Runs before anything is written, so a bad slot changes nothing.
Status check_host_view(const EngineView& v, const ChunkGeometry& g, Layers ls) {
  for (uint32_t p = 0; p < 2; ++p) {
    for (uint32_t l = ls.l0; l < ls.l1; ++l) {
      if (v.layer_base[p][l] == nullptr) return invalid("engine view: null layer base");
    }
  }
  if (v.slot_limit == 0) return OkStatus();
  for (uint32_t t = 0; t < g.tokens; ++t) {
    if (token_slot(v, t) >= v.slot_limit) return invalid("engine view: slot beyond slot_limit");
  }
  return OkStatus();
}

Status validate_table(const RopeTable& t, const ChunkGeometry& g) {
  if (t.style != RopeStyle::kNeox && t.style != RopeStyle::kGptj) return invalid("rope table: unknown style");
  if (t.rotary_dim == 0 || (t.rotary_dim % 2) != 0 || t.rotary_dim > g.head_dim) {
    return invalid("rope table: rotary_dim must be even and in (0, head_dim]");
  }
  if (t.cos_sin == nullptr) return invalid("rope table: null cos_sin");
  if (t.per_token > 1) return invalid("rope table: per_token must be 0 or 1");
  return OkStatus();
}

// Everything scatter, gather and rope_scatter share; returns the resolved layer range.
Result<Layers> validate_copy(const void* chunk, const ChunkGeometry& g, const EngineView& v, const Executor& ex,
                             LayerRange r) {
  if (chunk == nullptr) return Status(Code::kInvalidArgument, "null chunk");
  KDN_RETURN_IF_ERROR(validate_executor(ex));
  KDN_RETURN_IF_ERROR(validate_geometry(g));
  KDN_RETURN_IF_ERROR(validate_view(v, g));
  Result<Layers> ls = resolve_layers(g, r);
  if (!ls.ok()) return ls.status();
  if (ex.kind == Executor::Kind::kCpu) KDN_RETURN_IF_ERROR(check_host_view(v, g, *ls));
  return ls;
}

}  // namespace

Status gather(const EngineView& src, void* chunk, const ChunkGeometry& geo, const Executor& ex,
              LayerRange layers) noexcept {
  Result<Layers> ls = validate_copy(chunk, geo, src, ex, layers);
  if (!ls.ok()) return ls.status();
  if (ex.kind == Executor::Kind::kCuda) return detail::gather_cuda(src, chunk, geo, *ls, ex.cuda_stream);
  detail::gather_cpu(src, chunk, geo, *ls, ex);
  return OkStatus();
}

Status scatter(const void* chunk, const ChunkGeometry& geo, const EngineView& dst, const Executor& ex,
               LayerRange layers) noexcept {
  Result<Layers> ls = validate_copy(chunk, geo, dst, ex, layers);
  if (!ls.ok()) return ls.status();
  if (ex.kind == Executor::Kind::kCuda) return detail::scatter_cuda(chunk, geo, dst, *ls, ex.cuda_stream);
  detail::scatter_cpu(chunk, geo, dst, *ls, ex);
  return OkStatus();
}

Status rope_scatter(const void* chunk, const ChunkGeometry& geo, const EngineView& dst, const RopeTable& table,
                    const Executor& ex, LayerRange layers) noexcept {
  Result<Layers> ls = validate_copy(chunk, geo, dst, ex, layers);
  if (!ls.ok()) return ls.status();
  KDN_RETURN_IF_ERROR(validate_table(table, geo));
  if (ex.kind == Executor::Kind::kCuda) return detail::rope_scatter_cuda(chunk, geo, dst, table, *ls, ex.cuda_stream);
  detail::rope_scatter_cpu(chunk, geo, dst, table, *ls, ex);
  return OkStatus();
}

Status rope_chunk(void* chunk, const ChunkGeometry& geo, const RopeTable& table, const Executor& ex,
                  LayerRange layers) noexcept {
  if (chunk == nullptr) return invalid("null chunk");
  KDN_RETURN_IF_ERROR(validate_executor(ex));
  KDN_RETURN_IF_ERROR(validate_geometry(geo));
  KDN_RETURN_IF_ERROR(validate_table(table, geo));
  Result<Layers> ls = resolve_layers(geo, layers);
  if (!ls.ok()) return ls.status();
  if (ex.kind == Executor::Kind::kCuda) return detail::rope_chunk_cuda(chunk, geo, table, *ls, ex.cuda_stream);
  detail::rope_chunk_cpu(chunk, geo, table, *ls, ex);
  return OkStatus();
}

bool cuda_built() noexcept { return detail::cuda_is_built(); }
int cuda_device_count() noexcept { return detail::cuda_devices(); }

}  // namespace kdn::kernels
