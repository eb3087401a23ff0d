// Conversions against independent float64 references, and CPU row paths against element bodies.
#include <kdn/kernels/cpu_rows.h>
#include <kdn/kernels/dtype.h>
#include <kdn/kernels/synthetic.h>

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace kdn::kernels {
namespace {

// Every finite value of a format, decoded in float64 straight from its definition.
double f16_value(uint16_t h) {
  const int e = (h >> 10) & 31, m = h & 1023;
  const double mag = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -mag : mag;
}

double fp8_value(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  const double mag = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
  return (b & 0x80) ? -mag : mag;
}

// Nearest code among the positive codes [0, max_code] (decode is increasing in the code), ties
// to the even code; values at or beyond the rounding edge of the largest code are `overflow`.
template <class Decode>
uint32_t nearest_code(double x, uint32_t max_code, Decode decode, uint32_t overflow, double edge) {
  const double a = std::fabs(x);
  if (a >= edge) return overflow;
  uint32_t lo = 0, hi = max_code;  // largest code with decode(code) <= a
  while (lo < hi) {
    const uint32_t mid = (lo + hi + 1) / 2;
    if (decode(mid) <= a) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  if (lo == max_code) return lo;
  const double below = a - decode(lo), above = decode(lo + 1) - a;
  if (below < above) return lo;
  if (above < below) return lo + 1;
  return (lo & 1) == 0 ? lo : lo + 1;
}

std::vector<float> test_values(uint64_t seed, size_t n) {
  CounterRng rng(seed);
  std::vector<float> out = {0.0f,          -0.0f,          1.0f,           -1.0f,         65504.0f,
                            65519.99f,     65520.0f,       448.0f,         464.0f,        480.0f,
                            5.9604645e-8f, 2.9802322e-8f,  2.98023259e-8f, 6.1035156e-5f, 0.001953125f,
                            0.0009765625f, 0.00097656256f, 1e-30f,         1e30f};
  while (out.size() < n) {
    const double mag = std::ldexp(1.0 + rng.next_unit(), static_cast<int>(rng.next_below(50)) - 30);
    out.push_back(static_cast<float>(rng.next_below(2) ? mag : -mag));
  }
  return out;
}

TEST(DType, F16DecodeIsExactForEveryCode) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t code = static_cast<uint16_t>(h);
    if (((h >> 10) & 31) == 31) {
      const float f = f16_to_f32(code);
      EXPECT_TRUE((h & 1023) ? std::isnan(f) : std::isinf(f)) << h;
      continue;
    }
    ASSERT_EQ(static_cast<double>(f16_to_f32(code)), f16_value(code)) << h;
    ASSERT_EQ(f32_to_f16(f16_to_f32(code)), code) << h;  // round trip is exact
  }
}

TEST(DType, F16EncodeRoundsToNearestEven) {
  for (float x : test_values(7, 20000)) {
    const uint32_t sign = std::signbit(x) ? 0x8000u : 0u;
    const uint32_t want =
        sign | nearest_code(
                   x, 0x7bff, [](uint32_t c) { return f16_value(static_cast<uint16_t>(c)); }, 0x7c00, 65520.0);
    ASSERT_EQ(f32_to_f16(x), want) << x;
  }
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::infinity()), 0x7c00);
}

TEST(DType, Bf16EncodeRoundsToNearestEven) {
  for (float x : test_values(8, 20000)) {
    const double d = x;
    const uint32_t bits = bits_as<uint32_t>(x);
    const uint16_t lo = static_cast<uint16_t>(bits >> 16), hi = static_cast<uint16_t>(lo + 1);
    const double dl = std::fabs(bf16_to_f32(lo) - d), dh = std::fabs(static_cast<double>(bf16_to_f32(hi)) - d);
    const uint16_t want = (dl < dh || (dl == dh && (lo & 1) == 0)) ? lo : hi;
    ASSERT_EQ(f32_to_bf16(x), want) << x;
  }
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(DType, Fp8E4m3MatchesDefinition) {
  for (uint32_t b = 0; b < 256; ++b) {
    const uint8_t code = static_cast<uint8_t>(b);
    if ((b & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(fp8e4m3_to_f32(code)));
      continue;
    }
    ASSERT_EQ(static_cast<double>(fp8e4m3_to_f32(code)), fp8_value(code)) << b;
    ASSERT_EQ(f32_to_fp8e4m3(fp8e4m3_to_f32(code)), code) << b;
  }
  for (float x : test_values(9, 5000)) {
    const uint32_t sign = std::signbit(x) ? 0x80u : 0u;
    // Saturating: everything beyond 448 encodes 448 (0x7e).
    const uint32_t want =
        sign | nearest_code(
                   x, 0x7e, [](uint32_t c) { return fp8_value(static_cast<uint8_t>(c)); }, 0x7e, 1e300);
    ASSERT_EQ(f32_to_fp8e4m3(x), want) << x;
  }
  EXPECT_EQ(f32_to_fp8e4m3(std::numeric_limits<float>::quiet_NaN()), 0x7f);
}

TEST(DType, Fp8ScaleDividesOnStoreAndMultipliesOnLoad) {
  uint8_t b = 0;
  store_f32(&b, 0, DType::kFP8E4M3, 6.0f, 2.0f);
  EXPECT_EQ(fp8e4m3_to_f32(b), 3.0f);
  EXPECT_EQ(load_f32(&b, 0, DType::kFP8E4M3, 2.0f), 6.0f);
}

// The row paths (F16C, vectorized loops) must equal the element bodies bit for bit.
TEST(DType, RowConversionsEqualElementBodies) {
  std::vector<float> values = test_values(10, 1003);  // odd length: exercises the vector tails
  values.push_back(std::numeric_limits<float>::quiet_NaN());
  values.push_back(-std::numeric_limits<float>::infinity());
  const uint32_t n = static_cast<uint32_t>(values.size());
  for (DType t : {DType::kF16, DType::kBF16, DType::kF32, DType::kFP8E4M3}) {
    const float scale = t == DType::kFP8E4M3 ? 0.75f : 1.0f;
    std::vector<uint8_t> by_row(n * 4), by_element(n * 4);
    store_row_f32(values.data(), n, t, scale, by_row.data());
    for (uint32_t i = 0; i < n; ++i) store_f32(by_element.data(), i, t, values[i], scale);
    ASSERT_EQ(by_row, by_element) << "dtype " << static_cast<int>(t);
    std::vector<float> back_row(n), back_element(n);
    load_row_f32(by_row.data(), t, scale, n, back_row.data());
    for (uint32_t i = 0; i < n; ++i) back_element[i] = load_f32(by_row.data(), i, t, scale);
    ASSERT_EQ(0, memcmp(back_row.data(), back_element.data(), n * 4)) << "dtype " << static_cast<int>(t);
  }
}

}  // namespace
}  // namespace kdn::kernels
