// kvc1_allocate_bits: bounds, budget, determinism, and optimality against exhaustive search.
#include <kdn/kernels/codec.h>

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

namespace kdn::kernels {
namespace {

struct Allocation {
  std::vector<uint8_t> k, v;
};

Allocation allocate(const std::vector<double>& ks, const std::vector<double>& vs, double mean, uint32_t lo = 2,
                    uint32_t hi = 8, uint32_t probe = 4) {
  Allocation a{std::vector<uint8_t>(ks.size()), std::vector<uint8_t>(vs.size())};
  const Status st = kvc1_allocate_bits(ks, vs, probe, mean, lo, hi, a.k, a.v);
  EXPECT_TRUE(st.ok()) << st.what();
  return a;
}

uint32_t total(const Allocation& a) {
  return std::accumulate(a.k.begin(), a.k.end(), 0u) + std::accumulate(a.v.begin(), a.v.end(), 0u);
}

double cost(const std::vector<double>& ks, const std::vector<double>& vs, const Allocation& a, uint32_t probe = 4) {
  double c = 0;
  for (size_t i = 0; i < ks.size(); ++i)
    c += kvc1_modelled_cost(ks[i], probe, a.k[i]) + kvc1_modelled_cost(vs[i], probe, a.v[i]);
  return c;
}

TEST(AllocateBits, EqualSensitivitiesGetTheMeanEverywhere) {
  for (double s : {0.0, 1e-3}) {
    const Allocation a = allocate(std::vector<double>(6, s), std::vector<double>(6, s), 4.0);
    for (size_t i = 0; i < 6; ++i) {
      EXPECT_EQ(a.k[i], 4);
      EXPECT_EQ(a.v[i], 4);
    }
  }
}

TEST(AllocateBits, SensitiveSlotsGetMoreBitsWithinTheBudget) {
  // One K layer dominates (as one does in SmolLM2); V barely matters.
  const std::vector<double> ks = {1e-5, 2e-3, 1e-5, 4e-4};
  const std::vector<double> vs = {3e-6, 1e-6, 2e-6, 1e-6};
  const Allocation a = allocate(ks, vs, 4.0);
  EXPECT_EQ(total(a), 32u);
  EXPECT_GT(a.k[1], 4);
  EXPECT_GE(a.k[1], a.k[3]);
  EXPECT_GT(a.k[3], a.k[0]);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_GE(a.k[i], 2);
    EXPECT_LE(a.k[i], 8);
    EXPECT_GE(a.v[i], 2);
    EXPECT_LE(a.v[i], 8);
  }
  // Far below the uniform 4 bits in modelled cost.
  const Allocation uniform{std::vector<uint8_t>(4, 4), std::vector<uint8_t>(4, 4)};
  EXPECT_LT(cost(ks, vs, a), 0.5 * cost(ks, vs, uniform));
}

TEST(AllocateBits, ScaleInvariantAndNeverOverTheMean) {
  std::mt19937_64 rng(7);
  std::lognormal_distribution<double> dist(-9, 2);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<double> ks(30), vs(30);
    for (auto& x : ks) x = dist(rng);
    for (auto& x : vs) x = dist(rng);
    const double mean = 3.0 + 0.1 * trial;
    const Allocation a = allocate(ks, vs, mean);
    EXPECT_LE(total(a), mean * 60 + 1e-9);
    EXPECT_GT(total(a) + 1, mean * 60);
    for (auto& x : ks) x *= 1000;
    for (auto& x : vs) x *= 1000;
    const Allocation b = allocate(ks, vs, mean);
    EXPECT_EQ(a.k, b.k);
    EXPECT_EQ(a.v, b.v);
  }
}

// Every assignment of widths to 4 slots within the budget: none costs less than the greedy one.
TEST(AllocateBits, MatchesExhaustiveSearch) {
  std::mt19937_64 rng(11);
  std::lognormal_distribution<double> dist(-8, 2.5);
  for (int trial = 0; trial < 30; ++trial) {
    const std::vector<double> ks = {dist(rng), dist(rng)}, vs = {dist(rng), dist(rng)};
    const double mean = 2.0 + 0.25 * (trial % 17);
    const uint32_t lo = 1 + trial % 3, hi = 8 - trial % 2;
    if (mean < lo || mean > hi) continue;
    const Allocation greedy = allocate(ks, vs, mean, lo, hi);
    double best = std::numeric_limits<double>::infinity();
    for (uint8_t a = lo; a <= hi; ++a)
      for (uint8_t b = lo; b <= hi; ++b)
        for (uint8_t c = lo; c <= hi; ++c)
          for (uint8_t d = lo; d <= hi; ++d)
            if (a + b + c + d <= mean * 4 + 1e-9) best = std::min(best, cost(ks, vs, Allocation{{a, b}, {c, d}}));
    EXPECT_NEAR(cost(ks, vs, greedy), best, best * 1e-12) << "trial " << trial;
  }
}

TEST(AllocateBits, BoundsAreKept) {
  const std::vector<double> ks = {1.0, 0.0}, vs = {0.0, 0.0};
  Allocation a = allocate(ks, vs, 5.0, 3, 6);  // the one sensitive slot stops at max
  EXPECT_EQ(a.k[0], 6);
  EXPECT_EQ(total(a), 20u);
  a = allocate(ks, vs, 8.0, 2, 8);
  EXPECT_EQ(total(a), 32u);
}

TEST(AllocateBits, RejectsBadArguments) {
  std::vector<uint8_t> k(2), v(2), short_v(1);
  const std::vector<double> s = {1, 2};
  const std::vector<double> nan = {1, std::nan("")}, neg = {1, -1}, inf = {1, INFINITY};
  EXPECT_EQ(kvc1_allocate_bits(s, s, 4, 4, 2, 8, k, short_v).code(), Code::kInvalidArgument);
  EXPECT_EQ(kvc1_allocate_bits({}, {}, 4, 4, 2, 8, {}, {}).code(), Code::kInvalidArgument);
  EXPECT_EQ(kvc1_allocate_bits(nan, s, 4, 4, 2, 8, k, v).code(), Code::kInvalidArgument);
  EXPECT_EQ(kvc1_allocate_bits(s, neg, 4, 4, 2, 8, k, v).code(), Code::kInvalidArgument);
  EXPECT_EQ(kvc1_allocate_bits(s, inf, 4, 4, 2, 8, k, v).code(), Code::kInvalidArgument);
  EXPECT_EQ(kvc1_allocate_bits(s, s, 4, 1.5, 2, 8, k, v).code(), Code::kInvalidArgument);
  EXPECT_EQ(kvc1_allocate_bits(s, s, 4, 9, 2, 9, k, v).code(), Code::kInvalidArgument);
  EXPECT_EQ(kvc1_allocate_bits(s, s, 0, 4, 2, 8, k, v).code(), Code::kInvalidArgument);
  EXPECT_EQ(kvc1_allocate_bits(s, s, 4, std::nan(""), 2, 8, k, v).code(), Code::kInvalidArgument);
  EXPECT_EQ(k, std::vector<uint8_t>(2, 0)) << "written on failure";
}

}  // namespace
}  // namespace kdn::kernels
