// The CUDA decoder against the CPU decoder: identical bytes for every mode, dtype and shape.
// Every case that needs a device skips without one.
#include "codec_test_util.h"

#include <kdn/kernels/codec.h>
#include <kdn/kernels/codec_cuda.h>
#include <kdn/kernels/codec_transform.h>
#include <kdn/kernels/device.h>
#include <kdn/kernels/executor.h>

#include <gtest/gtest.h>

#include <bit>
#include <vector>

namespace kdn::kernels {
namespace {

using testing::geometry;
using testing::geometry_bytes;
using testing::kTestFingerprint;

#define SKIP_WITHOUT_DEVICE() \
  if (!cuda_built() || cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device"

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) { EXPECT_TRUE(device_alloc(bytes ? bytes : 1, &p_).ok()); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_) { o.p_ = nullptr; }
  ~DeviceBuffer() { device_free(p_); }
  void* get() const { return p_; }

 private:
  void* p_ = nullptr;
};

// Decodes blobs on the device (one batch) and returns the outputs, or the first error.
Status gpu_decode(const std::vector<std::vector<uint8_t>>& blobs, const ChunkGeometry& g,
                  std::vector<std::vector<uint8_t>>* outs, const DecodeOptions& opts = {}, bool prevalidated = false,
                  const void* device_cal = nullptr) {
  const uint32_t n = static_cast<uint32_t>(blobs.size());
  std::vector<DeviceBuffer> dev_blobs, dev_outs;
  std::vector<const uint8_t*> host_ptrs, blob_ptrs;
  std::vector<size_t> lens;
  std::vector<void*> out_ptrs;
  for (const auto& b : blobs) {
    dev_blobs.emplace_back(b.size());
    KDN_RETURN_IF_ERROR(copy_to_device(dev_blobs.back().get(), b.data(), b.size()));
    dev_outs.emplace_back(geometry_bytes(g));
    KDN_RETURN_IF_ERROR(device_memset(dev_outs.back().get(), 0, geometry_bytes(g)));
    host_ptrs.push_back(b.data());
    blob_ptrs.push_back(static_cast<const uint8_t*>(dev_blobs.back().get()));
    lens.push_back(b.size());
    out_ptrs.push_back(dev_outs.back().get());
  }
  DeviceBuffer scratch(kvc1_cuda_scratch_bytes(n));
  Kvc1CudaBatch batch;
  batch.n = n;
  batch.host_blobs = host_ptrs.data();
  batch.blob_bytes = lens.data();
  batch.device_blobs = blob_ptrs.data();
  batch.device_outputs = out_ptrs.data();
  batch.device_calibration = device_cal;
  if (prevalidated) {
    KDN_RETURN_IF_ERROR(kvc1_validate_batch(batch, g, kTestFingerprint, opts));
    KDN_RETURN_IF_ERROR(kvc1_decode_cuda_validated(batch, g, kTestFingerprint, scratch.get(),
                                                   kvc1_cuda_scratch_bytes(n), nullptr, opts));
  } else {
    KDN_RETURN_IF_ERROR(
        kvc1_decode_cuda(batch, g, kTestFingerprint, scratch.get(), kvc1_cuda_scratch_bytes(n), nullptr, opts));
  }
  KDN_RETURN_IF_ERROR(kvc1_cuda_result(scratch.get(), nullptr));
  outs->assign(n, std::vector<uint8_t>(geometry_bytes(g)));
  for (uint32_t i = 0; i < n; ++i) KDN_RETURN_IF_ERROR(copy_to_host((*outs)[i].data(), out_ptrs[i], geometry_bytes(g)));
  return OkStatus();
}

std::vector<uint8_t> cpu_decode(const std::vector<uint8_t>& blob, const ChunkGeometry& g, const DecodeOptions& o = {}) {
  std::vector<uint8_t> out(geometry_bytes(g), 0);
  EXPECT_TRUE(kvc1_decode(blob.data(), blob.size(), g, kTestFingerprint, out.data(), out.size(), o).ok());
  return out;
}

TEST(CodecCuda, WithoutCudaTheEntryPointsSayUnsupported) {
  if (cuda_built()) GTEST_SKIP() << "built with CUDA";
  Kvc1CudaBatch batch;
  EXPECT_EQ(kvc1_decode_cuda(batch, geometry(1, 1, 32, 8), kTestFingerprint, nullptr, 0, nullptr).code(),
            Code::kUnsupported);
}

TEST(CodecCuda, DecodeEqualsCpuBitForBit) {
  SKIP_WITHOUT_DEVICE();
  const ChunkGeometry shapes[] = {geometry(2, 3, 64, 256), geometry(2, 2, 128, 100, DType::kBF16),
                                  geometry(1, 2, 80, 37, DType::kF32), geometry(2, 1, 7, 5), geometry(1, 1, 32, 1)};
  for (const ChunkGeometry& g : shapes) {
    for (CodecMode m : testing::kAllModes) {
      for (int variant = 0; variant < 3; ++variant) {
        const bool entropy = variant != 1, rotate = variant == 2;
        if (rotate && (m == CodecMode::kRaw || m == CodecMode::kLossless || !std::has_single_bit(g.head_dim))) continue;
        CodecConfig c = testing::config(m);
        c.entropy = entropy;
        c.rotate = rotate;
        c.block_tokens = 64;
        std::vector<std::vector<uint8_t>> blobs;
        for (uint64_t seed = 1; seed <= 3; ++seed) {
          c.ends_context = seed == 3;  // the last chunk ends its context: recent rows
          blobs.push_back(testing::encode(g, testing::synthetic_chunk(g, seed).data(), c));
        }
        std::vector<std::vector<uint8_t>> outs;
        const Status st = gpu_decode(blobs, g, &outs);
        ASSERT_TRUE(st.ok()) << st.what();
        for (size_t i = 0; i < blobs.size(); ++i)
          EXPECT_EQ(outs[i], cpu_decode(blobs[i], g))
              << codec_mode_name(m) << " entropy " << entropy << " rotate " << rotate << " D=" << g.head_dim;
      }
    }
  }
}

TEST(CodecCuda, ValidatedOnceThenDecodedEqualsCpuBitForBit) {
  SKIP_WITHOUT_DEVICE();
  const ChunkGeometry g = geometry(2, 2, 128, 256);
  for (CodecMode m : testing::kAllModes) {
    std::vector<std::vector<uint8_t>> blobs;
    for (uint64_t seed = 1; seed <= 4; ++seed)
      blobs.push_back(testing::encode(g, testing::synthetic_chunk(g, seed).data(), testing::config(m)));
    std::vector<std::vector<uint8_t>> outs;
    const Status st = gpu_decode(blobs, g, &outs, {}, true);
    ASSERT_TRUE(st.ok()) << st.what();
    for (size_t i = 0; i < blobs.size(); ++i) EXPECT_EQ(outs[i], cpu_decode(blobs[i], g)) << codec_mode_name(m);
  }
  // Validation still refuses what the decoder would: a flipped payload byte fails its CRC.
  std::vector<uint8_t> blob =
      testing::encode(g, testing::synthetic_chunk(g, 5).data(), testing::config(CodecMode::kKivi4));
  const size_t word = testing::v_rans_word_offset(blob);
  ASSERT_GT(word, 0u);
  blob[word] ^= 0x40;
  std::vector<std::vector<uint8_t>> outs;
  EXPECT_EQ(gpu_decode({blob}, g, &outs, {}, true).code(), Code::kCorrupt);
}

TEST(CodecCuda, LayerRangeLeavesOtherLayersAlone) {
  SKIP_WITHOUT_DEVICE();
  const ChunkGeometry g = geometry(4, 2, 64, 64);
  const std::vector<std::vector<uint8_t>> blobs = {
      testing::encode(g, testing::synthetic_chunk(g, 2).data(), testing::config(CodecMode::kKivi4))};
  DecodeOptions o;
  o.layers = {1, 3};
  std::vector<std::vector<uint8_t>> outs;
  ASSERT_TRUE(gpu_decode(blobs, g, &outs, o).ok());
  EXPECT_EQ(outs[0], cpu_decode(blobs[0], g, o));  // both start from zeroed outputs
}

TEST(CodecCuda, CorruptStreamsAreReported) {
  SKIP_WITHOUT_DEVICE();
  const ChunkGeometry g = geometry(1, 1, 64, 256);
  std::vector<uint8_t> blob =
      testing::encode(g, testing::synthetic_chunk(g, 4).data(), testing::config(CodecMode::kKivi4));
  const size_t word = testing::v_rans_word_offset(blob);
  ASSERT_GT(word, 0u);
  blob[word] ^= 0x40;
  std::vector<std::vector<uint8_t>> outs;
  EXPECT_EQ(gpu_decode({blob}, g, &outs).code(), Code::kCorrupt);  // the host's CRC check
  DecodeOptions no_crc;
  no_crc.verify_crc = false;
  std::vector<uint8_t> cpu(geometry_bytes(g));
  const Code cpu_code =
      kvc1_decode(blob.data(), blob.size(), g, kTestFingerprint, cpu.data(), cpu.size(), no_crc).code();
  EXPECT_EQ(cpu_code, Code::kCorrupt);  // the end-state check
  EXPECT_EQ(gpu_decode({blob}, g, &outs, no_crc).code(), cpu_code);
}

TEST(CodecCuda, ArgumentChecks) {
  SKIP_WITHOUT_DEVICE();
  const ChunkGeometry g = geometry(1, 1, 32, 8);
  const std::vector<uint8_t> blob =
      testing::encode(g, testing::synthetic_chunk(g).data(), testing::config(CodecMode::kKivi4));
  DeviceBuffer dev(blob.size() + 16), out(geometry_bytes(g)), scratch(kvc1_cuda_scratch_bytes(1));
  const uint8_t* host = blob.data();
  const size_t len = blob.size();
  const uint8_t* misaligned = static_cast<const uint8_t*>(dev.get()) + 1;
  void* o = out.get();
  Kvc1CudaBatch batch{1, &host, &len, &misaligned, &o};
  EXPECT_EQ(kvc1_decode_cuda(batch, g, kTestFingerprint, scratch.get(), kvc1_cuda_scratch_bytes(1), nullptr).code(),
            Code::kInvalidArgument);
  const uint8_t* aligned = static_cast<const uint8_t*>(dev.get());
  batch.device_blobs = &aligned;
  EXPECT_EQ(kvc1_decode_cuda(batch, g, kTestFingerprint, scratch.get(), 8, nullptr).code(), Code::kInvalidArgument);
  EXPECT_EQ(kvc1_decode_cuda(batch, g, kdn_key{9, 9}, scratch.get(), kvc1_cuda_scratch_bytes(1), nullptr).code(),
            Code::kModelMismatch);
}

// Transform-coded blobs (docs/codec.md §10.6): bands, then rows rebuilt from the calibration's
// axes, equal to the CPU decoder bit for bit; without the device calibration they are refused,
// and with another calibration they are a miss.
TEST(CodecCuda, TransformPlanesEqualCpuBitForBit) {
  SKIP_WITHOUT_DEVICE();
  const ChunkGeometry g = geometry(2, 8, 128, 64);
  const testing::SyntheticCalibration sc = testing::synthetic_calibration(g, 50);
  ASSERT_FALSE(::testing::Test::HasFailure());
  const auto& chunks = sc.chunks;
  const auto& cal_bytes = sc.bytes;
  const Kvc1Calibration& cal = sc.view;
  DeviceBuffer dev_cal(cal_bytes.size());
  ASSERT_TRUE(copy_to_device(dev_cal.get(), cal_bytes.data(), cal_bytes.size()).ok());
  CodecConfig c;
  c.mode = CodecMode::kTransform;
  c.calibration = &cal;
  c.transform_mean_bits = 2.0;
  CodecConfig last = c;
  last.pos_base = 64;
  last.ends_context = true;
  last.recent_tokens = 5;
  const std::vector<std::vector<uint8_t>> blobs = {testing::encode(g, chunks[0].data(), c),
                                                   testing::encode(g, chunks[1].data(), last)};
  DecodeOptions o;
  o.calibration = &cal;
  std::vector<std::vector<uint8_t>> outs;
  ASSERT_TRUE(gpu_decode(blobs, g, &outs, o, false, dev_cal.get()).ok());
  for (size_t i = 0; i < blobs.size(); ++i) EXPECT_EQ(outs[i], cpu_decode(blobs[i], g, o)) << "chunk " << i;
  ASSERT_TRUE(gpu_decode(blobs, g, &outs, o, true, dev_cal.get()).ok());
  EXPECT_EQ(outs[0], cpu_decode(blobs[0], g, o));
  EXPECT_EQ(gpu_decode(blobs, g, &outs, o).code(), Code::kInvalidArgument);                  // no device calibration
  EXPECT_EQ(gpu_decode(blobs, g, &outs, {}, false, dev_cal.get()).code(), Code::kNotFound);  // none on the host
}

}  // namespace
}  // namespace kdn::kernels
