// Golden values of transform coding: freeze the calibration object, the transform blobs and
// what they decode to. If the decode CRC changes, blobs on disk would decode differently: bump
// the format's minor version (docs/codec.md §10) instead. If only the encoder's or the
// calibration's choices change, the expectations may be regenerated (and the id changes with
// the calibration's bytes, as it must).
#include "codec_test_util.h"
#include "crc32c.h"

#include <kdn/kernels/codec_transform.h>
#include <kdn/kernels/dtype.h>

#include <gtest/gtest.h>

#include <vector>

namespace kdn::kernels {
namespace {

using testing::geometry;
using testing::geometry_bytes;

// Integer hash in [-510, 510] with a bell shape (a sum of four bytes).
int32_t bell(uint32_t x) {
  x = (x ^ (x >> 15)) * 0x2c1b3c6du;
  x = (x ^ (x >> 12)) * 0x297a2d39u;
  x ^= x >> 15;
  return static_cast<int32_t>((x & 255) + ((x >> 8) & 255) + ((x >> 16) & 255) + (x >> 24)) - 510;
}

// Correlated rows from integer arithmetic only: four latent factors per (layer, plane, head),
// mixed into the channels with fixed weights, drifting along tokens, plus small noise.
std::vector<uint8_t> golden_rows(const ChunkGeometry& g, uint32_t chunk) {
  std::vector<uint8_t> c(geometry_bytes(g));
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t p = 0; p < 2; ++p)
      for (uint32_t h = 0; h < g.kv_heads; ++h)
        for (uint32_t t = 0; t < g.tokens; ++t)
          for (uint32_t d = 0; d < g.head_dim; ++d) {
            const uint32_t head = l * 131u + p * 17u + h * 7u;
            const uint32_t tt = chunk * g.tokens + t;
            float x = static_cast<float>(bell(head * 2654435761u ^ tt * 40503u ^ d * 97u)) / 8192.0f;
            for (uint32_t f = 0; f < 4; ++f) {
              const float weight = static_cast<float>(bell(head * 7919u + f * 104729u + d * 15485863u)) / 256.0f;
              const float factor = static_cast<float>(bell(head * 31u + f * 1299709u + (tt / 8) * 3571u)) / 256.0f;
              x += weight * factor / static_cast<float>(1 + f);
            }
            store_f32(c.data(), chunk_offset(g, l, p, t, h, d), g.dtype, x, 1.0f);
          }
  return c;
}

uint32_t crc_skipping_header_crc(const std::vector<uint8_t>& blob) {
  return kvc1::crc32c_extend(kvc1::crc32c(blob.data(), 124), blob.data() + 128, blob.size() - 128);
}

struct Golden {
  double bits;
  bool ends_context;
  size_t bytes;
  uint32_t blob_crc, decoded_crc;
};

// Geometry (layers 2, heads 2, head_dim 32, tokens 96, f16); calibrated on chunks 0..2 (chunk 0
// at position 0); the blobs code chunk 3 at position 1024 with 48-token rANS blocks.
constexpr uint32_t kCalibrationCrc = 0xbc1cdade;
constexpr Golden kGolden[] = {
    {1.0, false, 5552, 0x53186338, 0x52980ed0},
    {2.0, false, 10944, 0xaddc7004, 0xc83eb5f4},
    {3.0, true, 25904, 0xa4bc461a, 0x49a9624c},
};

TEST(TransformGolden, CalibrationBlobsAndDecodedValuesAreFrozen) {
  const ChunkGeometry g = geometry(2, 2, 32, 96);
  std::vector<std::vector<uint8_t>> chunks;
  std::vector<Kvc1CalibrationSample> samples;
  for (uint32_t i = 0; i < 3; ++i) chunks.push_back(golden_rows(g, i));
  for (uint32_t i = 0; i < 3; ++i) samples.push_back({chunks[i].data(), int64_t{i} * 96});
  std::vector<uint8_t> obj(kvc1_calibration_bytes(g));
  size_t written = 0;
  ASSERT_TRUE(kvc1_calibrate(g, testing::kTestFingerprint, samples, obj.data(), obj.size(), &written).ok());
  EXPECT_EQ(kvc1::crc32c(obj.data(), obj.size()), kCalibrationCrc);
  Kvc1Calibration cal;
  ASSERT_TRUE(kvc1_calibration_open(obj.data(), obj.size(), &cal).ok());
  const std::vector<uint8_t> chunk = golden_rows(g, 3);
  for (const Golden& gold : kGolden) {
    CodecConfig cfg;
    cfg.mode = CodecMode::kTransform;
    cfg.calibration = &cal;
    cfg.transform_mean_bits = gold.bits;
    cfg.pos_base = 1024;
    cfg.ends_context = gold.ends_context;
    cfg.block_tokens = 48;
    const std::vector<uint8_t> blob = testing::encode(g, chunk.data(), cfg);
    std::vector<uint8_t> out(geometry_bytes(g));
    DecodeOptions o;
    o.calibration = &cal;
    ASSERT_TRUE(kvc1_decode(blob.data(), blob.size(), g, testing::kTestFingerprint, out.data(), out.size(), o).ok());
    EXPECT_EQ(blob.size(), gold.bytes) << gold.bits;
    EXPECT_EQ(crc_skipping_header_crc(blob), gold.blob_crc) << gold.bits;
    EXPECT_EQ(kvc1::crc32c(out.data(), out.size()), gold.decoded_crc) << gold.bits;
  }
}

}  // namespace
}  // namespace kdn::kernels
