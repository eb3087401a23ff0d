// RoPE re-positioning against float64 references: inv_freq formulas, delta algebra, pairings,
// partial rotary, and rope_scatter on every layout.
#include <kdn/kernels/ops.h>
#include <kdn/kernels/rope.h>

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <vector>

#include "test_support.h"

namespace kdn::kernels {
namespace {

using testing::EngineBuffers;

std::vector<float> inv_freq_of(const RopeConfig& cfg) {
  std::vector<float> inv(rotary_dim_of(cfg) / 2);
  EXPECT_TRUE(compute_inv_freq(cfg, inv.data(), inv.size()).ok());
  return inv;
}

// One table row per delta.
std::vector<float> table_for(const std::vector<float>& inv, uint32_t rotary_dim, const std::vector<int64_t>& deltas) {
  std::vector<float> t(rope_table_floats(static_cast<uint32_t>(deltas.size()), rotary_dim));
  EXPECT_TRUE(
      build_rope_table(inv.data(), rotary_dim, deltas.data(), static_cast<uint32_t>(deltas.size()), t.data(), t.size())
          .ok());
  return t;
}

// float64 rotation of one head row by `pos` (exact cos/sin of pos * inv_freq).
void rotate_f64(std::vector<double>& row, RopeStyle style, uint32_t rotary_dim, const std::vector<float>& inv,
                double pos) {
  for (uint32_t i = 0; i < rotary_dim / 2; ++i) {
    const uint32_t a = style == RopeStyle::kNeox ? i : 2 * i;
    const uint32_t b = style == RopeStyle::kNeox ? i + rotary_dim / 2 : 2 * i + 1;
    const double phi = pos * static_cast<double>(inv[i]);
    const double x = row[a], y = row[b];
    row[a] = x * std::cos(phi) - y * std::sin(phi);
    row[b] = y * std::cos(phi) + x * std::sin(phi);
  }
}

struct RopeFixture {
  ChunkGeometry g{2, 2, 64, 9, DType::kF32};
  RopeConfig cfg;
  std::vector<float> inv;
  std::vector<uint8_t> k;  // pre-RoPE chunk (both planes random)

