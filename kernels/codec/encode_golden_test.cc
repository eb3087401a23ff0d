// Encoder goldens: the exact bytes the encoder writes for every mode and every option that
// changes a choice (exact rows, rotation, scale dtype, groups, per-layer widths, predictor,
// entropy, dtypes, partial rANS steps and blocks). The expectations were taken from the
// reference encoder before its hot paths were vectorized; a faster encoder must reproduce
// them byte for byte. If a deliberate change of the encoder's choices moves one, regenerate
// it and say why in the commit (golden_test.cc holds the decoder to the format).
#include "codec_test_util.h"
#include "crc32c.h"
#include "quant.h"
#include "rans.h"

#include <kdn/kernels/codec.h>
#include <kdn/kernels/dtype.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

namespace kdn::kernels {
namespace {

using testing::geometry;
using testing::geometry_bytes;

// Integer-hash bell noise in [-2, 2).
float bell(uint32_t x) {
  x = (x ^ (x >> 15)) * 0x2c1b3c6du;
  x = (x ^ (x >> 12)) * 0x297a2d39u;
  x ^= x >> 15;
  const int32_t b = static_cast<int32_t>((x & 255) + ((x >> 8) & 255) + ((x >> 16) & 255) + (x >> 24)) - 510;
  return static_cast<float>(b) / 256.0f;
}

// A fixed input from integer arithmetic only: per (head, channel) either a slow triangle
// wave along tokens with a little noise (token-wise locality: the predictor's channels) or
// plain noise (every channel with `noisy`: the predictor is weighed and dropped), a per-channel offset, one outlier
// channel per head, and a spread of magnitudes over layers (exponent variety for the byte planes).
std::vector<uint8_t> mixed_chunk(const ChunkGeometry& g, uint32_t seed, bool noisy) {
  std::vector<uint8_t> c(geometry_bytes(g));
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t p = 0; p < 2; ++p)
      for (uint32_t t = 0; t < g.tokens; ++t)
        for (uint32_t h = 0; h < g.kv_heads; ++h)
          for (uint32_t d = 0; d < g.head_dim; ++d) {
            const uint32_t key =
                (seed * 40503u + l * 7919u + p * 104729u + h * 1299709u + d * 15485863u) ^ (t * 2654435761u);
            const bool smooth = !noisy && (d * 7 + h + p) % 3 != 0;
            const int32_t phase = static_cast<int32_t>((t + 5 * d + 11 * h) % 64);
            const float wave = static_cast<float>(phase < 32 ? phase : 64 - phase) / 16.0f - 1.0f;
            const float v = smooth ? wave + bell(key) / 16.0f : bell(key);
            const float outlier = d == 5 + h ? 12.0f : 1.0f;
            const float layer_gain = static_cast<float>(1u << (l % 4)) * 0.25f;
            store_f32(c.data(), chunk_offset(g, l, p, t, h, d), g.dtype,
                      (v + 0.01f * static_cast<float>(d)) * outlier * layer_gain, 1.0f);
          }
  return c;
}

struct Case {
  const char* name;
  bool noisy;
  CodecMode mode;
  DType dtype;
  uint32_t heads, dim, tokens;
  void (*tweak)(CodecConfig&);
  size_t bytes;
  uint32_t crc;
};

const uint8_t kLayerBitsK[2] = {3, 8};
const uint8_t kLayerBitsV[2] = {6, 2};

void none(CodecConfig&) {}
void sinks(CodecConfig& c) { c.pos_base = 0; }
void tail(CodecConfig& c) { c.ends_context = true; }
void sinks_tail(CodecConfig& c) { c.pos_base = 0, c.ends_context = true; }
void rotate(CodecConfig& c) { c.rotate = true; }
void f32_scales(CodecConfig& c) { c.f32_scales = true; }
void packed(CodecConfig& c) { c.entropy = false; }
void no_delta(CodecConfig& c) { c.token_delta = false; }
void groups(CodecConfig& c) { c.k_group_tokens = 32, c.v_group_channels = 16; }
void layer_bits(CodecConfig& c) { c.layer_k_bits = kLayerBitsK, c.layer_v_bits = kLayerBitsV; }
void blocks(CodecConfig& c) { c.block_tokens = 37; }
void bits_3_5(CodecConfig& c) { c.k_bits = 3, c.v_bits = 5; }

constexpr DType kF16 = DType::kF16, kBF16 = DType::kBF16, kF32 = DType::kF32;
constexpr CodecMode kRaw = CodecMode::kRaw, kLossless = CodecMode::kLossless, kInt8 = CodecMode::kInt8,
                    kKivi4 = CodecMode::kKivi4, kKivi2 = CodecMode::kKivi2;

// Two layers; 100 tokens leave a partial 32-symbol rANS step at head_dim 36 and partial
// blocks with block_tokens 37.
const Case kCases[] = {
    {"raw", false, kRaw, kF16, 2, 64, 100, none, 102720, 0x3503ae6a},
    {"lossless", false, kLossless, kF16, 2, 64, 100, none, 90944, 0x78896511},
    {"lossless_bf16", false, kLossless, kBF16, 2, 64, 100, none, 72160, 0x06975ed7},
    {"lossless_f32", false, kLossless, kF32, 2, 64, 100, none, 147248, 0x3e3fd55b},
    {"lossless_d36", false, kLossless, kF16, 3, 36, 100, none, 80512, 0x29029921},
    {"lossless_blocks", false, kLossless, kF16, 2, 64, 100, blocks, 92720, 0x48f5c5f6},
    {"int8", false, kInt8, kF16, 2, 64, 100, none, 51488, 0x57b8c5e0},
    {"int8_bf16", false, kInt8, kBF16, 2, 64, 100, none, 51488, 0x6503af21},
    {"int8_f32", false, kInt8, kF32, 2, 64, 100, none, 51488, 0x0dafca47},
    {"int8_sinks_tail", false, kInt8, kF16, 2, 64, 100, sinks_tail, 73872, 0xc8ace2ba},
    {"int8_rotate", false, kInt8, kF16, 2, 64, 100, rotate, 53744, 0x9bfbaf9b},
    {"int8_d128", false, kInt8, kF16, 2, 128, 130, none, 121680, 0x1fcadd3b},
    {"kivi4", false, kKivi4, kF16, 2, 64, 100, none, 23936, 0xebc5f187},
    {"kivi4_d128", false, kKivi4, kF16, 2, 128, 300, none, 130272, 0x2f214d82},
    {"kivi4_d36", false, kKivi4, kF16, 3, 36, 100, none, 21712, 0x259906df},
    {"kivi4_d16", false, kKivi4, kF16, 2, 16, 100, none, 8768, 0x0bb997f9},
    {"kivi4_bf16", false, kKivi4, kBF16, 2, 64, 100, none, 23936, 0x2e1a4322},
    {"kivi4_f32", false, kKivi4, kF32, 2, 64, 100, none, 23936, 0x9a71dceb},
    {"kivi4_sinks", false, kKivi4, kF16, 2, 64, 100, sinks, 27760, 0x52a6b197},
    {"kivi4_tail", false, kKivi4, kF16, 2, 64, 100, tail, 50448, 0xfb76c1f0},
    {"kivi4_sinks_tail", false, kKivi4, kF16, 2, 64, 100, sinks_tail, 54320, 0x0ce4caca},
    {"kivi4_rotate", false, kKivi4, kF16, 2, 64, 100, rotate, 25008, 0xd5af7103},
    {"kivi4_f32_scales", false, kKivi4, kF16, 2, 64, 100, f32_scales, 26560, 0xeb4e5c65},
    {"kivi4_packed", false, kKivi4, kF16, 2, 64, 100, packed, 28736, 0x0de2dc5a},
    {"kivi4_no_delta", false, kKivi4, kF16, 2, 64, 100, no_delta, 28688, 0xd82c947d},
    {"kivi4_groups", false, kKivi4, kF16, 2, 64, 100, groups, 33376, 0xe57c76e7},
    {"kivi4_layer_bits", false, kKivi4, kF16, 2, 64, 100, layer_bits, 30208, 0x1d0a2562},
    {"kivi4_blocks", false, kKivi4, kF16, 2, 64, 100, blocks, 25312, 0xf167b974},
    {"kivi4_bits_3_5", false, kKivi4, kF16, 2, 64, 100, bits_3_5, 24416, 0xb27b142a},
    {"kivi2", false, kKivi2, kF16, 2, 64, 100, none, 12976, 0x93a78f5e},
    {"kivi2_sinks_tail", false, kKivi2, kF16, 2, 64, 100, sinks_tail, 46960, 0x50b74ada},
    {"lossless_noisy", true, kLossless, kF16, 2, 64, 100, none, 90080, 0x5b614e03},
    {"int8_noisy", true, kInt8, kF16, 2, 64, 100, none, 54912, 0x4d92557c},
    {"kivi4_noisy", true, kKivi4, kF16, 2, 64, 100, none, 28464, 0x4e37493e},
    {"kivi2_noisy", true, kKivi2, kF16, 2, 64, 100, none, 15056, 0xa48c1221},
    {"kivi2_packed", false, kKivi2, kF16, 2, 64, 100, packed, 15936, 0x97fd9bf5},
};

// CRC of the blob without the header CRC field (a CRC over a message followed by its own CRC
// is a constant, which would hide header differences).
uint32_t blob_crc(const std::vector<uint8_t>& blob) {
  return kvc1::crc32c_extend(kvc1::crc32c(blob.data(), 124), blob.data() + 128, blob.size() - 128);
}

// How the segments of a blob are coded: packed, rANS, rANS with the token-delta predictor.
struct Codings {
  uint32_t packed = 0, rans = 0, delta = 0;
};

Codings count_codings(const std::vector<uint8_t>& blob) {
  Codings n;
  kvc1::Header h;
  if (kvc1::parse_header(blob.data(), blob.size(), &h) != kvc1::kParseOk) return n;
  for (uint32_t l = 0; l < h.layers; ++l) {
    kvc1::Plane pl[2];
    if (kvc1::locate_planes(blob.data(), h, l, pl) != kvc1::kParseOk) return n;
    for (const kvc1::Plane& p : pl)
      for (uint32_t s = 0; s < kvc1::expected_segments(h, p.codec); ++s) {
        kvc1::Segment sg;
        if (kvc1::parse_segment(blob.data(), h, p, s, &sg) != kvc1::kParseOk) continue;
        if (sg.coding == kvc1::kCodingPacked)
          ++n.packed;
        else if (sg.predictor)
          ++n.delta;
        else
          ++n.rans;
      }
  }
  return n;
}

void expect_frozen_bytes() {
  uint32_t packed = 0, rans = 0, delta = 0;
  for (const Case& c : kCases) {
    const ChunkGeometry g = geometry(2, c.heads, c.dim, c.tokens, c.dtype);
    const std::vector<uint8_t> chunk = mixed_chunk(g, c.dim + c.tokens, c.noisy);
    CodecConfig cfg;
    cfg.mode = c.mode;
    cfg.pos_base = 4096;
    c.tweak(cfg);
    const std::vector<uint8_t> blob = testing::encode(g, chunk.data(), cfg);
    ASSERT_FALSE(blob.empty()) << c.name;
    std::vector<uint8_t> out(geometry_bytes(g));
    ASSERT_TRUE(kvc1_decode(blob.data(), blob.size(), g, testing::kTestFingerprint, out.data(), out.size()).ok())
        << c.name;
    EXPECT_EQ(blob.size(), c.bytes) << c.name;
    EXPECT_EQ(blob_crc(blob), c.crc) << c.name;
    const Codings k = count_codings(blob);
    packed += k.packed, rans += k.rans, delta += k.delta;
    if (blob.size() != c.bytes || blob_crc(blob) != c.crc)
      std::printf("    {\"%s\", ..., %zu, 0x%08x},\n", c.name, blob.size(), blob_crc(blob));
  }
  // The inputs reach every segment coding the encoder chooses between.
  EXPECT_GT(packed, 0u);
  EXPECT_GT(rans, 0u);
  EXPECT_GT(delta, 0u);
}

TEST(EncodeGolden, EveryModeAndOptionWritesTheFrozenBytes) { expect_frozen_bytes(); }

// The scalar rANS loop and the scalar row quantizers write the same bytes as the vector ones.
TEST(EncodeGolden, ScalarLoopsWriteTheFrozenBytes) {
  const rans::SimdLevel was = rans::set_simd_level(rans::SimdLevel::kScalar);
  const bool rows = kvc1::set_dequantize_simd_enabled(false);
  expect_frozen_bytes();
  kvc1::set_dequantize_simd_enabled(rows);
  rans::set_simd_level(was);
}

}  // namespace
}  // namespace kdn::kernels
