// The AVX2 + F16C rope_scatter path (rope_avx2.cc), used by the CPU launcher when it applies.
#pragma once

#include <kdn/kernels/dtype.h>

#include <cstdint>

namespace kdn::kernels::detail {

bool rope_neox_fast_available() noexcept;

// Rotates one NeoX head row (f16 or bf16, same dtype both sides, unit strides, canonical channel
// order) from src into dst with the table row cos_sin (cosines, then sines), copying channels
// >= rotary_dim unchanged. Returns false without touching dst when the path does not apply
// (no AVX2/F16C, another dtype, rotary_dim not a multiple of 16).
bool rope_neox_head_fast(const void* src, void* dst, DType dtype, uint32_t head_dim, uint32_t rotary_dim,
                         const float* cos_sin, bool stream) noexcept;

}  // namespace kdn::kernels::detail
