// Row loops of the encoder's quantizer pass (encode_quant.cc), vectorized where the CPU
// allows; every result equals the plain row-order loop's, bit for bit.
#pragma once

#include <cstdint>

namespace kdn::kernels::kvc1 {

// False if x[0, n) holds a NaN or an infinity.
bool row_finite(const float* x, uint32_t n) noexcept;

// lo[d] = x[d] < lo[d] ? x[d] : lo[d], hi[d] = x[d] > hi[d] ? x[d] : hi[d], for d < n.
void accumulate_range(const float* x, uint32_t n, float* lo, float* hi) noexcept;

// The smallest and largest of x[0, n) (finite), each the first of its equals in row order,
// starting from +inf and -inf.
void group_range(const float* x, uint32_t n, float* lo, float* hi) noexcept;

}  // namespace kdn::kernels::kvc1