  explicit RopeFixture(RopeStyle style, uint32_t rotary_dim = 0) {
    cfg.style = style;
    cfg.head_dim = g.head_dim;
    cfg.rotary_dim = rotary_dim;
    cfg.theta = 500000.0;
    inv = inv_freq_of(cfg);
    k = testing::random_chunk(g, 42);
  }
  uint32_t r() const { return rotary_dim_of(cfg); }
  // Rotates `chunk` in place by one delta for every token.
  void rotate(std::vector<uint8_t>& chunk, int64_t delta, RopeStyle style) const {
    const std::vector<float> t = table_for(inv, r(), {delta});
    RopeTable rt{style, r(), t.data(), 0};
    ASSERT_TRUE(rope_chunk(chunk.data(), g, rt, Executor::cpu()).ok());
  }
  float at(const std::vector<uint8_t>& c, uint32_t l, uint32_t t, uint32_t h, uint32_t d) const {
    return load_f32(c.data(), chunk_offset(g, l, 0, t, h, d), g.dtype, 1.0f);
  }
  double row_norm(uint32_t l, uint32_t t, uint32_t h) const {
    double s = 0;
    for (uint32_t d = 0; d < g.head_dim; ++d) s += std::pow(at(k, l, t, h, d), 2);
    return std::sqrt(s);
  }
  // max over K rows of max|a - b| / ||k row||.
  double max_rel_diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) const {
    double worst = 0;
    for (uint32_t l = 0; l < g.layers; ++l)
      for (uint32_t t = 0; t < g.tokens; ++t)
        for (uint32_t h = 0; h < g.kv_heads; ++h)
          for (uint32_t d = 0; d < g.head_dim; ++d) {
            worst = std::max(worst, std::fabs(double{at(a, l, t, h, d)} - at(b, l, t, h, d)) / row_norm(l, t, h));
          }
    return worst;
  }
  // Max relative distance of `c` from k rotated by `pos` in float64.
  double error_vs_f64(const std::vector<uint8_t>& c, double pos, RopeStyle style) const {
    double worst = 0;
    for (uint32_t l = 0; l < g.layers; ++l)
      for (uint32_t t = 0; t < g.tokens; ++t)
        for (uint32_t h = 0; h < g.kv_heads; ++h) {
          std::vector<double> row(g.head_dim);
          for (uint32_t d = 0; d < g.head_dim; ++d) row[d] = at(k, l, t, h, d);
          rotate_f64(row, style, r(), inv, pos);
          for (uint32_t d = 0; d < g.head_dim; ++d) {
            worst = std::max(worst, std::fabs(at(c, l, t, h, d) - row[d]) / row_norm(l, t, h));
          }
        }
    return worst;
  }
};

TEST(Rope, InvFreqPlainAndLinear) {
  RopeConfig cfg{RopeStyle::kNeox, 128, 0, 10000.0, RopeScaling::kNone, {}};
  const std::vector<float> plain = inv_freq_of(cfg);
  cfg.scaling = RopeScaling::kLinear;
  cfg.scaling_params[0] = 4.0f;
  const std::vector<float> linear = inv_freq_of(cfg);
  for (uint32_t i = 0; i < 64; ++i) {
    EXPECT_EQ(plain[i], static_cast<float>(std::pow(10000.0, -(2.0 * i) / 128.0))) << i;
    EXPECT_EQ(linear[i], static_cast<float>(std::pow(10000.0, -(2.0 * i) / 128.0) / 4.0)) << i;
  }
}

TEST(Rope, InvFreqLlama3BandsAndInterpolation) {
  // Llama-3.1-8B: theta 500000, factor 8, low_freq_factor 1, high_freq_factor 4, original 8192.
  RopeConfig cfg{RopeStyle::kNeox, 128, 0, 500000.0, RopeScaling::kLlama3, {8.0f, 1.0f, 4.0f, 8192.0f}};
  const std::vector<float> got = inv_freq_of(cfg);
  int kept = 0, divided = 0, blended = 0;
  for (uint32_t i = 0; i < 64; ++i) {
    const double base = std::pow(500000.0, -(2.0 * i) / 128.0);
    const double wavelen = 2 * std::numbers::pi / base;
    double want;
    if (wavelen < 8192.0 / 4.0) {
      want = base, ++kept;
    } else if (wavelen > 8192.0 / 1.0) {
      want = base / 8.0, ++divided;
    } else {
      const double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
      want = (1 - smooth) * base / 8.0 + smooth * base, ++blended;
    }
    EXPECT_EQ(got[i], static_cast<float>(want)) << i;
  }
  EXPECT_GT(kept, 0);  // all three bands are exercised
  EXPECT_GT(divided, 0);
  EXPECT_GT(blended, 0);
}

TEST(Rope, InvFreqYarnRampAndMscale) {
  // Qwen2.5-style YaRN: factor 4, original 32768, beta_fast 32, beta_slow 1, theta 1e6.
  RopeConfig cfg{RopeStyle::kNeox, 128, 0, 1000000.0, RopeScaling::kYarn, {4.0f, 32768.0f, 0.0f, 0.0f}};
  const std::vector<float> got = inv_freq_of(cfg);
  const double dim = 128, theta = 1e6, orig = 32768;
  auto corr = [&](double rot) { return dim * std::log(orig / (rot * 2 * std::numbers::pi)) / (2 * std::log(theta)); };
  const double low = std::max(std::floor(corr(32)), 0.0), high = std::min(std::ceil(corr(1)), dim - 1);
  ASSERT_LT(low, high);
  for (uint32_t i = 0; i < 64; ++i) {
    const double extra = std::pow(theta, -(2.0 * i) / dim), inter = extra / 4.0;
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double want = inter * ramp + extra * (1 - ramp);
    EXPECT_EQ(got[i], static_cast<float>(want)) << i;
    if (i <= low) {
      EXPECT_EQ(got[i], static_cast<float>(extra)) << i;  // fast dims extrapolate
    }
    if (i >= high) {
      EXPECT_EQ(got[i], static_cast<float>(inter)) << i;  // slow dims interpolate
    }
  }
  EXPECT_NEAR(yarn_mscale(4.0), 0.1 * std::log(4.0) + 1.0, 1e-15);
  EXPECT_EQ(yarn_mscale(1.0), 1.0);
}

TEST(Rope, ConfigFromModelDescriptor) {
  kdn_model_desc d{};
  d.head_dim = 128;
  d.rope_style = KDN_ROPE_GPTJ;
  d.rope_theta = 500000.0;
  d.rope_scaling = KDN_ROPE_SCALING_LLAMA3;
  const float params[4] = {8.0f, 1.0f, 4.0f, 8192.0f};
  std::copy(params, params + 4, d.rope_scaling_params);
  RopeConfig cfg;
  ASSERT_TRUE(rope_config_from_desc(d, &cfg).ok());
  EXPECT_EQ(cfg.style, RopeStyle::kGptj);
  EXPECT_EQ(rotary_dim_of(cfg), 128u);
  EXPECT_EQ(cfg.scaling, RopeScaling::kLlama3);
  EXPECT_EQ(cfg.scaling_params[3], 8192.0f);
  d.rope_style = KDN_ROPE_NONE;
  EXPECT_EQ(rope_config_from_desc(d, &cfg).code(), Code::kUnsupported);
  d.rope_style = KDN_ROPE_NEOX;
  d.rope_scaling = 7;
  EXPECT_FALSE(rope_config_from_desc(d, &cfg).ok());
}

TEST(Rope, InvalidConfigsAreRejected) {
  float inv[64];
  RopeConfig odd{RopeStyle::kNeox, 64, 63, 10000.0, RopeScaling::kNone, {}};
  EXPECT_FALSE(compute_inv_freq(odd, inv, 64).ok());
  RopeConfig wide{RopeStyle::kNeox, 64, 128, 10000.0, RopeScaling::kNone, {}};
  EXPECT_FALSE(compute_inv_freq(wide, inv, 64).ok());
  RopeConfig no_factor{RopeStyle::kNeox, 64, 0, 10000.0, RopeScaling::kLlama3, {}};
  EXPECT_FALSE(compute_inv_freq(no_factor, inv, 64).ok());
  RopeConfig nan_theta{RopeStyle::kNeox, 64, 0, NAN, RopeScaling::kNone, {}};
  EXPECT_FALSE(compute_inv_freq(nan_theta, inv, 64).ok());
  const int64_t huge = int64_t{1} << 41;
  float table[64];
  EXPECT_FALSE(build_rope_table(inv, 64, &huge, 1, table, 64).ok());
  const int64_t one = 1;
  EXPECT_FALSE(build_rope_table(inv, 64, &one, 1, table, 63).ok());
}

TEST(Rope, DeltaRotationEqualsDirectRotation) {
  for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kGptj}) {
    for (auto [p0, p1] : {std::pair<int64_t, int64_t>{0, 17}, {100, 5}, {3000, 131072}, {131072, 0}, {7, -131072}}) {
      RopeFixture f(style);
      std::vector<uint8_t> via_delta = f.k, direct = f.k;
      f.rotate(via_delta, p0, style);
      f.rotate(via_delta, p1 - p0, style);
      f.rotate(direct, p1, style);
      EXPECT_LE(f.max_rel_diff(via_delta, direct), 1e-5) << p0 << " -> " << p1;
      EXPECT_LE(f.error_vs_f64(via_delta, static_cast<double>(p1), style), 1e-5) << p0 << " -> " << p1;
    }
  }
}

