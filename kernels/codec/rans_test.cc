#include "rans.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

namespace kdn::kernels::rans {
namespace {

struct Coded {
  std::vector<uint16_t> freq;
  std::vector<uint16_t> words;
  uint8_t states[4 * kLanes];
  uint32_t n = 0;
  uint32_t bits = 0;
};

uint32_t bits_for(uint32_t n_syms) {
  uint32_t b = 1;
  while ((1u << b) < n_syms) ++b;
  return b;
}

Coded encode(const std::vector<uint8_t>& sym, uint32_t n_syms) {
  Coded c;
  c.n = static_cast<uint32_t>(sym.size());
  c.bits = bits_for(n_syms);
  std::vector<uint32_t> counts(n_syms, 0);
  for (uint8_t s : sym) counts[s]++;
  c.freq.assign(n_syms, 0);
  if (sym.empty()) {
    c.freq[0] = kProbScale;  // any valid table
  } else {
    EXPECT_TRUE(normalize_frequencies(counts.data(), n_syms, c.freq.data()));
  }
  std::vector<uint16_t> cum(n_syms + 1);
  EXPECT_TRUE(build_cumulative(c.freq.data(), n_syms, cum.data()));
  std::vector<uint16_t> stack(sym.size() + 1);
  EncodedBlock eb;
  EXPECT_TRUE(encode_block(sym.data(), c.n, c.freq.data(), cum.data(), n_syms, stack.data(),
                           static_cast<uint32_t>(stack.size()), &eb));
  c.words.assign(eb.words, eb.words + eb.n_words);
  std::memcpy(c.states, eb.state, sizeof c.states);
  return c;
}

// Decodes in tiles of `tile` symbols with the bulk loops capped at `level`; *clean reports the
// end-state check.
std::vector<uint8_t> decode(const Coded& c, SimdLevel level, uint32_t tile, bool* clean) {
  DecodeTable t;
  EXPECT_TRUE(build_decode_table(c.freq.data(), static_cast<uint32_t>(c.freq.size()), c.bits, &t));
  const SimdLevel was = set_simd_level(level);
  BlockDecoder d;
  start_block(&d, c.states, reinterpret_cast<const uint8_t*>(c.words.data()), static_cast<uint32_t>(c.words.size()),
              c.n);
  std::vector<uint8_t> out(c.n);
  bool ok = true;
  for (uint32_t i = 0; i < c.n && ok; i += tile) ok = decode_symbols(d, t, out.data() + i, std::min(tile, c.n - i));
  set_simd_level(was);
  *clean = ok && block_finished_cleanly(d);
  return out;
}

// The decoder exactly as the format defines it, step by step: decode every active lane, then
// refill the needy lanes in ascending lane order. The streaming decoders must agree with it.
std::vector<uint8_t> decode_by_definition(const Coded& c, bool* clean) {
  std::vector<uint16_t> cum(c.freq.size() + 1);
  build_cumulative(c.freq.data(), static_cast<uint32_t>(c.freq.size()), cum.data());
  uint32_t x[kLanes];
  std::memcpy(x, c.states, sizeof x);
  std::vector<uint8_t> out(c.n);
  uint32_t p = 0;
  const uint32_t steps = (c.n + kLanes - 1) / kLanes;
  for (uint32_t s = 0; s < steps; ++s) {
    for (uint32_t j = 0; j < kLanes && s * kLanes + j < c.n; ++j) {
      const uint32_t slot = x[j] & (kProbScale - 1);
      uint32_t y = static_cast<uint32_t>(c.freq.size()) - 1;
      while (cum[y] > slot || c.freq[y] == 0) --y;  // largest y with cum[y] <= slot, freq > 0
      x[j] = c.freq[y] * (x[j] >> kProbBits) + slot - cum[y];
      out[s * kLanes + j] = static_cast<uint8_t>(y);
    }
    for (uint32_t j = 0; j < kLanes && s * kLanes + j < c.n; ++j) {
      if (x[j] >= kLower) continue;
      if (p >= c.words.size()) {
        *clean = false;
        return out;
      }
      x[j] = (x[j] << 16) | c.words[p++];
    }
  }
  *clean = p == c.words.size() && std::all_of(x, x + kLanes, [](uint32_t v) { return v == kLower; });
  return out;
}

// Skewed random symbols over [0, n_syms): most mass on a few values, every value present.
std::vector<uint8_t> skewed_symbols(uint32_t n, uint32_t n_syms, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::geometric_distribution<uint32_t> geo(0.3);
  std::vector<uint8_t> s(n);
  for (uint32_t i = 0; i < n; ++i) s[i] = static_cast<uint8_t>(i < n_syms ? i : geo(rng) % n_syms);
  std::shuffle(s.begin(), s.end(), rng);
  return s;
}

// Every decoder this CPU can run: the scalar reference and each SIMD level it has.
std::vector<SimdLevel> levels() {
  std::vector<SimdLevel> v = {SimdLevel::kScalar};
  if (cpu_has_avx2()) v.push_back(SimdLevel::kAvx2);
  return v;
}

void expect_round_trip(const std::vector<uint8_t>& sym, uint32_t n_syms, uint32_t tile = 4096) {
  const Coded c = encode(sym, n_syms);
  bool clean = false;
  EXPECT_EQ(decode_by_definition(c, &clean), sym);
  EXPECT_TRUE(clean);
  for (SimdLevel level : levels()) {
    EXPECT_EQ(decode(c, level, tile, &clean), sym) << "level " << static_cast<int>(level);
    EXPECT_TRUE(clean) << "level " << static_cast<int>(level);
  }
}

TEST(Rans, EveryAlphabetSizeRoundTrips) {
  for (uint32_t n_syms = 2; n_syms <= 256; ++n_syms) {
    SCOPED_TRACE(n_syms);
    expect_round_trip(skewed_symbols(2000 + n_syms, n_syms, n_syms), n_syms, 1000);
  }
}

TEST(Rans, EdgeLengths) {
  for (uint32_t n : {0u, 1u, 2u, 31u, 32u, 33u, 63u, 64u, 65u, 1023u, 1057u}) {
    SCOPED_TRACE(n);
    expect_round_trip(skewed_symbols(n, 16, n), 16);
    expect_round_trip(skewed_symbols(n, 200, n), 200);
  }
}

TEST(Rans, SingleSymbolTableCostsNothing) {
  const std::vector<uint8_t> sym(1000, 5);
  const Coded c = encode(sym, 6);
  EXPECT_EQ(c.freq[5], kProbScale);
  EXPECT_TRUE(c.words.empty());
  for (uint32_t j = 0; j < kLanes; ++j) {
    uint32_t x;
    std::memcpy(&x, c.states + 4 * j, 4);
    EXPECT_EQ(x, kLower);
  }
  expect_round_trip(sym, 6);
}

TEST(Rans, FrequencyOneSymbols) {
  // 255 symbols seen once among 200k: each gets frequency 1, the rest goes to symbol 0.
  std::vector<uint8_t> sym(200000, 0);
  for (uint32_t s = 1; s < 256; ++s) sym[s * 701] = static_cast<uint8_t>(s);
  const Coded c = encode(sym, 256);
  for (uint32_t s = 1; s < 256; ++s) EXPECT_EQ(c.freq[s], 1u);
  expect_round_trip(sym, 256, 777);
}

TEST(Rans, LargeBlocksAndIrregularTiles) {
  const uint32_t n = 1u << 20;
  expect_round_trip(skewed_symbols(n, 16, 11), 16, 4096);
  expect_round_trip(skewed_symbols(n + 17, 256, 12), 256, 1000);
  expect_round_trip(skewed_symbols(n - 5, 4, 13), 4, 33);
}

TEST(Rans, SimdAndScalarAgreeOnUniformData) {
  // Near-uniform data consumes about one word per symbol: the SIMD loop's bounds matter most.
  std::mt19937_64 rng(5);
  for (uint32_t bits = 1; bits <= 8; ++bits) {
    std::vector<uint8_t> sym(70000);
    for (auto& s : sym) s = static_cast<uint8_t>(rng() % (1u << bits));
    expect_round_trip(sym, 1u << bits, 4096);
  }
}

TEST(Rans, CorruptWordsAndStatesAreDetected) {
  const std::vector<uint8_t> sym = skewed_symbols(5000, 16, 21);
  const Coded good = encode(sym, 16);
  ASSERT_GT(good.words.size(), 100u);
  std::mt19937_64 rng(9);
  for (int trial = 0; trial < 200; ++trial) {
    Coded bad = good;
    if (trial % 2) {
      bad.words[rng() % bad.words.size()] ^= static_cast<uint16_t>(1u << (rng() % 16));
    } else {
      bad.states[rng() % sizeof bad.states] ^= static_cast<uint8_t>(1u << (rng() % 8));
    }
    const std::vector<SimdLevel> all = levels();
    bool clean = true;
    decode(bad, all[static_cast<size_t>(trial) % all.size()], 4096, &clean);
    EXPECT_FALSE(clean) << trial;
  }
  Coded short_stream = good;
  short_stream.words.pop_back();
  for (SimdLevel level : levels()) {
    bool clean = true;
    decode(short_stream, level, 4096, &clean);
    EXPECT_FALSE(clean);
  }
}

TEST(Rans, NormalizationInvariants) {
  std::mt19937_64 rng(17);
  for (int trial = 0; trial < 500; ++trial) {
    const uint32_t n_syms = 1 + static_cast<uint32_t>(rng() % 256);
    std::vector<uint32_t> counts(n_syms);
    for (auto& c : counts) c = rng() % 3 == 0 ? 0 : static_cast<uint32_t>(rng() % (trial % 2 ? 5 : 1000000));
    counts[rng() % n_syms] += 1;
    std::vector<uint16_t> freq(n_syms);
    ASSERT_TRUE(normalize_frequencies(counts.data(), n_syms, freq.data()));
    uint32_t sum = 0;
    for (uint32_t s = 0; s < n_syms; ++s) {
      sum += freq[s];
      EXPECT_EQ(counts[s] > 0, freq[s] > 0) << s;
    }
    EXPECT_EQ(sum, kProbScale);
  }
  const uint32_t zeros[4] = {0, 0, 0, 0};
  uint16_t f[4];
  EXPECT_FALSE(normalize_frequencies(zeros, 4, f));
}

// The compare-count lookup (GPU, AVX2) and the slot table (scalar, wide alphabets) agree for
// every slot of every table shape, absent symbols included.
TEST(Rans, CompareCountEqualsSlotTable) {
  std::mt19937_64 rng(23);
  for (int trial = 0; trial < 300; ++trial) {
    const uint32_t n_syms = 1 + static_cast<uint32_t>(rng() % 16);
    std::vector<uint32_t> counts(n_syms);
    for (auto& c : counts) c = rng() % 3 == 0 ? 0 : static_cast<uint32_t>(rng() % 1000);
    counts[rng() % n_syms] += 1;
    std::vector<uint16_t> freq(n_syms), cum(n_syms + 1);
    ASSERT_TRUE(normalize_frequencies(counts.data(), n_syms, freq.data()));
    DecodeTable t;
    ASSERT_TRUE(build_decode_table(freq.data(), n_syms, 4, &t));
    ASSERT_TRUE(build_cumulative(freq.data(), n_syms, cum.data()));
    for (uint32_t slot = 0; slot < kProbScale; ++slot) {
      const uint32_t y = symbol_by_count(slot, cum.data(), n_syms);
      ASSERT_EQ(y, t.lut[slot]) << slot;
      ASSERT_GT(freq[y], 0u);
    }
  }
}

TEST(Rans, DecodeTableRejectsBadTables) {
  DecodeTable t;
  const uint16_t short_sum[2] = {2000, 2000};
  EXPECT_FALSE(build_decode_table(short_sum, 2, 1, &t));
  const uint16_t ok[3] = {1000, 3000, 96};
  EXPECT_FALSE(build_decode_table(ok, 3, 1, &t));  // 3 entries do not fit 1 bit
  EXPECT_TRUE(build_decode_table(ok, 3, 2, &t));
  EXPECT_FALSE(build_decode_table(ok, 0, 2, &t));
  const uint16_t huge[2] = {65535, 65535};
  EXPECT_FALSE(build_decode_table(huge, 2, 1, &t));
}

TEST(Rans, EncoderRefusesSymbolsOutsideTheTable) {
  const uint16_t freq[2] = {4096, 0};
  uint16_t cum[3];
  ASSERT_TRUE(build_cumulative(freq, 2, cum));
  const uint8_t sym[3] = {0, 1, 0};
  uint16_t stack[3];
  EncodedBlock eb;
  EXPECT_FALSE(encode_block(sym, 3, freq, cum, 2, stack, 3, &eb));
  const uint8_t big[1] = {7};
  EXPECT_FALSE(encode_block(big, 1, freq, cum, 2, stack, 3, &eb));
}

}  // namespace
}  // namespace kdn::kernels::rans
