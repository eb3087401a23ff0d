#include "quant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace kdn::kernels::kvc1 {
namespace {

float next_up_f16(uint16_t h) {
  const uint16_t up = (h == 0x8000u) ? 1 : (h & 0x8000u) ? static_cast<uint16_t>(h - 1) : static_cast<uint16_t>(h + 1);
  return f16_to_f32(up);
}

float random_value(std::mt19937_64& rng) {
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-26, 17);
  return std::ldexp(mant(rng), ex(rng));
}

TEST(Quant, F16DirectedRoundingBracketsTheValue) {
  std::mt19937_64 rng(1);
  for (int i = 0; i < 200000; ++i) {
    const float v = random_value(rng);
    if (std::fabs(v) > 65504.0f) continue;
    const uint16_t dn = f16_round_down(v), up = f16_round_up(v);
    EXPECT_LE(f16_to_f32(dn), v);
    EXPECT_GE(f16_to_f32(up), v);
    // Tight: the next value above the lower bound is already above v.
    if (f16_to_f32(dn) != v) {
      EXPECT_GT(next_up_f16(dn), v);
    }
  }
}

// Z <= mn and Z + (2^b - 1) S >= mx, for both scale dtypes.
TEST(Quant, StoredScaleAndZeroCoverTheGroup) {
  std::mt19937_64 rng(2);
  for (int i = 0; i < 100000; ++i) {
    float a = random_value(rng), b = random_value(rng);
    if (a > b) std::swap(a, b);
    for (uint8_t sd : {kScaleF16, kScaleF32}) {
      const uint32_t bits = 1 + i % 8;
      GroupScale gs;
      const bool feasible =
          sd == kScaleF32 || (a >= -65504.0f && (static_cast<double>(b) - a) / ((1u << bits) - 1) < 65000.0);
      const bool fits = stored_group_scale(a, b, bits, sd, &gs);
      if (!feasible) continue;  // f16 overflow is the caller's cue to use f32 scales
      if (!fits) {
        ADD_FAILURE() << "group must fit: " << a << " " << b << " bits " << bits;
        continue;
      }
      EXPECT_LE(gs.z, a);
      EXPECT_GE(static_cast<double>(gs.z) + ((1u << bits) - 1) * static_cast<double>(gs.s), static_cast<double>(b));
      EXPECT_GE(gs.s, 0.0f);
    }
  }
}

// |x - x^| <= S'/2 + a few f32 ulps of the operands, and requantizing x^ gives q back.
TEST(Quant, ErrorBoundAndStoredScaleRule) {
  std::mt19937_64 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int trial = 0; trial < 2000; ++trial) {
    const uint32_t bits = 1 + trial % 8;
    const uint32_t qmax = (1u << bits) - 1;
    const float scale = std::ldexp(1.0f, trial % 12 - 6);
    std::vector<float> x(64);
    for (auto& v : x) v = nd(rng) * scale + (trial % 3) * scale;
    const float mn = *std::min_element(x.begin(), x.end()), mx = *std::max_element(x.begin(), x.end());
    for (uint8_t sd : {kScaleF16, kScaleF32}) {
      GroupScale gs;
      ASSERT_TRUE(stored_group_scale(mn, mx, bits, sd, &gs));
      for (float v : x) {
        const uint32_t q = quantize_value(v, gs.s, gs.z, qmax);
        ASSERT_LE(q, qmax);
        const float xh = dequantize_value(q, gs.s, gs.z);
        const float slack =
            4.0f * std::ldexp(FLT_EPSILON, std::ilogb(std::max({std::fabs(v), std::fabs(gs.z), 1e-30f})));
        EXPECT_LE(std::fabs(v - xh), gs.s / 2 + slack) << v << " q=" << q;
        EXPECT_EQ(quantize_value(xh, gs.s, gs.z, qmax), q);
      }
    }
  }
}

TEST(Quant, ConstantGroupIsExact) {
  for (float c : {0.0f, 1.5f, -3.25f, 1000.0f, 6.1035156e-05f}) {
    for (uint8_t sd : {kScaleF16, kScaleF32}) {
      GroupScale gs;
      ASSERT_TRUE(stored_group_scale(c, c, 4, sd, &gs));
      EXPECT_EQ(gs.s, 0.0f);
      EXPECT_EQ(dequantize_value(quantize_value(c, gs.s, gs.z, 15), gs.s, gs.z), c);
    }
  }
  // A value f16 cannot hold still decodes within the bound, just not exactly.
  GroupScale gs;
  ASSERT_TRUE(stored_group_scale(0.1f, 0.1f, 4, kScaleF16, &gs));
  EXPECT_LE(std::fabs(dequantize_value(quantize_value(0.1f, gs.s, gs.z, 15), gs.s, gs.z) - 0.1f), gs.s / 2 + 1e-8f);
}

TEST(Quant, F16OverflowNeedsF32Scales) {
  GroupScale gs;
  EXPECT_FALSE(stored_group_scale(-1e6f, 1.0f, 4, kScaleF16, &gs));
  EXPECT_FALSE(stored_group_scale(0.0f, 1e7f, 1, kScaleF16, &gs));
  EXPECT_TRUE(stored_group_scale(-1e6f, 1.0f, 4, kScaleF32, &gs));
  EXPECT_TRUE(stored_group_scale(0.0f, 1e7f, 1, kScaleF32, &gs));
  EXPECT_FALSE(stored_group_scale(-3e38f, 3e38f, 1, kScaleF32, &gs));  // S would overflow f32
}

