// Fused CPU decode -> dequantize -> (K) RoPE delta -> scatter into an engine layout.
#include "decode_run.h"

#include <kdn/kernels/copy.h>
#include <kdn/kernels/cpu_rows.h>
#include <kdn/kernels/layout.h>
#include <kdn/kernels/rope.h>

namespace kdn::kernels {
namespace kvc1 {
namespace {

Status invalid(const char* what) { return Status(Code::kInvalidArgument, what); }

// Rows are rebuilt in f32, rotated (K, when a table is given) and rounded once into the
// engine's dtype at the token's slot.
class ScatterSink {
 public:
  ScatterSink(const EngineView& v, const RopeTable* rope, DType chunk_dtype, uint32_t head_dim, uint32_t layer,
              uint32_t plane, uint32_t head)
      : v_(v),
        rope_(plane == 0 ? rope : nullptr),
        chunk_dtype_(chunk_dtype),
        head_dim_(head_dim),
        layer_(layer),
        plane_(plane),
        head_(head) {}

  DType quant_type() const { return DType::kF32; }
  void* quant_row(uint32_t) { return row_; }
  void commit_quant(uint32_t t) { store(t); }
  void* bits_row(uint32_t) { return bits_; }
  void commit_bits(uint32_t t) {
    load_row_f32(bits_, chunk_dtype_, chunk_scale(v_, plane_, chunk_dtype_), head_dim_, row_);
    store(t);
  }

 private:
  void store(uint32_t t) {
    const int64_t slot = token_slot(v_, t);
    if (!slot_in_bounds(v_, slot)) return;
    if (rope_) rope_row_f32_cpu(*rope_, t, row_);
    store_engine_row_f32(v_, plane_, layer_, slot, head_, row_);
  }

  const EngineView& v_;
  const RopeTable* rope_;
  DType chunk_dtype_;
  uint32_t head_dim_, layer_, plane_, head_;
  alignas(32) float row_[kMaxHeadDim];
  alignas(32) uint8_t bits_[kMaxHeadDim * 4];
};

// What the host can check about the destination before any byte moves.
Status check_destination(const EngineView& v, const ChunkGeometry& g, const LayerRange& layers, const RopeTable* rope) {
  KDN_RETURN_IF_ERROR(validate_view(v, g));
  for (uint32_t p = 0; p < 2; ++p)
    for (uint32_t l = layers.begin; l < layers.end; ++l)
      if (!v.layer_base[p] || !v.layer_base[p][l]) return invalid("engine view: null layer base");
  if (v.slot_limit > 0)
    for (uint32_t t = 0; t < g.tokens; ++t)
      if (token_slot(v, t) >= v.slot_limit) return invalid("engine view: slot beyond slot_limit");
  if (!rope) return OkStatus();
  if (rope->style != RopeStyle::kNeox && rope->style != RopeStyle::kGptj) return invalid("rope table: unknown style");
  if (rope->rotary_dim == 0 || rope->rotary_dim % 2 != 0 || rope->rotary_dim > g.head_dim)
    return invalid("rope table: rotary_dim must be even and in (0, head_dim]");
  if (!rope->cos_sin || rope->per_token > 1) return invalid("rope table: null cos_sin or bad per_token");
  return OkStatus();
}

}  // namespace
}  // namespace kvc1

Status kvc1_decode_scatter(const uint8_t* blob, size_t len, const ChunkGeometry& expected, const kdn_key& fingerprint,
                           const EngineView& dst, const RopeTable* rope, const DecodeOptions& opts) noexcept {
  using namespace kvc1;
  kvc1::Header h;
  LayerRange layers;
  KDN_RETURN_IF_ERROR(open_for_decode(blob, len, expected, fingerprint, opts, &h, &layers));
  KDN_RETURN_IF_ERROR(refuse_calibrated(h));
  KDN_RETURN_IF_ERROR(check_destination(dst, expected, layers, rope));
  KDN_RETURN_IF_ERROR(validate_layers(blob, h, layers, opts));
  const uint32_t per_layer = 2 * h.kv_heads;
  FirstError err;
  run_tasks((layers.end - layers.begin) * per_layer, opts.cpu_threads, err, [&](uint32_t i) {
    const uint32_t layer = layers.begin + i / per_layer;
    const uint32_t plane = (i % per_layer) / h.kv_heads;
    const uint32_t head = i % h.kv_heads;
    Plane planes[2];
    if (uint32_t e = locate_planes(blob, h, layer, planes)) return parse_status(e);
    ScatterSink sink(dst, rope, expected.dtype, h.head_dim, layer, plane, head);
    return decode_head(blob, h, planes[plane], head, sink);
  });
  return err.get();
}

}  // namespace kdn::kernels
