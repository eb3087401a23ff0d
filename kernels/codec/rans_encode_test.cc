// The AVX2 rANS encoder against the scalar definition: the same words and states for every
// alphabet, skewed and flat tables, frequency-1 and single-symbol tables, every length
// around a step, and stacks too small for the vector loop's slack.
#include "rans.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace kdn::kernels::rans {
namespace {

struct Encoded {
  bool ok = false;
  std::vector<uint16_t> words;
  std::vector<uint32_t> states;
};

Encoded encode_with(SimdLevel level, const std::vector<uint8_t>& sym, const std::vector<uint16_t>& freq,
                    uint32_t stack_words) {
  EncodeTable t;
  EXPECT_TRUE(build_encode_table(freq.data(), static_cast<uint32_t>(freq.size()), &t));
  std::vector<uint16_t> stack(stack_words);
  EncodedBlock eb;
  const SimdLevel was = set_simd_level(level);
  Encoded e;
  e.ok = encode_block(sym.data(), static_cast<uint32_t>(sym.size()), t, stack.data(), stack_words, &eb);
  set_simd_level(was);
  if (e.ok) {
    e.words.assign(eb.words, eb.words + eb.n_words);
    e.states.assign(eb.state, eb.state + kLanes);
  }
  return e;
}

// Symbols drawn from a geometric-ish law over n_syms (skew 0: uniform), and their table.
void make_case(uint32_t n_syms, uint32_t n, double skew, uint32_t seed, std::vector<uint8_t>* sym,
               std::vector<uint16_t>* freq) {
  std::mt19937 rng(seed);
  std::vector<double> w(n_syms);
  for (uint32_t s = 0; s < n_syms; ++s) w[s] = 1.0 / (1.0 + skew * s * s);
  std::discrete_distribution<uint32_t> dist(w.begin(), w.end());
  sym->resize(n);
  std::vector<uint32_t> counts(n_syms, 0);
  for (auto& s : *sym) counts[s = static_cast<uint8_t>(dist(rng))]++;
  freq->assign(n_syms, 0);
  ASSERT_TRUE(normalize_frequencies(counts.data(), n_syms, freq->data()));
}

void expect_same(const std::vector<uint8_t>& sym, const std::vector<uint16_t>& freq, uint32_t stack_words) {
  const Encoded a = encode_with(SimdLevel::kScalar, sym, freq, stack_words);
  const Encoded b = encode_with(SimdLevel::kAvx2, sym, freq, stack_words);
  ASSERT_TRUE(a.ok);
  ASSERT_TRUE(b.ok);
  EXPECT_EQ(a.words, b.words);
  EXPECT_EQ(a.states, b.states);
}

TEST(RansEncode, VectorLoopWritesTheScalarWords) {
  if (!cpu_has_avx2()) GTEST_SKIP() << "no AVX2";
  uint32_t seed = 1;
  for (uint32_t n_syms : {1u, 2u, 3u, 4u, 16u, 17u, 100u, 256u})
    for (double skew : {0.0, 0.3, 5.0})
      for (uint32_t n : {31u, 32u, 33u, 64u, 95u, 1000u, 16384u}) {
        std::vector<uint8_t> sym;
        std::vector<uint16_t> freq;
        make_case(n_syms, n, skew, seed++, &sym, &freq);
        expect_same(sym, freq, n);
      }
}

TEST(RansEncode, FrequencyOneAndFullTableSymbols) {
  if (!cpu_has_avx2()) GTEST_SKIP() << "no AVX2";
  // One symbol with freq 4096 (never renormalizes) and tables of freq-1 symbols.
  std::vector<uint8_t> sym(4096, 0);
  expect_same(sym, {4096}, 4096);
  std::vector<uint16_t> freq(256, 1);
  freq[0] = 4096 - 255;
  for (uint32_t i = 0; i < sym.size(); ++i) sym[i] = static_cast<uint8_t>(i % 7 ? 0 : (i * 37) % 256);
  expect_same(sym, freq, 4096);
}

TEST(RansEncode, SmallStacksFallBackToTheScalarLoop) {
  if (!cpu_has_avx2()) GTEST_SKIP() << "no AVX2";
  std::vector<uint8_t> sym;
  std::vector<uint16_t> freq;
  make_case(256, 640, 0.0, 99, &sym, &freq);  // near-uniform 8-bit: about one word per symbol
  expect_same(sym, freq, 640);
}

TEST(RansEncode, AbsentSymbolIsRefusedByBothLoops) {
  std::vector<uint8_t> sym(256, 0);
  sym[200] = 2;  // freq 0
  const std::vector<uint16_t> freq = {2048, 2048, 0};
  EXPECT_FALSE(encode_with(SimdLevel::kScalar, sym, freq, 256).ok);
  EXPECT_FALSE(encode_with(SimdLevel::kAvx2, sym, freq, 256).ok);
  sym[200] = 5;  // past the table
  EXPECT_FALSE(encode_with(SimdLevel::kAvx2, sym, freq, 256).ok);
}

}  // namespace
}  // namespace kdn::kernels::rans
