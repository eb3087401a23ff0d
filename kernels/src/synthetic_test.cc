// The synthetic KV generator: deterministic, and shaped like real KV (K channel outliers).
#include <kdn/kernels/synthetic.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace kdn::kernels {
namespace {

const ChunkGeometry kGeo{2, 4, 64, 256, DType::kF16};

std::vector<uint8_t> make(uint64_t seed) {
  std::vector<uint8_t> c(chunk_bytes(kGeo));
  SyntheticKvParams p;
  p.seed = seed;
  EXPECT_TRUE(fill_synthetic_kv(c.data(), kGeo, p).ok());
  return c;
}

// Standard deviation over tokens of each (layer 0, head 0) channel of `plane`.
std::vector<double> channel_std(const std::vector<uint8_t>& c, uint32_t plane) {
  std::vector<double> out;
  for (uint32_t d = 0; d < kGeo.head_dim; ++d) {
    double s = 0, s2 = 0;
    for (uint32_t t = 0; t < kGeo.tokens; ++t) {
      const double x = load_f32(c.data(), chunk_offset(kGeo, 0, plane, t, 0, d), kGeo.dtype, 1.0f);
      s += x, s2 += x * x;
    }
    const double mean = s / kGeo.tokens;
    out.push_back(std::sqrt(std::max(0.0, s2 / kGeo.tokens - mean * mean)));
  }
  return out;
}

double max_over_median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.back() / v[v.size() / 2];
}

TEST(Synthetic, SameSeedSameBytesOtherSeedOtherBytes) {
  EXPECT_EQ(make(1), make(1));
  EXPECT_NE(make(1), make(2));
}

TEST(Synthetic, KHasOutlierChannelsVDoesNot) {
  const std::vector<uint8_t> c = make(3);
  EXPECT_GT(max_over_median(channel_std(c, 0)), 8.0);
  EXPECT_LT(max_over_median(channel_std(c, 1)), 2.0);
}

TEST(Synthetic, TokensAreCorrelated) {
  const std::vector<uint8_t> c = make(4);
  double num = 0, den = 0;
  for (uint32_t d = 0; d < kGeo.head_dim; ++d) {
    std::vector<double> x;
    for (uint32_t t = 0; t < kGeo.tokens; ++t)
      x.push_back(load_f32(c.data(), chunk_offset(kGeo, 1, 0, t, 1, d), kGeo.dtype, 1.0f));
    double mean = 0;
    for (double v : x) mean += v / x.size();
    for (size_t t = 0; t + 1 < x.size(); ++t) num += (x[t] - mean) * (x[t + 1] - mean);
    for (double v : x) den += (v - mean) * (v - mean);
  }
  EXPECT_GT(num / den, 0.7);  // AR(1) with rho 0.9
}

TEST(Synthetic, BadParametersAreRejected) {
  std::vector<uint8_t> c(chunk_bytes(kGeo));
  SyntheticKvParams p;
  p.token_correlation = 1.0f;
  EXPECT_FALSE(fill_synthetic_kv(c.data(), kGeo, p).ok());
  EXPECT_FALSE(fill_synthetic_kv(nullptr, kGeo, SyntheticKvParams{}).ok());
}

TEST(Synthetic, CounterRngIsUniformEnough) {
  CounterRng rng(9);
  double s = 0, s2 = 0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    const double x = rng.next_normal();
    s += x, s2 += x * x;
  }
  EXPECT_NEAR(s / n, 0.0, 0.02);
  EXPECT_NEAR(s2 / n, 1.0, 0.02);
  for (int i = 0; i < 1000; ++i) ASSERT_LT(rng.next_below(7), 7u);
}

}  // namespace
}  // namespace kdn::kernels