TEST(Quant, DequantizeRowSimdMatchesScalar) {
  std::mt19937_64 rng(4);
  for (uint8_t sd : {kScaleF16, kScaleF32}) {
    for (DType out : {DType::kF16, DType::kBF16, DType::kF32}) {
      for (uint32_t n : {8u, 64u, 80u, 7u, 128u}) {
        for (uint32_t per : {1u, 8u, 16u, n}) {
          if (n % per) continue;
          std::vector<uint8_t> q(n), s(4 * n), z(4 * n);
          for (auto& v : q) v = static_cast<uint8_t>(rng());
          for (uint32_t i = 0; i < n; ++i) {
            const float sv = std::fabs(random_value(rng)) / 16, zv = random_value(rng);
            if (sd == kScaleF16) {
              const uint16_t a = f32_to_f16(sv), b = f32_to_f16(zv);
              std::memcpy(&s[2 * i], &a, 2);
              std::memcpy(&z[2 * i], &b, 2);
            } else {
              std::memcpy(&s[4 * i], &sv, 4);
              std::memcpy(&z[4 * i], &zv, 4);
            }
          }
          std::vector<uint8_t> a(4 * n), b(4 * n);
          dequantize_row(q.data(), n, s.data(), z.data(), sd, per, out, a.data());
          const bool was = set_dequantize_simd_enabled(false);
          dequantize_row(q.data(), n, s.data(), z.data(), sd, per, out, b.data());
          set_dequantize_simd_enabled(was);
          EXPECT_EQ(a, b) << "n=" << n << " per=" << per << " out=" << static_cast<int>(out);
        }
      }
    }
  }
}

TEST(Quant, QuantizeRowSimdMatchesScalar) {
  std::mt19937_64 rng(6);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (uint32_t n : {1u, 8u, 13u, 64u, 100u}) {
    for (uint32_t qmax : {1u, 3u, 15u, 255u}) {
      std::vector<float> x(n), s(n), z(n);
      for (uint32_t i = 0; i < n; ++i) {
        x[i] = nd(rng);
        z[i] = nd(rng) - 3.0f;
        s[i] = i % 5 == 0 ? 0.0f : std::fabs(nd(rng)) / static_cast<float>(qmax) + (i % 7 == 0 ? 1e-30f : 0.0f);
        if (i % 11 == 0) x[i] = z[i] + s[i] * (static_cast<float>(i % qmax) + 0.5f);  // exact ties
      }
      std::vector<uint8_t> a(n), b(n);
      quantize_row(x.data(), s.data(), z.data(), n, qmax, a.data());
      for (uint32_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(quantize_value(x[i], s[i], z[i], qmax));
      EXPECT_EQ(a, b) << "n=" << n << " qmax=" << qmax;
    }
  }
}

// The row transform (AVX2 where present) gives the bits of the scalar butterflies, and the
// butterflies split by index (the GPU warp's way) give the same bits too; transforming twice
// and scaling by 1/n returns the input within rounding.
TEST(Quant, HadamardRowMatchesTheButterfliesAndInvertsItself) {
  std::mt19937 rng(17);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (uint32_t n = 1; n <= 4096; n *= 2) {
    std::vector<float> x(n);
    for (float& v : x) v = nd(rng) * (rng() % 16 == 0 ? 100.0f : 1.0f);
    for (float scale : {1.0f, hadamard_inverse_scale(n)}) {
      std::vector<float> fast = x, scalar = x, split = x;
      hadamard_row(fast.data(), n, scale);
      hadamard_inplace(scalar.data(), n);
      for (uint32_t len = 1; len < n; len *= 2)
        for (uint32_t j = n / 2; j-- > 0;) hadamard_butterfly(split.data(), len, j);  // any order within a stage
      for (uint32_t i = 0; i < n; ++i) {
        scalar[i] = fmul_rn(scalar[i], scale);
        split[i] = fmul_rn(split[i], scale);
      }
      ASSERT_EQ(std::memcmp(fast.data(), scalar.data(), 4 * n), 0) << "n=" << n << " scale=" << scale;
      ASSERT_EQ(std::memcmp(split.data(), scalar.data(), 4 * n), 0) << "n=" << n;
      const bool was = set_dequantize_simd_enabled(false);
      std::vector<float> off = x;
      hadamard_row(off.data(), n, scale);
      set_dequantize_simd_enabled(was);
      ASSERT_EQ(std::memcmp(off.data(), scalar.data(), 4 * n), 0) << "n=" << n;
    }
    std::vector<float> y = x;
    hadamard_row(y.data(), n, 1.0f);
    hadamard_row(y.data(), n, hadamard_inverse_scale(n));
    float mx = 0;
    for (float v : x) mx = std::max(mx, std::fabs(v));
    for (uint32_t i = 0; i < n; ++i) ASSERT_NEAR(y[i], x[i], 1e-6f * mx * (1 + std::log2(float(n)))) << n << " " << i;
  }
}

}  // namespace
}  // namespace kdn::kernels::kvc1
