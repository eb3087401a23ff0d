// Row-at-a-time CPU specializations of the per-element bodies (kdn/kernels/copy.h).
//
// A "row" is the head_dim values of one (layer, plane, token, head). These functions are what the
// CPU launcher runs, and what fused CPU pipelines (e.g. codec decode -> dequantize -> RoPE ->
// scatter) call per row: same dtype with unit strides is a memcpy, f16 <-> f32 uses F16C when the
// CPU has it (chosen once at runtime), bf16 <-> f32 is a vectorizable bit loop. Every result is
// bit-identical to running the element bodies over the same row (tests check this).
//
// Host only. Pointers are caller-owned; no allocation; no validation beyond what is stated —
// callers pass views already checked by validate_view / view_from_abi.
#pragma once

#include <kdn/kernels/dtype.h>
#include <kdn/kernels/layout.h>
#include <kdn/kernels/rope.h>

#include <cstdint>

namespace kdn::kernels {

// out[i] = value of src[i] (contiguous, dtype st; fp8 multiplied by scale), i < n.
void load_row_f32(const void* src, DType st, float scale, uint32_t n, float* out) noexcept;

// dst[i] = in[i] rounded once to dt (fp8: in[i] / scale), contiguous, i < n.
void store_row_f32(const float* in, uint32_t n, DType dt, float scale, void* dst) noexcept;

// Rotates a canonical f32 row (head_dim >= table.rotary_dim) in place, for chunk token `token`.
// Same arithmetic as rope_row_f32 in kdn/kernels/rope.h, laid out for vectorization.
void rope_row_f32_cpu(const RopeTable& table, uint32_t token, float* row) noexcept;

// Stores a canonical f32 row of head_dim values into the engine row (plane, layer, slot, head),
// applying the view's K permutation, stride_dim and dtype. `slot` must be in bounds.
void store_engine_row_f32(const EngineView& v, uint32_t plane, uint32_t layer, int64_t slot, uint32_t head,
                          const float* row) noexcept;

// Loads the engine row (plane, layer, slot, head) as a canonical f32 row of head_dim values.
void load_engine_row_f32(const EngineView& v, uint32_t plane, uint32_t layer, int64_t slot, uint32_t head,
                         float* row) noexcept;

// True when this CPU's F16C path is in use (for benchmark reports).
bool cpu_has_f16c() noexcept;

}  // namespace kdn::kernels