TEST(Rope, DeltaThenMinusDeltaIsIdentity) {
  RopeFixture f(RopeStyle::kNeox);
  std::vector<uint8_t> c = f.k;
  f.rotate(c, 4321, RopeStyle::kNeox);
  f.rotate(c, -4321, RopeStyle::kNeox);
  EXPECT_LE(f.max_rel_diff(c, f.k), 1e-6);
}

TEST(Rope, DeltasCompose) {
  RopeFixture f(RopeStyle::kGptj);
  std::vector<uint8_t> two_steps = f.k, one_step = f.k;
  f.rotate(two_steps, 1000, RopeStyle::kGptj);
  f.rotate(two_steps, -37, RopeStyle::kGptj);
  f.rotate(one_step, 963, RopeStyle::kGptj);
  EXPECT_LE(f.max_rel_diff(two_steps, one_step), 1e-6);
}

TEST(Rope, MixingNeoxAndGptjFails) {
  RopeFixture f(RopeStyle::kNeox);
  std::vector<uint8_t> mixed = f.k, matched = f.k;
  f.rotate(mixed, 500, RopeStyle::kNeox);
  f.rotate(mixed, -500, RopeStyle::kGptj);
  f.rotate(matched, 500, RopeStyle::kNeox);
  f.rotate(matched, -500, RopeStyle::kNeox);
  EXPECT_LE(f.max_rel_diff(matched, f.k), 1e-6);
  EXPECT_GT(f.max_rel_diff(mixed, f.k), 0.1);
  // And a GPT-J rotation is far from the float64 NeoX rotation.
  std::vector<uint8_t> wrong = f.k;
  f.rotate(wrong, 500, RopeStyle::kGptj);
  EXPECT_GT(f.error_vs_f64(wrong, 500.0, RopeStyle::kNeox), 0.1);
}

