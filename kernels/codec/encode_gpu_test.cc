// The CUDA encoder against the CPU encoder: identical blobs for every quantized mode and option.
// Every case skips without a device (scripts/gpu-check.sh runs it on a GPU machine).
#include "codec_test_util.h"

#include <kdn/kernels/codec_cuda.h>
#include <kdn/kernels/device.h>
#include <kdn/kernels/executor.h>

#include <gtest/gtest.h>

#include <vector>

namespace kdn::kernels {
namespace {

using testing::geometry;
using testing::kTestFingerprint;

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) { EXPECT_TRUE(device_alloc(bytes ? bytes : 1, &p_).ok()); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { device_free(p_); }
  void* get() const { return p_; }

 private:
  void* p_ = nullptr;
};

// Encodes one chunk on the device; the blob, or empty on an error (reported).
std::vector<uint8_t> gpu_encode(const ChunkGeometry& g, const std::vector<uint8_t>& chunk, const CodecConfig& cfg) {
  const size_t cap = kvc1_max_encoded_size(g, cfg);
  DeviceBuffer dev_chunk(chunk.size()), dev_out(cap), scratch(kvc1_cuda_encode_scratch_bytes(g, cfg, 1));
  EXPECT_TRUE(copy_to_device(dev_chunk.get(), chunk.data(), chunk.size()).ok());
  const void* chunks[1] = {dev_chunk.get()};
  uint8_t* outs[1] = {static_cast<uint8_t*>(dev_out.get())};
  Kvc1CudaEncodeBatch batch;
  batch.n = 1;
  batch.device_chunks = chunks;
  batch.device_outputs = outs;
  const size_t sb = kvc1_cuda_encode_scratch_bytes(g, cfg, 1);
  Status st = kvc1_encode_cuda(batch, g, kTestFingerprint, cfg, scratch.get(), sb, nullptr);
  uint64_t size = 0;
  if (st.ok()) st = kvc1_cuda_encode_result(scratch.get(), 1, nullptr, &size);
  EXPECT_TRUE(st.ok()) << st.what();
  if (!st.ok()) return {};
  std::vector<uint8_t> blob(size);
  EXPECT_TRUE(copy_to_host(blob.data(), dev_out.get(), size).ok());
  return blob;
}

TEST(CodecEncodeGpu, BlobsEqualTheCpuEncoder) {
  if (!cuda_built() || cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const ChunkGeometry shapes[] = {geometry(2, 2, 64, 48), geometry(1, 1, 32, 37, DType::kBF16),
                                  geometry(1, 1, 40, 20, DType::kF32), geometry(4, 8, 128, 256)};
  for (const ChunkGeometry& g : shapes) {
    const std::vector<uint8_t> chunk = testing::synthetic_chunk(g, 9);
    for (CodecMode m : {CodecMode::kInt8, CodecMode::kKivi4, CodecMode::kKivi2}) {
      for (int variant = 0; variant < 3; ++variant) {
        CodecConfig c = testing::config(m);
        c.token_delta = variant != 1;
        c.rotate = variant == 2 && (g.head_dim & (g.head_dim - 1)) == 0;
        c.ends_context = variant == 2;
        EXPECT_EQ(gpu_encode(g, chunk, c), testing::encode(g, chunk.data(), c)) << codec_mode_name(m) << " " << variant;
      }
    }
  }
}

TEST(CodecEncodeGpu, LosslessIsNotADeviceMode) {
  const ChunkGeometry g = geometry(1, 1, 32, 16);
  EXPECT_EQ(kvc1_cuda_encode_scratch_bytes(g, testing::config(CodecMode::kLossless), 1), 0u);
}

}  // namespace
}  // namespace kdn::kernels
