// Blend: deviation against float64 and against the lane bodies, top-k tie rule against a sort
// reference, gradual filtering, and merging recomputed rows.
#include <kdn/kernels/blend.h>
#include <kdn/kernels/synthetic.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "test_support.h"

namespace kdn::kernels {
namespace {

struct Rows {
  std::vector<uint8_t> bytes;
  TokenRows view;
};

Rows random_rows(uint32_t n, uint32_t width, int64_t stride, DType t, uint64_t seed) {
  Rows r;
  r.bytes.assign(static_cast<size_t>(n) * stride * dtype_size(t), 0);
  CounterRng rng(seed);
  testing::fill_random(r.bytes.data(), static_cast<uint64_t>(n) * stride, t, rng, 1.0);
  r.view = TokenRows{r.bytes.data(), t, width, stride};
  return r;
}

std::vector<float> deviations(const Rows& f, const Rows& c, uint32_t n, const uint8_t* cand, int threads = 0) {
  std::vector<float> dev(n);
  EXPECT_TRUE(kv_deviation(f.view, c.view, n, cand, dev.data(), Executor::cpu(threads)).ok());
  return dev;
}

std::vector<int32_t> top_k(const std::vector<float>& dev, const uint8_t* cand, uint32_t k) {
  const uint32_t n = static_cast<uint32_t>(dev.size());
  Result<size_t> need = top_k_scratch_bytes(n, Executor::cpu());
  EXPECT_TRUE(need.ok());
  std::vector<uint8_t> scratch(*need);
  std::vector<int32_t> sel(std::min(k, n));
  uint32_t got = 0;
  EXPECT_TRUE(
      select_top_k(dev.data(), cand, n, k, sel.data(), &got, scratch.data(), scratch.size(), Executor::cpu()).ok());
  sel.resize(got);
  return sel;
}

// The tie rule by brute force: sort candidates by (deviation desc, index asc), NaN first.
std::vector<int32_t> top_k_reference(const std::vector<float>& dev, const uint8_t* cand, uint32_t k) {
  std::vector<int32_t> idx;
  for (uint32_t j = 0; j < dev.size(); ++j)
    if (cand == nullptr || cand[j]) idx.push_back(static_cast<int32_t>(j));
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
    const bool na = std::isnan(dev[a]), nb = std::isnan(dev[b]);
    if (na != nb) return na;
    return !na && dev[a] > dev[b];
  });
  idx.resize(std::min<size_t>(k, idx.size()));
  std::sort(idx.begin(), idx.end());
  return idx;
}

TEST(Blend, DeviationMatchesFloat64) {
  for (uint32_t width : {1024u, 1000u, 7u}) {
    const uint32_t n = 64;
    const Rows f = random_rows(n, width, width + 3, DType::kF16, 1), c = random_rows(n, width, width, DType::kBF16, 2);
    const std::vector<float> dev = deviations(f, c, n, nullptr);
    for (uint32_t j = 0; j < n; ++j) {
      double want = 0;
      for (uint32_t ch = 0; ch < width; ++ch) {
        const double d = double{load_f32(f.view.data, int64_t{j} * f.view.row_stride + ch, DType::kF16, 1.0f)} -
                         load_f32(c.view.data, int64_t{j} * c.view.row_stride + ch, DType::kBF16, 1.0f);
        want += d * d;
      }
      ASSERT_NEAR(dev[j], want, 1e-5 * want) << "width " << width << " token " << j;
    }
  }
}