TEST(Rope, PartialRotaryLeavesTailChannelsAndPreservesPairNorms) {
  RopeFixture f(RopeStyle::kNeox, 32);
  std::vector<uint8_t> c = f.k;
  f.rotate(c, 999, RopeStyle::kNeox);
  EXPECT_LE(f.error_vs_f64(c, 999.0, RopeStyle::kNeox), 1e-6);
  for (uint32_t l = 0; l < f.g.layers; ++l)
    for (uint32_t t = 0; t < f.g.tokens; ++t)
      for (uint32_t h = 0; h < f.g.kv_heads; ++h) {
        for (uint32_t d = 32; d < f.g.head_dim; ++d) ASSERT_EQ(f.at(c, l, t, h, d), f.at(f.k, l, t, h, d));
        for (uint32_t i = 0; i < 16; ++i) {
          const double before = std::hypot(f.at(f.k, l, t, h, i), f.at(f.k, l, t, h, i + 16));
          const double after = std::hypot(f.at(c, l, t, h, i), f.at(c, l, t, h, i + 16));
          ASSERT_NEAR(after, before, 1e-6 * before + 1e-30);
        }
      }
  // V is never rotated.
  for (uint32_t l = 0; l < f.g.layers; ++l) {
    const size_t at = chunk_offset(f.g, l, 1, 0, 0, 0) * 4, n = size_t{f.g.tokens} * f.g.kv_heads * f.g.head_dim * 4;
    ASSERT_EQ(0, memcmp(c.data() + at, f.k.data() + at, n));
  }
}

