#include "gpu_layout.h"

#include <kdn/kernels/dtype.h>

#include <algorithm>
#include <cstring>
#include <string>

namespace kdn::sidecar::gpu {
namespace {

using i128 = __int128;

Status invalid(const char* what) { return Status(Code::kInvalidArgument, what); }

// [lo, hi] of c * x for x in [0, n - 1].
void term_range(int64_t c, int64_t n, i128* lo, i128* hi) {
  const i128 v = i128(c) * i128(n - 1);
  *lo += v < 0 ? v : 0;
  *hi += v > 0 ? v : 0;
}

struct PlaneGeometry {
  int64_t plane_offset, stride_block, stride_offset, stride_head, stride_dim;
};

// The element offsets (from a layer's base) every token of the request can reach in one plane.
void plane_range(const PlaneGeometry& p, const kernels::ChunkGeometry& geo, int64_t block_size, int64_t max_slot,
                 i128* lo, i128* hi) {
  *lo = p.plane_offset;
  *hi = p.plane_offset;
  const int64_t max_block = max_slot / block_size;
  const int64_t offsets = std::min<int64_t>(block_size, max_slot + 1);
  term_range(p.stride_block, max_block + 1, lo, hi);
  term_range(p.stride_offset, offsets, lo, hi);
  term_range(p.stride_head, geo.kv_heads, lo, hi);
  term_range(p.stride_dim, geo.head_dim, lo, hi);
}

// Whether [base + lo * es, base + (hi + 1) * es) lies inside the range (engine addresses).
bool inside(uint64_t base, i128 lo, i128 hi, uint32_t es, const RegisteredRange& r) {
  const i128 first = i128(base) + lo * es;
  const i128 end = i128(base) + (hi + 1) * es;
  return first >= i128(r.engine_base) && end <= i128(r.engine_base) + i128(r.bytes) && first < end;
}

}  // namespace

Result<CheckedLayout> check_and_translate(const GpuLayout& layout, const kernels::ChunkGeometry& geo, uint32_t chunks,
                                          const RegisteredRange& range) noexcept {
  const ipc::GpuLayoutRecord& r = layout.record;
  if (r.layers != geo.layers) return invalid("GPU layout: layers differs from the model's");
  if (uint64_t(r.tokens) != uint64_t(chunks) * geo.tokens)
    return invalid("GPU layout: slot_mapping must cover every chunk's tokens");
  if (!kernels::dtype_valid(r.engine_dtype)) return invalid("GPU layout: unknown engine_dtype");
  if (r.block_size <= 0 || r.block_size > (int64_t(1) << 32)) return invalid("GPU layout: block_size out of range");
  if (range.bytes == 0 || range.engine_base + range.bytes < range.engine_base)
    return invalid("GPU layout: empty registration");
  const bool split = r.flags & ipc::kGpuLayoutSplitV;
  try {
    CheckedLayout c;
    c.slots = layout.slots;
    for (int64_t s : c.slots) {
      if (s > (int64_t(1) << 48)) return invalid("GPU layout: slot_mapping holds a slot beyond 2^48");
      c.max_slot = std::max(c.max_slot, s);
    }
    // Build the view from the engine's numbers first, so the kernels' own checks (strides
    // against the geometry, K/V aliasing) apply as for host layouts.
    c.k_bases.assign(r.layers, nullptr);
    c.v_bases.assign(split ? r.layers : 0, nullptr);
    kdn_engine_layout abi{};
    abi.struct_size = sizeof abi;
    abi.engine_dtype = r.engine_dtype;
    abi.stride_kv = r.stride_kv;
    abi.stride_block = r.stride_block;
    abi.stride_offset = r.stride_offset;
    abi.stride_head = r.stride_head;
    abi.stride_dim = r.stride_dim;
    abi.block_size = r.block_size;
    abi.v_stride_block = r.v_stride_block;
    abi.v_stride_offset = r.v_stride_offset;
    abi.v_stride_head = r.v_stride_head;
    abi.v_stride_dim = r.v_stride_dim;
    for (uint32_t l = 0; l < r.layers; ++l) {
      if (layout.k_bases[l] == 0) return invalid("GPU layout: null layer_base");
      if (split && layout.v_bases[l] == 0) return invalid("GPU layout: null v_layer_base");
    }
    // Non-null placeholders: the view borrows these arrays until translated below.
    std::vector<void*> k_engine(r.layers), v_engine(split ? r.layers : 0);
    for (uint32_t l = 0; l < r.layers; ++l) {
      k_engine[l] = reinterpret_cast<void*>(uintptr_t(layout.k_bases[l]));
      if (split) v_engine[l] = reinterpret_cast<void*>(uintptr_t(layout.v_bases[l]));
    }
    abi.layer_base = k_engine.data();
    abi.v_layer_base = split ? v_engine.data() : nullptr;
    abi.slot_mapping = c.slots.data();
    KDN_RETURN_IF_ERROR(kernels::view_from_abi(abi, geo, {}, &c.view));
    const uint32_t es = kernels::dtype_size(c.view.dtype);
    if (c.max_slot >= 0) {
      for (uint32_t plane = 0; plane < 2; ++plane) {
        const PlaneGeometry pg{c.view.plane_offset[plane], c.view.stride_block[plane], c.view.stride_offset[plane],
                               c.view.stride_head[plane], c.view.stride_dim[plane]};
        i128 lo, hi;
        plane_range(pg, geo, r.block_size, c.max_slot, &lo, &hi);
        const std::vector<uint64_t>& bases = plane == 1 && split ? layout.v_bases : layout.k_bases;
        for (uint32_t l = 0; l < r.layers; ++l) {
          if (!inside(bases[l], lo, hi, es, range)) {
            if (plane == 1 && split)
              return invalid("GPU layout: v_layer_base + v strides reach outside the registered range");
            return invalid(plane == 1 ? "GPU layout: layer_base + stride_kv reaches outside the registered range"
                                      : "GPU layout: layer_base + strides reach outside the registered range");
          }
        }
      }
    }
    // Every base is inside the range (or no slot is written at all): rewrite to kdnd's mapping.
    auto translate = [&](uint64_t a) -> void* {
      if (a < range.engine_base || a - range.engine_base >= range.bytes) return nullptr;
      return reinterpret_cast<void*>(uintptr_t(range.mapping_base + (a - range.engine_base)));
    };
    for (uint32_t l = 0; l < r.layers; ++l) {
      c.k_bases[l] = translate(layout.k_bases[l]);
      if (split) c.v_bases[l] = translate(layout.v_bases[l]);
      if (c.k_bases[l] == nullptr || (split && c.v_bases[l] == nullptr))
        return invalid("GPU layout: a layer base lies outside the registered range");
    }
    c.view.layer_base[0] = c.k_bases.data();
    c.view.layer_base[1] = split ? c.v_bases.data() : c.k_bases.data();
    c.view.slot_mapping = c.slots.data();
    c.view.slot_limit = c.max_slot + 1;  // the device skips anything else, whatever happens
    return c;
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "GPU layout: out of memory");
  }
}

}  // namespace kdn::sidecar::gpu
