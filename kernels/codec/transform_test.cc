// Transform coding (docs/codec.md §10): calibration, round trips, the calibration a blob names,
// and damaged calibrations and blobs. Small geometries only: every case runs in milliseconds.
#include "calibration_test_util.h"
#include "codec_test_util.h"
#include "crc32c.h"
#include "encode_transform.h"

#include <kdn/kernels/codec_transform.h>

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace kdn::kernels {
namespace {

using testing::geometry;
using testing::geometry_bytes;
using testing::kTestFingerprint;

// Rows with what transform coding exploits and the synthetic generator lacks: each head's
// rows mix D/4 latent factors (fixed per model: `model_seed`) with falling scales, plus a little
// noise; the factors drift along tokens. `seed` picks the chunk's own factor values.
std::vector<uint8_t> correlated_chunk(const ChunkGeometry& g, uint64_t seed, uint64_t model_seed = 1) {
  std::vector<uint8_t> c(geometry_bytes(g));
  const uint32_t d = g.head_dim, k = std::max(1u, d / 4);
  std::mt19937_64 model(model_seed), rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t p = 0; p < 2; ++p)
      for (uint32_t h = 0; h < g.kv_heads; ++h) {
        std::vector<float> mix(size_t{k} * d), a(k, 0.0f);
        for (float& m : mix) m = normal(model);
        for (uint32_t t = 0; t < g.tokens; ++t) {
          for (uint32_t f = 0; f < k; ++f) a[f] = 0.8f * a[f] + 0.6f * normal(rng);
          for (uint32_t j = 0; j < d; ++j) {
            float x = 0.02f * normal(rng);
            for (uint32_t f = 0; f < k; ++f) x += a[f] * mix[size_t{f} * d + j] / static_cast<float>(1 + f);
            store_f32(c.data(), chunk_offset(g, l, p, t, h, j), g.dtype, x, 1.0f);
          }
        }
      }
  return c;
}

// A calibration learnt from `n` correlated chunks of g (seeds seed..), kept with its view.
struct Calibrated {
  std::vector<uint8_t> bytes;
  Kvc1Calibration view;
};

Calibrated calibrate(const ChunkGeometry& g, uint32_t n, uint64_t seed = 100, kdn_key fp = kTestFingerprint,
                     uint64_t model_seed = 1) {
  std::vector<std::vector<uint8_t>> chunks;
  std::vector<Kvc1CalibrationSample> samples;
  for (uint32_t i = 0; i < n; ++i) chunks.push_back(correlated_chunk(g, seed + i, model_seed));
  for (uint32_t i = 0; i < n; ++i) samples.push_back({chunks[i].data(), int64_t{i} * g.tokens});
  Calibrated c;
  c.bytes.resize(kvc1_calibration_bytes(g));
  size_t written = 0;
  EXPECT_TRUE(kvc1_calibrate(g, fp, samples, c.bytes.data(), c.bytes.size(), &written).ok());
  EXPECT_EQ(written, c.bytes.size());
  EXPECT_TRUE(kvc1_calibration_open(c.bytes.data(), c.bytes.size(), &c.view).ok());
  return c;
}

CodecConfig transform_config(const Kvc1Calibration& cal, double bits) {
  CodecConfig c;
  c.mode = CodecMode::kTransform;
  c.calibration = &cal;
  c.transform_mean_bits = bits;
  return c;
}

Status decode(const std::vector<uint8_t>& blob, const ChunkGeometry& g, const Kvc1Calibration* cal,
              std::vector<uint8_t>& out, bool crc = true) {
  out.assign(geometry_bytes(g), 0);
  DecodeOptions o;
  o.calibration = cal;
  o.verify_crc = crc;
  return kvc1_decode(blob.data(), blob.size(), g, kTestFingerprint, out.data(), out.size(), o);
}

TEST(Transform, CalibrationAxesAreOrthonormalAndSorted) {
  const ChunkGeometry g = geometry(1, 2, 16, 64);
  const Calibrated c = calibrate(g, 2);
  EXPECT_EQ(c.view.samples, 2u * 64u - 4u);  // the sequence's first chunk leaves its sinks out
  for (uint32_t p = 0; p < 2; ++p) {
    const float* head = kvc1::calibration_head(c.view, 0, p, 1);
    for (uint32_t i = 0; i + 1 < 16; ++i) EXPECT_GE(head[16 + i], head[16 + i + 1]);
    for (uint32_t i = 0; i < 16; ++i)
      for (uint32_t j = 0; j < 16; ++j) {
        double dot = 0;
        for (uint32_t k = 0; k < 16; ++k) dot += double{head[32 + i * 16 + k]} * head[32 + j * 16 + k];
        EXPECT_NEAR(dot, i == j ? 1.0 : 0.0, 1e-5);
      }
  }
  Calibrated again = calibrate(g, 2);
  EXPECT_EQ(again.bytes, c.bytes);  // deterministic, so the id names the content
}

TEST(Transform, WidthsFollowVarianceWithinBudget) {
  const std::vector<uint8_t> obj = testing::identity_calibration(1, 2, 32, kTestFingerprint);
  Kvc1Calibration cal;
  ASSERT_TRUE(kvc1_calibration_open(obj.data(), obj.size(), &cal).ok());
  std::vector<double> var(64);
  std::vector<uint8_t> w(64);
  for (double bits : {0.5, 1.0, 2.0, 3.5}) {
    kvc1::allot_widths(cal, 0, 0, bits, var.data(), w.data());
    uint32_t total = 0;
    for (uint32_t i = 0; i < 64; ++i) total += w[i];
    EXPECT_LE(total, std::llround(bits * 64)) << bits;
    EXPECT_GE(total, std::llround(bits * 64) * 9 / 10) << bits;
    for (uint32_t i = 0; i + 1 < 32; ++i) EXPECT_GE(w[i], w[i + 1]);  // variances fall along the axes
    EXPECT_EQ(w[0], w[32]);                                           // equal heads, equal widths
  }
}

TEST(Transform, RoundTripErrorFallsWithBitsAndBeatsKivi2AtItsSize) {
  const ChunkGeometry g = geometry(2, 2, 32, 64);
  const Calibrated cal = calibrate(g, 4);
  const std::vector<uint8_t> chunk = correlated_chunk(g, 7);
  CodecConfig kivi2 = testing::config(CodecMode::kKivi2);
  kivi2.pos_base = 64;
  const std::vector<uint8_t> kb = testing::encode(g, chunk.data(), kivi2);
  std::vector<uint8_t> out;
  ASSERT_TRUE(decode(kb, g, nullptr, out).ok());
  const CodecQuality kq = kvc1_quality(g, chunk.data(), out.data(), kb.size());
  double previous = 1e9;
  for (double bits : {1.0, 2.0, 3.0, 4.0}) {
    CodecConfig c = transform_config(cal.view, bits);
    c.pos_base = 64;
    const std::vector<uint8_t> blob = testing::encode(g, chunk.data(), c);
    ASSERT_TRUE(decode(blob, g, &cal.view, out).ok()) << bits;
    const CodecQuality q = kvc1_quality(g, chunk.data(), out.data(), blob.size());
    EXPECT_LT(q.rel_frobenius_error, previous) << bits;
    previous = q.rel_frobenius_error;
    if (q.ratio_vs_fp16 >= kq.ratio_vs_fp16) {
      EXPECT_LT(q.rel_frobenius_error, kq.rel_frobenius_error) << bits;
    }
    Kvc1Info info;
    ASSERT_TRUE(kvc1_inspect(blob.data(), blob.size(), &info).ok());
    EXPECT_EQ(info.version_minor, 4);
    EXPECT_EQ(info.mode, CodecMode::kTransform);
    EXPECT_TRUE(info.calibration_id == cal.view.id);
  }
  EXPECT_LT(previous, 0.03);  // 4 bits
}

TEST(Transform, SinkAndRecentRowsAreExactInEveryDtype) {
  for (DType dt : {DType::kF16, DType::kBF16, DType::kF32}) {
    const ChunkGeometry g = geometry(1, 2, 32, 48, dt);
    const Calibrated cal = calibrate(g, 2);
    const std::vector<uint8_t> chunk = testing::synthetic_chunk(g, 9);
    CodecConfig c = transform_config(cal.view, 2.0);
    c.ends_context = true;
    c.recent_tokens = 8;
    std::vector<uint8_t> out;
    ASSERT_TRUE(decode(testing::encode(g, chunk.data(), c), g, &cal.view, out).ok());
    const size_t row = size_t{g.head_dim} * dtype_size(dt);
    for (uint32_t p = 0; p < 2; ++p)
      for (uint32_t t : {0u, 3u, 40u, 47u})
        for (uint32_t h = 0; h < 2; ++h) {
          const size_t at = chunk_offset(g, 0, p, t, h, 0) * dtype_size(dt);
          EXPECT_EQ(std::memcmp(out.data() + at, chunk.data() + at, row), 0) << t;
        }
    EXPECT_NE(std::memcmp(out.data(), chunk.data(), out.size()), 0);  // the other rows are coded
  }
}

TEST(Transform, BlobNeedsTheCalibrationItWasCodedWith) {
  const ChunkGeometry g = geometry(1, 2, 32, 32);
  const Calibrated cal = calibrate(g, 2), other = calibrate(g, 2, 500, kTestFingerprint, 2);
  const std::vector<uint8_t> chunk = testing::synthetic_chunk(g);
  const std::vector<uint8_t> blob = testing::encode(g, chunk.data(), transform_config(cal.view, 2.0));
  std::vector<uint8_t> out;
  EXPECT_EQ(decode(blob, g, nullptr, out).code(), Code::kNotFound);
  EXPECT_EQ(decode(blob, g, &other.view, out).code(), Code::kNotFound);
  EXPECT_TRUE(decode(blob, g, &cal.view, out).ok());
  // A calibration of another model neither encodes nor decodes.
  const Calibrated foreign = calibrate(g, 2, 100, kdn_key{1, 2});
  const CodecConfig fc = transform_config(foreign.view, 2.0);
  std::vector<uint8_t> buf(kvc1_max_encoded_size(g, fc)), scratch(kvc1_encode_scratch_bytes(g, fc));
  size_t written = 0;
  EXPECT_EQ(kvc1_encode(g, kTestFingerprint, chunk.data(), fc, buf.data(), buf.size(), &written, scratch.data(),
                        scratch.size())
                .code(),
            Code::kInvalidArgument);
  // The fused and GPU paths do not take transform planes yet: they say so.
  EngineView view{};
  EXPECT_EQ(kvc1_decode_scatter(blob.data(), blob.size(), g, kTestFingerprint, view, nullptr).code(),
            Code::kUnsupported);
}

TEST(Transform, DamagedCalibrationIsRefused) {
  const ChunkGeometry g = geometry(1, 1, 8, 16);
  const Calibrated cal = calibrate(g, 2);
  Kvc1Calibration v;
  for (size_t i = 0; i < cal.bytes.size(); ++i)
    for (uint8_t bit : {0x01, 0x80}) {
      std::vector<uint8_t> bad = cal.bytes;
      bad[i] ^= bit;
      const Status s = kvc1_calibration_open(bad.data(), bad.size(), &v);
      EXPECT_TRUE(s.code() == Code::kCorrupt || s.code() == Code::kVersion) << i;
    }
  for (size_t len : {size_t{0}, size_t{63}, size_t{64}, cal.bytes.size() - 4})
    EXPECT_EQ(kvc1_calibration_open(cal.bytes.data(), len, &v).code(), Code::kCorrupt) << len;
}

TEST(Transform, MutatedBlobsAreRefusedOrDecodeSafely) {
  const ChunkGeometry g = geometry(1, 2, 32, 48);
  const Calibrated cal = calibrate(g, 2);
  const std::vector<uint8_t> chunk = testing::synthetic_chunk(g, 3);
  CodecConfig c = transform_config(cal.view, 2.5);
  c.ends_context = true;
  const std::vector<uint8_t> blob = testing::encode(g, chunk.data(), c);
  std::mt19937_64 rng(11);
  std::vector<uint8_t> out;
  for (int i = 0; i < 600; ++i) {
    std::vector<uint8_t> bad = blob;
    const size_t at = rng() % bad.size();
    bad[at] ^= static_cast<uint8_t>(1u << (rng() % 8));
    EXPECT_FALSE(decode(bad, g, &cal.view, out).ok()) << at;  // every flip breaks a CRC
    (void)decode(bad, g, &cal.view, out, /*crc=*/false);      // structural checks only: a status, no crash
  }
  for (size_t len : {size_t{100}, blob.size() / 2, blob.size() - 16}) {
    std::vector<uint8_t> cut(blob.begin(), blob.begin() + static_cast<ptrdiff_t>(len));
    EXPECT_FALSE(decode(cut, g, &cal.view, out).ok()) << len;
  }
}

}  // namespace
}  // namespace kdn::kernels