// YaRN: the engine's K at position p is mscale * R(p) k. Delta rotation maps K(p0) to K(p1)
// exactly; "un-rotate with the engine's scaled cos/sin, re-rotate" multiplies by mscale^2.
TEST(Rope, DeltaIsCorrectUnderYarnWhereCompositeIsNot) {
  RopeConfig cfg{RopeStyle::kNeox, 64, 0, 1000000.0, RopeScaling::kYarn, {4.0f, 32768.0f, 0.0f, 0.0f}};
  const std::vector<float> inv = inv_freq_of(cfg);
  const double m = yarn_mscale(4.0);
  CounterRng rng(3);
  std::vector<double> k(64);
  for (double& x : k) x = rng.next_normal();
  auto engine_k = [&](double pos) {
    std::vector<double> r = k;
    rotate_f64(r, RopeStyle::kNeox, 64, inv, pos);
    for (double& x : r) x *= m;
    return r;
  };
  const std::vector<double> k0 = engine_k(100), k1 = engine_k(2100);
  const ChunkGeometry g{1, 1, 64, 1, DType::kF32};
  std::vector<float> chunk(128, 0.0f);
  for (int d = 0; d < 64; ++d) chunk[d] = static_cast<float>(k0[d]);
  const std::vector<float> t = table_for(inv, 64, {2000});
  ASSERT_TRUE(rope_chunk(chunk.data(), g, RopeTable{RopeStyle::kNeox, 64, t.data(), 0}, Executor::cpu()).ok());
  std::vector<double> composite = k0;  // un-rotate by scaled cos/sin of 100, rotate by those of 2100
  rotate_f64(composite, RopeStyle::kNeox, 64, inv, -100);
  rotate_f64(composite, RopeStyle::kNeox, 64, inv, 2100);
  double delta_err = 0, composite_err = 0, norm = 0;
  for (int d = 0; d < 64; ++d) {
    delta_err = std::max(delta_err, std::fabs(chunk[d] - k1[d]));
    composite_err = std::max(composite_err, std::fabs(composite[d] * m * m - k1[d]));
    norm += k1[d] * k1[d];
  }
  EXPECT_LE(delta_err, 1e-5 * std::sqrt(norm));
  EXPECT_GT(composite_err, 0.05 * std::sqrt(norm));
}

TEST(Rope, RopeScatterEqualsElementBodiesOnEveryLayout) {
  const PagedShape shape{2, 2, 32, 6, 4, DType::kF16};
  RopeConfig cfg{RopeStyle::kNeox, 32, 0, 10000.0, RopeScaling::kNone, {}};
  uint64_t seed = 300;
  for (EngineLayoutKind kind : kAllEngineLayouts)
    for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kGptj})
      for (uint32_t rotary : {32u, 16u})
        for (auto [chunk_dtype, engine_dtype] : {std::pair{DType::kF16, DType::kF16},
                                                 {DType::kBF16, DType::kBF16},
                                                 {DType::kF16, DType::kBF16},
                                                 {DType::kF32, DType::kFP8E4M3}})
          for (uint32_t per_token : {0u, 1u}) {
            SCOPED_TRACE(::testing::Message() << engine_layout_name(kind) << " style " << static_cast<int>(style)
                                              << " R " << rotary << " dtypes " << static_cast<int>(chunk_dtype) << "->"
                                              << static_cast<int>(engine_dtype) << " per_token " << per_token);
            cfg.style = style;
            cfg.rotary_dim = rotary;
            const std::vector<float> inv = inv_freq_of(cfg);
            CounterRng rng(++seed);
            const ChunkGeometry g{2, 2, 32, 21, chunk_dtype};
            std::vector<int64_t> deltas(per_token ? g.tokens : 1);
            for (int64_t& d : deltas) d = static_cast<int64_t>(rng.next_below(200000)) - 100000;
            const std::vector<float> t = table_for(inv, rotary, deltas);
            const RopeTable rt{style, rotary, t.data(), per_token};
            const std::vector<uint8_t> src = testing::random_chunk(g, seed);
            const std::vector<int64_t> slots = testing::random_slots(rng, g.tokens, 6, 4, 10);
            const bool permute = kind == EngineLayoutKind::kLlamaCppRows;
            PagedShape s = shape;
            s.dtype = engine_dtype;
            EngineBuffers fast, ref;
            ASSERT_TRUE(fast.init(kind, s, permute).ok());
            ASSERT_TRUE(ref.init(kind, s, permute).ok());
            fast.view.slot_mapping = ref.view.slot_mapping = slots.data();
            fast.view.scale[0] = ref.view.scale[0] = 0.25f;
            ASSERT_TRUE(rope_scatter(src.data(), g, fast.view, rt, Executor::cpu()).ok());
            testing::reference_rope_scatter(src.data(), g, ref.view, rt);
            ASSERT_TRUE(fast == ref);
          }
}

