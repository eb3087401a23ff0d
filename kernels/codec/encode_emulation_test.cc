// The CUDA encoder's stages (encode_device.h) run on the CPU, one unit after another, over the
// scratch layout the launcher uses: the blob must equal kvc1_encode's byte for byte in every
// quantized mode and option. encode_gpu_test.cc repeats the comparison on a real device.
#include "codec_test_util.h"
#include "encode_device_plan.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace kdn::kernels {
namespace {

using testing::geometry;
using testing::kTestFingerprint;

// Runs every stage of a one-chunk batch; *error receives the device result word.
std::vector<uint8_t> emulate_encode(const ChunkGeometry& g, const std::vector<uint8_t>& chunk, const CodecConfig& cfg,
                                    uint32_t* error, uint32_t place_threads = 3) {
  using namespace kvc1;
  EncodeJob job;
  std::vector<DevicePlaneSpec> specs(2 * g.layers);
  uint64_t bytes = 0;
  EXPECT_TRUE(plan_device_encode(g, kTestFingerprint, cfg, 1, nullptr, &job, specs.data(), &bytes).ok());
  std::vector<uint64_t> scratch(bytes / 8 + 2);
  auto* base = reinterpret_cast<uint8_t*>(scratch.data());
  EXPECT_TRUE(plan_device_encode(g, kTestFingerprint, cfg, 1, base, &job, specs.data(), &bytes).ok());
  std::vector<uint8_t> out(kvc1_max_encoded_size(g, cfg), 0);
  const uint8_t* chunk_ptr = chunk.data();
  uint8_t* out_ptr = out.data();
  std::memcpy(const_cast<const uint8_t**>(job.chunks), &chunk_ptr, 8);
  std::memcpy(const_cast<uint8_t**>(job.outs), &out_ptr, 8);
  std::memcpy(const_cast<DevicePlaneSpec*>(job.specs), specs.data(), sizeof(DevicePlaneSpec) * specs.size());
  *job.error = 0;
  for (uint32_t lp = 0; lp < 2 * g.layers; ++lp) enc_params(job, 0, lp);
  for (uint32_t lp = 0; lp < 2 * g.layers; ++lp)
    for (uint32_t h = 0; h < g.kv_heads; ++h) enc_segment(job, 0, lp, h);
  enc_layout(job, 0);
  for (uint32_t lp = 0; lp < 2 * g.layers; ++lp)
    for (uint32_t t = 0; t < place_threads; ++t) enc_place(job, 0, lp, t, place_threads);
  uint32_t table[256];
  for (uint32_t b = 0; b < 256; ++b) table[b] = crc32c_table_entry(b);
  for (uint32_t l = 0; l < g.layers; ++l) enc_layer_crc(job, table, 0, l);
  enc_header(job, table, 0);
  *error = *job.error;
  out.resize(job.written[0] <= out.size() ? job.written[0] : 0);
  return out;
}

void expect_same_blob(const ChunkGeometry& g, const std::vector<uint8_t>& chunk, const CodecConfig& c,
                      const char* what) {
  uint32_t error = 0;
  const std::vector<uint8_t> dev = emulate_encode(g, chunk, c, &error);
  ASSERT_EQ(error, 0u) << what;
  const std::vector<uint8_t> cpu = testing::encode(g, chunk.data(), c);
  ASSERT_EQ(dev.size(), cpu.size()) << what;
  EXPECT_TRUE(dev == cpu) << what;
}

TEST(EncodeEmulation, DeviceStagesEqualCpuEncoder) {
  const ChunkGeometry shapes[] = {geometry(2, 2, 64, 48), geometry(1, 1, 32, 37, DType::kBF16),
                                  geometry(1, 1, 40, 20, DType::kF32), geometry(1, 1, 7, 9), geometry(1, 2, 128, 256)};
  const CodecMode modes[] = {CodecMode::kInt8, CodecMode::kKivi4, CodecMode::kKivi2};
  for (const ChunkGeometry& g : shapes) {
    const std::vector<uint8_t> chunk = testing::synthetic_chunk(g, 21);
    for (CodecMode m : modes) {
      for (int variant = 0; variant < 6; ++variant) {
        CodecConfig c = testing::config(m);
        c.entropy = variant != 1;
        c.token_delta = variant != 2;
        c.rotate = variant == 3 && (g.head_dim & (g.head_dim - 1)) == 0;
        c.f32_scales = variant == 4;
        c.block_tokens = variant == 5 ? 16 : 0;  // several blocks, the last one partial
        if (variant == 5) {
          c.ends_context = true;
          c.recent_tokens = 5;
        }
        if (variant == 2) c.pos_base = 100;  // no sink rows
        expect_same_blob(g, chunk, c, codec_mode_name(m));
      }
    }
  }
}

TEST(EncodeEmulation, PerLayerWidthsAndTheLlamaShape) {
  const ChunkGeometry g = geometry(3, 2, 128, 64);
  const std::vector<uint8_t> chunk = testing::synthetic_chunk(g, 5);
  const uint8_t kb[3] = {8, 4, 2}, vb[3] = {3, 5, 1};
  CodecConfig c = testing::config(CodecMode::kKivi4);
  c.layer_k_bits = kb;
  c.layer_v_bits = vb;
  expect_same_blob(g, chunk, c, "per-layer widths");
}

TEST(EncodeEmulation, NonFiniteValuesAreAnError) {
  const ChunkGeometry g = geometry(1, 1, 32, 16);
  std::vector<uint8_t> chunk = testing::synthetic_chunk(g, 3);
  const uint16_t inf = 0x7c00;
  std::memcpy(chunk.data() + 2 * 40, &inf, 2);
  uint32_t error = 0;
  emulate_encode(g, chunk, testing::config(CodecMode::kKivi4), &error);
  EXPECT_EQ(error & kvc1::kEncErrorNonFinite, kvc1::kEncErrorNonFinite);
}

TEST(EncodeEmulation, RawAndLosslessAreNotDeviceModes) {
  const ChunkGeometry g = geometry(1, 1, 32, 16);
  kvc1::EncodeJob job;
  std::vector<kvc1::DevicePlaneSpec> specs(2);
  uint64_t bytes = 0;
  for (CodecMode m : {CodecMode::kRaw, CodecMode::kLossless})
    EXPECT_EQ(kvc1::plan_device_encode(g, kTestFingerprint, testing::config(m), 1, nullptr, &job, specs.data(), &bytes)
                  .code(),
              Code::kUnsupported);
}

}  // namespace
}  // namespace kdn::kernels
