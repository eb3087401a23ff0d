// Golden values: freeze the KVC1 format and the encoder's choices. If a change to the decoder
// breaks FrozenBlobDecodesAndReencodes' decode, old blobs on disk would decode differently:
// bump the format version (docs/codec.md) instead. If only the encoder's choices change (same
// format, different but valid bytes), the encode expectations may be regenerated.
#include "codec_test_util.h"
#include "crc32c.h"

#include <kdn/kernels/codec.h>
#include <kdn/kernels/dtype.h>

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kdn::kernels {
namespace {

using testing::geometry;
using testing::geometry_bytes;

// A fixed input from integer arithmetic only (no generator whose output could drift):
// bell-shaped noise (a sum of four hash bytes), an optional slow triangle wave along tokens
// (token-wise locality), a per-channel offset and one outlier channel per head.
std::vector<uint8_t> golden_chunk(const ChunkGeometry& g, bool noisy) {
  std::vector<uint8_t> c(geometry_bytes(g));
  auto* v = reinterpret_cast<uint16_t*>(c.data());
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t p = 0; p < 2; ++p)
      for (uint32_t t = 0; t < g.tokens; ++t)
        for (uint32_t h = 0; h < g.kv_heads; ++h)
          for (uint32_t d = 0; d < g.head_dim; ++d) {
            uint32_t x = (l * 7919u + p * 104729u + h * 1299709u + d * 15485863u) ^ (t * 2654435761u);
            x = (x ^ (x >> 15)) * 0x2c1b3c6du;
            x = (x ^ (x >> 12)) * 0x297a2d39u;
            const int32_t bell =
                static_cast<int32_t>((x & 255) + ((x >> 8) & 255) + ((x >> 16) & 255) + (x >> 24)) - 510;
            const int32_t phase = static_cast<int32_t>((t + 5 * d + 11 * h) % 64);
            const float wave = static_cast<float>(phase < 32 ? phase : 64 - phase) / 16.0f - 1.0f;
            const float noise = static_cast<float>(bell) / (noisy ? 256.0f : 2048.0f);
            const float outlier = (d == 5 + h) ? 12.0f : 1.0f;
            const float x_val = (noisy ? noise : wave + noise) + 0.01f * static_cast<float>(d);
            v[chunk_offset(g, l, p, t, h, d)] = f32_to_f16(x_val * outlier);
          }
  return c;
}

struct Golden {
  bool noisy;
  CodecMode mode;
  size_t bytes;
  uint32_t blob_crc;
  uint32_t decoded_crc;
};

// Frozen for geometry (layers 2, heads 2, head_dim 32, tokens 96, f16), default configs plus
// pos_base 1024 and 48-token rANS blocks. The noisy input takes the packed paths (and rANS
// for lossless high bytes); the smooth one rANS with the token-delta predictor everywhere.
constexpr Golden kGolden[] = {
    {true, CodecMode::kRaw, 49472, 0x48da913e, 0x9ab20a7b},
    {true, CodecMode::kLossless, 45648, 0x55866006, 0x9ab20a7b},
    {true, CodecMode::kInt8, 28160, 0x8c5ff65e, 0x5c95e3a2},
    {true, CodecMode::kKivi4, 14848, 0xdabad7e0, 0x07aa78d1},
    {true, CodecMode::kKivi2, 8704, 0x87129a52, 0x1e6d3a89},
    {false, CodecMode::kLossless, 46224, 0x77aa793e, 0x41da3c2e},
    {false, CodecMode::kInt8, 27680, 0x86ced22f, 0x07f9d31a},
    {false, CodecMode::kKivi4, 11104, 0x48241ef8, 0xcf1a4821},
    {false, CodecMode::kKivi2, 7056, 0xa1c10fe6, 0x8b6fd3a9},
};

TEST(Golden, EncodedBytesAndDecodedValuesAreFrozen) {
  const ChunkGeometry g = geometry(2, 2, 32, 96);
  for (const Golden& gold : kGolden) {
    const std::vector<uint8_t> chunk = golden_chunk(g, gold.noisy);
    CodecConfig cfg;
    cfg.mode = gold.mode;
    cfg.pos_base = 1024;
    cfg.block_tokens = 48;  // two rANS blocks per segment
    const std::vector<uint8_t> blob = testing::encode(g, chunk.data(), cfg);
    std::vector<uint8_t> out(geometry_bytes(g));
    ASSERT_TRUE(kvc1_decode(blob.data(), blob.size(), g, testing::kTestFingerprint, out.data(), out.size()).ok());
    // Skip the header CRC field: a CRC over a message followed by its own CRC is a constant,
    // which would hide header differences.
    const uint32_t blob_crc = kvc1::crc32c_extend(kvc1::crc32c(blob.data(), 124), blob.data() + 128, blob.size() - 128);
    const uint32_t out_crc = kvc1::crc32c(out.data(), out.size());
    EXPECT_EQ(blob.size(), gold.bytes) << codec_mode_name(gold.mode);
    EXPECT_EQ(blob_crc, gold.blob_crc) << codec_mode_name(gold.mode);
    EXPECT_EQ(out_crc, gold.decoded_crc) << codec_mode_name(gold.mode);
  }
}

// A small kivi4 blob (layers 1, heads 1, head_dim 32, tokens 40, 20-token blocks; rANS with the
// token-delta predictor) kept as bytes, so the decoder is held to the format even if the
// encoder's choices change.
constexpr const char* kFrozenBlobHex =
    "4b444e4b564331000100000080000000f006000000000000efcdab89674523011032547698badcfe0000000000000000"
    "000000000000000028000000010000000100000020000000010314000000000000000000000000008000000000000000"
    "2000000047fc354900000000000000000000000000000000000000006f2a82e1a0000000000000005006000000000000"
    "53725f3a0203040400000000000000000204010028000000010000008000000090020000000000000000000000000000"
    "d1305a2f4a2d242e3d2f773e5f30e52f452fc72d4c2e233088302030092fc02d3f2e12305b305d30522f0c2e122e0c2f"
    "353074303230842e202d202fb82f2c30ffbc14ba16b4ffb536b9e5c98bbb82bb1fbc67bbfbba3fbbc8bb3fba04b8c6ae"
    "fdb295b97abaa0bacfb96ebabdbab9b9feb906ba12b9aab4ae2746b50bb745b910000000800200000000000000000000"
    "01041000000500000200000001000000ffffffff0000000000000000000000005905e603360123000c00000003000300"
    "06000300060003000c0036001901e9034e00000050010000e110c724f521ff24d1f101008b2a0200ab1a7c00bb0a2998"
    "3d3bde12ea7d7900e54a1d00d41a0f00b8fa2c02a26a852f1cdaa103a816ca0094860101c594050079ea2104b08a2800"
    "b63a6fb5675bed052f5e26037c9cac4bc25a0700a94aec1f9d3a917ca9c91d0180338402435a19e54575984aa49ac965"
    "abba2800c66a040048000000f0010000d1f138001436cb030559b205645b1a0bb9a0da29d2100d00d390a3000e11460e"
    "891dfa01853d0d0096d5e0535bd76c00a92618005ed428006a648b12065208000d1bd1001fb5c00ec9cf17002dbe8001"
    "5cb33c005d353b11d8a0570175e941006c085b0104f50609a1f75500338f4400851a770da7bb92142d4d8e416babcb07"
    "491555b6c8c770a97e142cebb512b48e1158bbc9129179d84a5ec7f498f3210067ce1af60ad6f665450f2fe852094264"
    "ba509bdc3b2b0e8a6c3b5bdfb888bd94df26280c63a8b83cd982deb958121c5824e105b035569de6a6c72f5454063d01"
    "78be4be0aa107ee67784f5b1bff4ebe5dc8ec55e543f48b270f653e8e30d9b56633b984ec6810166f8a829dfcca40c2f"
    "a2a264da891710b4c444d6c700000000c11dbd2ce39472339511367f74cf3d13303083f14596fe5c9f422037ce589e65"
    "1bd7b59773cb0657c3ff50b95a4e7baf35ef2c53ef9e8cdec397adb71459e581d28ce4ce122be3f405ba2d0ed40a899c"
    "b722bca2f2d13e6dedf059457a15a2ef05b48c18c7c50fb4ce9d4bc5ff4cc5ddec04a0622a57014020665dbf49138b76"
    "6a0d593efe1bf774fe2440ba5a0b68db030401002000000001000000a00000005e020000000000000000000000000000"
    "043883388f38033972390a3a9d3b763b2c3b653b253afb391d3963382539ea3796363c35be33fe343e36f63248304531"
    "af30ef304b300a347335c63642378a380e38f838f1373e39383ae9398c3a673b3bbb65bb90bb52bae0ba64ba2cbaacba"
    "1cba5ebb43bb03bb22bba9ba70badcbabfba04bb69ba5abb47bbc5bac4baf1baf3bba6bb66ba78c1fac32ac5a4c542c7"
    "76c613c83ac645c83dc9efc894c96cca100000004e020000000000000000000001041000000500000200000001000000"
    "ffffffff000000000000000000000000df080603c000790036001c000c00130006000000000003000300160046000902"
    "2f000000500100008698ae20e07b3d0051ba36571dfc690516ac28286d8e08002bfd20eedb2c0500de1cc3027d6c1d16"
    "8cbc05431c0bd8009c27310045a806009999101e7cdcf103eceb8200c85c4e00bbec944543ad2ae8482d3300d22c8c23"
    "fb2c17990a6c40c0139a0100ddebd95d6c800100415b3b009c5ca8005dac1c09134d0a002edd67004f000000b0010000"
    "78e72abd7b4e4107398fdb516bbf412c5c7f6c0065a35f3a7d2e2900b8934d000b8e070224777b0026574a004fe6ed00"
    "ac548e0848e402007f0e02004a1f2e03810e4f002c7f3514cc2f7d5550e1513831405b0c36f633022b1b7a003e0f8400"
    "a63e0200927e3402da2e0e009afefc11fa2dd70ae47e8a09885f0201da3dde00f82171df3645cc6b6823f2377e8b23af"
    "7e1e8df07bcb3ac84f89ce8f9555a27f3614e87060655fc87600bd0e7ed275909b1a4e47eb640c59a4afa7431fb6fee0"
    "f4aaa743c59e34ebeb7438d4b6e23cc353ec2379886af42a500b36491ef3000009ed7e6c4d5d9ffc54ad687d6b5d11ed"
    "d77c875ea7fdc93dae9df48df5222eb856c0a7bda05dd80d87691cea78bcfe792cfc167cb06cab9cf55c52ddc3bbf711"
    "e7bdf84f9ccdca2f1e4ae97e728e6cca842eaa86570c8f5d888d7875844d5101030a8788d62a6c19e0a1edd8c393d1e4"
    "c74ebfb2408417f46ddb444bc566938267720b444ac2b224b7e0735937497b8273cfe0f7ebef104ef573104e580a0000";
constexpr uint32_t kFrozenDecodedCrc = 0xf69b3457;

std::vector<uint8_t> from_hex(const char* hex) {
  std::vector<uint8_t> out;
  for (const char* p = hex; p[0] && p[1]; p += 2)
    out.push_back(static_cast<uint8_t>(std::stoul(std::string(p, 2), nullptr, 16)));
  return out;
}

TEST(Golden, FrozenBlobDecodesAndReencodes) {
  const ChunkGeometry g = geometry(1, 1, 32, 40);
  const std::vector<uint8_t> frozen = from_hex(kFrozenBlobHex);
  std::vector<uint8_t> out(geometry_bytes(g));
  ASSERT_TRUE(kvc1_decode(frozen.data(), frozen.size(), g, testing::kTestFingerprint, out.data(), out.size()).ok());
  EXPECT_EQ(kvc1::crc32c(out.data(), out.size()), kFrozenDecodedCrc);
  CodecConfig cfg;
  cfg.block_tokens = 20;
  cfg.sink_tokens = 0;  // the frozen blob is minor 0: no exact rows
  EXPECT_EQ(testing::encode(g, golden_chunk(g, false).data(), cfg), frozen);
}

}  // namespace
}  // namespace kdn::kernels