TEST(Rope, LargeRopeScatterEqualsElementBodies) {
  for (DType dt : {DType::kF16, DType::kBF16}) {
    const ChunkGeometry g{2, 8, 128, 1024, dt};  // 8 MiB: streaming stores
    RopeConfig cfg{RopeStyle::kNeox, 128, 0, 500000.0, RopeScaling::kNone, {}};
    const std::vector<float> inv = inv_freq_of(cfg);
    const std::vector<float> t = table_for(inv, 128, {12345});
    const RopeTable rt{RopeStyle::kNeox, 128, t.data(), 0};
    const std::vector<uint8_t> src = testing::random_chunk(g, 88);
    CounterRng rng(89);
    const PagedShape shape{2, 8, 128, 70, 16, dt};
    const std::vector<int64_t> slots = testing::random_slots(rng, g.tokens, shape.num_blocks, shape.block_size, 5);
    EngineBuffers fast, ref;
    ASSERT_TRUE(fast.init(EngineLayoutKind::kVllmFlashNhd, shape, false).ok());
    ASSERT_TRUE(ref.init(EngineLayoutKind::kVllmFlashNhd, shape, false).ok());
    fast.view.slot_mapping = ref.view.slot_mapping = slots.data();
    ASSERT_TRUE(rope_scatter(src.data(), g, fast.view, rt, Executor::cpu()).ok());
    testing::reference_rope_scatter(src.data(), g, ref.view, rt);
    EXPECT_TRUE(fast == ref) << "dtype " << static_cast<int>(dt);
  }
}

// One rounding: rope_scatter f16 -> f16/bf16 is within one ulp of the float64 rotation of the
// (exact) f16 input, plus the fp32 arithmetic's error (relative 1e-6 of the row norm).
TEST(Rope, RopeScatterIsWithinOneUlpOfFloat64) {
  for (DType dt : {DType::kF16, DType::kBF16}) {
    RopeConfig cfg{RopeStyle::kNeox, 64, 0, 500000.0, RopeScaling::kNone, {}};
    const std::vector<float> inv = inv_freq_of(cfg);
    const ChunkGeometry g{1, 2, 64, 16, DType::kF16};
    std::vector<int64_t> deltas(g.tokens);
    for (uint32_t t = 0; t < g.tokens; ++t) deltas[t] = static_cast<int64_t>(t) * 8191 - 50000;
    const std::vector<float> table = table_for(inv, 64, deltas);
    const std::vector<uint8_t> src = testing::random_chunk(g, 77);
    EngineBuffers eng;
    ASSERT_TRUE(eng.init(EngineLayoutKind::kVllmFlashNhd, PagedShape{1, 2, 64, 4, 4, dt}, false).ok());
    ASSERT_TRUE(
        rope_scatter(src.data(), g, eng.view, RopeTable{RopeStyle::kNeox, 64, table.data(), 1}, Executor::cpu()).ok());
    const int mant_bits = dt == DType::kF16 ? 10 : 7;
    for (uint32_t t = 0; t < g.tokens; ++t)
      for (uint32_t h = 0; h < g.kv_heads; ++h) {
        std::vector<double> row(64);
        double norm = 0;
        for (uint32_t d = 0; d < 64; ++d) {
          row[d] = load_f32(src.data(), chunk_offset(g, 0, 0, t, h, d), g.dtype, 1.0f);
          norm += row[d] * row[d];
        }
        rotate_f64(row, RopeStyle::kNeox, 64, inv, static_cast<double>(deltas[t]));
        for (uint32_t d = 0; d < 64; ++d) {
          const float got = load_f32(eng.k[0].data(), engine_element(eng.view, 0, t, h, d), dt, 1.0f);
          const double ulp = std::ldexp(1.0, std::ilogb(std::max(std::fabs(row[d]), 1e-30)) - mant_bits);
          ASSERT_LE(std::fabs(got - row[d]), ulp + 1e-6 * std::sqrt(norm)) << "t " << t << " d " << d;
        }
      }
  }
}

}  // namespace
}  // namespace kdn::kernels
