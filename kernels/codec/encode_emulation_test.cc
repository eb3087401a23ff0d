// The CUDA encoder's stages (encode_device.h) run on the CPU, one unit after another, over the
// scratch layout the launcher uses: the blob must equal kvc1_encode's byte for byte in every
// quantized mode and option. encode_gpu_test.cc repeats the comparison on a real device.
#include "codec_test_util.h"
#include "encode_device_plan.h"

#include <kdn/kernels/codec_cuda.h>

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace kdn::kernels {
namespace {

using testing::geometry;
using testing::kTestFingerprint;

// Runs every stage of a one-chunk batch (kvc1_encode_emulated); *error receives the result word.
std::vector<uint8_t> emulate_encode(const ChunkGeometry& g, const std::vector<uint8_t>& chunk, const CodecConfig& cfg,
                                    uint32_t* error, uint32_t place_threads = 3) {
  const size_t bytes = kvc1_encode_emulated_scratch_bytes(g, cfg, 1);
  EXPECT_GT(bytes, 0u);
  std::vector<uint64_t> scratch(bytes / 8 + 2);
  std::vector<uint8_t> out(kvc1_max_encoded_size(g, cfg), 0);
  const void* chunk_ptr = chunk.data();
  uint8_t* out_ptr = out.data();
  Kvc1CudaEncodeBatch batch;
  batch.n = 1;
  batch.device_chunks = &chunk_ptr;
  batch.device_outputs = &out_ptr;
  EXPECT_TRUE(
      kvc1_encode_emulated(batch, g, kTestFingerprint, cfg, scratch.data(), scratch.size() * 8, place_threads).ok());
  std::memcpy(error, scratch.data(), 4);
  uint64_t written = 0;
  std::memcpy(&written, reinterpret_cast<const uint8_t*>(scratch.data()) + kvc1::kDeviceEncodeHeadBytes, 8);
  out.resize(written <= out.size() ? written : 0);
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

TEST(EncodeEmulation, TheResultHeadReadsAsTheDeviceResult) {
  const ChunkGeometry g = geometry(1, 2, 32, 16);
  std::vector<uint8_t> chunk = testing::synthetic_chunk(g, 4);
  const CodecConfig cfg = testing::config(CodecMode::kInt8);
  std::vector<uint64_t> scratch(kvc1_encode_emulated_scratch_bytes(g, cfg, 2) / 8 + 2);
  std::vector<uint8_t> out0(kvc1_max_encoded_size(g, cfg)), out1(out0.size());
  std::vector<uint8_t> chunk1 = testing::synthetic_chunk(g, 5);
  const void* chunks[2] = {chunk.data(), chunk1.data()};
  uint8_t* outs[2] = {out0.data(), out1.data()};
  Kvc1CudaEncodeBatch batch;
  batch.n = 2;
  batch.device_chunks = chunks;
  batch.device_outputs = outs;
  ASSERT_TRUE(kvc1_encode_emulated(batch, g, kTestFingerprint, cfg, scratch.data(), scratch.size() * 8).ok());
  uint64_t sizes[2] = {};
  ASSERT_TRUE(kvc1_cuda_encode_result_of(scratch.data(), 2, sizes).ok());
  EXPECT_EQ(std::vector<uint8_t>(out0.begin(), out0.begin() + sizes[0]), testing::encode(g, chunk.data(), cfg));
  EXPECT_EQ(std::vector<uint8_t>(out1.begin(), out1.begin() + sizes[1]), testing::encode(g, chunk1.data(), cfg));
  // A chunk with an Inf: the head says so, as the device's would.
  const uint16_t inf = 0x7c00;
  std::memcpy(chunk1.data() + 6, &inf, 2);
  ASSERT_TRUE(kvc1_encode_emulated(batch, g, kTestFingerprint, cfg, scratch.data(), scratch.size() * 8).ok());
  EXPECT_EQ(kvc1_cuda_encode_result_of(scratch.data(), 2, sizes).code(), Code::kInvalidArgument);
  EXPECT_EQ(kvc1_cuda_encode_head_bytes(2), kvc1::kDeviceEncodeHeadBytes + 16);
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