TEST(Blend, DeviationEqualsLaneBodiesBitForBit) {
  const uint32_t n = 300, width = 8 * 128 + 5;
  const Rows f = random_rows(n, width, width, DType::kF16, 3), c = random_rows(n, width, width, DType::kF16, 4);
  const std::vector<float> one = deviations(f, c, n, nullptr, 1), many = deviations(f, c, n, nullptr, 0);
  for (uint32_t j = 0; j < n; ++j) {
    float lanes[32];
    for (uint32_t l = 0; l < 32; ++l) lanes[l] = deviation_lane_sum(f.view, c.view, j, l);
    const float want = deviation_reduce(lanes);
    ASSERT_EQ(bits_as<uint32_t>(one[j]), bits_as<uint32_t>(want)) << j;
    ASSERT_EQ(bits_as<uint32_t>(many[j]), bits_as<uint32_t>(want)) << j;
  }
}

TEST(Blend, NonCandidatesGetMinusOne) {
  const uint32_t n = 10;
  const Rows f = random_rows(n, 64, 64, DType::kF32, 5), c = random_rows(n, 64, 64, DType::kF32, 6);
  const uint8_t cand[n] = {1, 0, 1, 0, 0, 1, 1, 1, 0, 1};
  const std::vector<float> dev = deviations(f, c, n, cand);
  for (uint32_t j = 0; j < n; ++j) EXPECT_EQ(dev[j] < 0, cand[j] == 0) << j;
}

TEST(Blend, TopKTieRuleLargerFirstThenSmallerIndex) {
  const std::vector<float> dev = {5, 7, 7, 1, 7, 0};
  EXPECT_EQ(top_k(dev, nullptr, 2), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(top_k(dev, nullptr, 3), (std::vector<int32_t>{1, 2, 4}));
  EXPECT_EQ(top_k(dev, nullptr, 4), (std::vector<int32_t>{0, 1, 2, 4}));
  const uint8_t cand[] = {1, 0, 1, 1, 1, 1};
  EXPECT_EQ(top_k(dev, cand, 2), (std::vector<int32_t>{2, 4}));
  EXPECT_EQ(top_k(dev, cand, 99), (std::vector<int32_t>{0, 2, 3, 4, 5}));  // k > candidates: all
  EXPECT_TRUE(top_k(dev, cand, 0).empty());
  const std::vector<float> with_nan = {3, std::numeric_limits<float>::quiet_NaN(), 9, 9};
  EXPECT_EQ(top_k(with_nan, nullptr, 2), (std::vector<int32_t>{1, 2}));  // NaN ranks first
}

TEST(Blend, TopKEqualsSortReferenceWithManyTies) {
  CounterRng rng(11);
  for (int round = 0; round < 50; ++round) {
    const uint32_t n = 1 + static_cast<uint32_t>(rng.next_below(3000));
    std::vector<float> dev(n);
    std::vector<uint8_t> cand(n);
    for (uint32_t j = 0; j < n; ++j) {
      dev[j] = static_cast<float>(rng.next_below(20)) * 0.5f;  // heavy ties
      cand[j] = rng.next_below(4) != 0;
    }
    const uint32_t k = static_cast<uint32_t>(rng.next_below(n + 1));
    ASSERT_EQ(top_k(dev, cand.data(), k), top_k_reference(dev, cand.data(), k)) << "round " << round;
    ASSERT_EQ(top_k(dev, nullptr, k), top_k_reference(dev, nullptr, k)) << "round " << round;
  }
}

// Gradual filtering (CacheBlend §4.3): select r1 on the first check layer, then r2 < r1 among
// those on the next; the second selection is a subset ranked by the second layer's deviation.
TEST(Blend, GradualFilteringNarrowsTheSelection) {
  const uint32_t n = 512, width = 256;
  const Rows f1 = random_rows(n, width, width, DType::kF16, 21), c1 = random_rows(n, width, width, DType::kF16, 22);
  const Rows f2 = random_rows(n, width, width, DType::kF16, 23), c2 = random_rows(n, width, width, DType::kF16, 24);
  const std::vector<float> d1 = deviations(f1, c1, n, nullptr);
  const std::vector<int32_t> s1 = top_k(d1, nullptr, recompute_count(n, 0.3));
  ASSERT_EQ(s1.size(), 153u);
  std::vector<uint8_t> mask(n);
  ASSERT_TRUE(selection_to_mask(s1.data(), static_cast<uint32_t>(s1.size()), n, mask.data()).ok());
  const std::vector<float> d2 = deviations(f2, c2, n, mask.data());
  const std::vector<int32_t> s2 = top_k(d2, mask.data(), recompute_count(n, 0.15));
  ASSERT_EQ(s2.size(), 76u);
  for (int32_t j : s2) EXPECT_TRUE(std::binary_search(s1.begin(), s1.end(), j)) << j;
  EXPECT_EQ(s2, top_k_reference(d2, mask.data(), 76));
}

TEST(Blend, RecomputeCount) {
  EXPECT_EQ(recompute_count(100, 0.15), 15u);
  EXPECT_EQ(recompute_count(3, 0.15), 1u);
  EXPECT_EQ(recompute_count(0, 0.15), 0u);
  EXPECT_EQ(recompute_count(10, 0.0), 0u);
  EXPECT_EQ(recompute_count(10, 1.5), 10u);
}

TEST(Blend, MergeRowsReplacesOnlySelectedRows) {
  const uint32_t n = 20, width = 48, n_sel = 4;
  const Rows fresh = random_rows(n_sel, width, width, DType::kF32, 31);
  Rows ctx = random_rows(n, width, width + 16, DType::kBF16, 32);
  const std::vector<uint8_t> before = ctx.bytes;
  const int32_t sel[n_sel] = {0, 5, 6, 19};
  MutableTokenRows dst{ctx.bytes.data(), DType::kBF16, width, width + 16};
  ASSERT_TRUE(merge_rows(fresh.view, sel, n_sel, dst, n, Executor::cpu()).ok());
  for (uint32_t j = 0; j < n; ++j) {
    const int64_t at = int64_t{j} * (width + 16);
    const auto* it = std::find(sel, sel + n_sel, static_cast<int32_t>(j));
    for (uint32_t ch = 0; ch < width + 16; ++ch) {
      const uint16_t got = reinterpret_cast<const uint16_t*>(ctx.bytes.data())[at + ch];
      const uint16_t old = reinterpret_cast<const uint16_t*>(before.data())[at + ch];
      if (it == sel + n_sel || ch >= width) {
        ASSERT_EQ(got, old) << j << " " << ch;
      } else {
        const float want = load_f32(fresh.view.data, (it - sel) * int64_t{width} + ch, DType::kF32, 1.0f);
        ASSERT_EQ(got, f32_to_bf16(want)) << j << " " << ch;
      }
    }
  }
  const int32_t unsorted[] = {5, 0};
  EXPECT_FALSE(merge_rows(fresh.view, unsorted, 2, dst, n, Executor::cpu()).ok());
  const int32_t out_of_range[] = {3, 20};
  EXPECT_FALSE(merge_rows(fresh.view, out_of_range, 2, dst, n, Executor::cpu()).ok());
  uint8_t mask[4];
  EXPECT_FALSE(selection_to_mask(out_of_range, 2, 4, mask).ok());
}

TEST(Blend, BadArgumentsAreRejected) {
  const Rows f = random_rows(4, 16, 16, DType::kF16, 41), c = random_rows(4, 8, 8, DType::kF16, 42);
  float dev[4];
  EXPECT_FALSE(kv_deviation(f.view, c.view, 4, nullptr, dev, Executor::cpu()).ok());  // widths differ
  TokenRows bad = f.view;
  bad.row_stride = 8;
  EXPECT_FALSE(kv_deviation(bad, f.view, 4, nullptr, dev, Executor::cpu()).ok());
  int32_t sel[2];
  uint32_t got;
  uint64_t scratch[1];
  EXPECT_FALSE(select_top_k(dev, nullptr, 4, 2, sel, &got, scratch, sizeof scratch, Executor::cpu()).ok());
}

}  // namespace
}  // namespace kdn::kernels
