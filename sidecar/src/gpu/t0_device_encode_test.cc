// A GPU_STORE's chunks encoded for T0 on the device (t0_device_encode.h), on the CPU: where each
// copy is encoded, the bounce-buffer and landing plans, and the whole data flow of one store with
// the device's stages emulated (kvc1_encode_emulated) over the same offsets store() uses, through
// the same encode job into a T0 blob equal to the host encoder's.
#include "t0_device_encode.h"
#include "t0_codec.h"

#include <kdn/kernels/codec.h>
#include <kdn/kernels/codec_cuda.h>
#include <kdn/kernels/dtype.h>

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

namespace kdn::sidecar::gpu {
namespace {

constexpr uint8_t kLossless = 1, kInt8 = 2, kKivi4 = 3;

kernels::ChunkGeometry geometry() {
  kernels::ChunkGeometry g;
  g.layers = 2;
  g.kv_heads = 2;
  g.head_dim = 64;
  g.tokens = 32;
  g.dtype = kernels::DType::kF16;
  return g;
}

// KV-like fp16: a per-channel offset plus noise, so the quantized codecs save bytes.
std::vector<uint16_t> chunk_of(const kernels::ChunkGeometry& g, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  std::vector<uint16_t> out(kernels::chunk_bytes(g) / 2);
  for (size_t i = 0; i < out.size(); ++i) out[i] = kernels::f32_to_f16(0.25f * float(i % g.head_dim % 7) + n(rng));
  return out;
}

constexpr uint64_t kBounce = 4ull << 20;

TEST(T0DeviceEncode, WhereEachCopyIsEncoded) {
  const kernels::ChunkGeometry g = geometry();
  const EncodeArea fits = plan_encode_area(kBounce, g, kKivi4, kernels::kvc1_encode_emulated_scratch_bytes);
  ASSERT_TRUE(fits.fits());
  EXPECT_EQ(t0_encode_site(0, true, fits), EncodeSite::kNone);         // no codec: T0 holds raw chunks
  EXPECT_EQ(t0_encode_site(kKivi4, true, fits), EncodeSite::kDevice);  // a GPU store's chunk
  EXPECT_EQ(t0_encode_site(kKivi4, false, fits), EncodeSite::kHost);   // a chunk from T1
  EXPECT_TRUE(plan_encode_area(kBounce, g, kInt8, kernels::kvc1_encode_emulated_scratch_bytes).fits());
  // Lossless has no device encoder; a bounce buffer too small takes the host path too.
  const EncodeArea lossless = plan_encode_area(kBounce, g, kLossless, kernels::kvc1_encode_emulated_scratch_bytes);
  EXPECT_FALSE(lossless.fits());
  EXPECT_EQ(t0_encode_site(kLossless, true, lossless), EncodeSite::kHost);
  EXPECT_FALSE(plan_encode_area(fits.scratch_offset + fits.scratch_bytes - 1, g, kKivi4,
                                kernels::kvc1_encode_emulated_scratch_bytes)
                   .fits());
  EXPECT_TRUE(
      plan_encode_area(fits.scratch_offset + fits.scratch_bytes, g, kKivi4, kernels::kvc1_encode_emulated_scratch_bytes)
          .fits());
  // A build without the CUDA encoder sizes no scratch: everything on the host.
  EXPECT_FALSE(
      plan_encode_area(kBounce, g, kKivi4,
                       [](const kernels::ChunkGeometry&, const kernels::CodecConfig&, uint32_t) -> size_t { return 0; })
          .fits());
}

TEST(T0DeviceEncode, TheAreasNeverOverlap) {
  const kernels::ChunkGeometry g = geometry();
  const EncodeArea a = plan_encode_area(kBounce, g, kInt8, kernels::kvc1_encode_emulated_scratch_bytes);
  ASSERT_TRUE(a.fits());
  EXPECT_GE(a.out_offset, kernels::chunk_bytes(g));
  EXPECT_GE(a.scratch_offset, a.out_offset + a.cap);
  EXPECT_EQ(a.out_offset % 256, 0u);
  EXPECT_EQ(a.scratch_offset % 256, 0u);
  EXPECT_GE(a.head_room, a.head_bytes);
  EXPECT_GE(a.landing_stride, a.head_room + a.cap);
  for (uint32_t i = 0; i < 3; ++i) {
    const auto c = landing_copies(a, i);
    EXPECT_EQ(c[0].to, i * a.landing_stride);
    EXPECT_EQ(c[1].to, i * a.landing_stride + a.head_room);
    EXPECT_LE(c[1].to + c[1].bytes, (i + 1) * a.landing_stride);
    EXPECT_EQ(c[0].from, a.scratch_offset);
    EXPECT_EQ(c[1].from, a.out_offset);
  }
}

// What store() queues for chunk i, with the device's stages run on the CPU over a host "bounce
// buffer": the chunk at 0, the encode, the copies into the landing.
void emulate_store_encode(const EncodeArea& a, const kernels::ChunkGeometry& g, const kdn_key& fp, uint8_t codec,
                          const std::vector<uint16_t>& chunk, uint32_t i, std::vector<std::byte>& bounce,
                          std::vector<std::byte>& landing) {
  std::memcpy(bounce.data(), chunk.data(), chunk.size() * 2);
  const void* in = bounce.data();
  uint8_t* out = reinterpret_cast<uint8_t*>(bounce.data() + a.out_offset);
  kernels::Kvc1CudaEncodeBatch b;
  b.n = 1;
  b.device_chunks = &in;
  b.device_outputs = &out;
  ASSERT_TRUE(
      kernels::kvc1_encode_emulated(b, g, fp, codec_config_of(codec), bounce.data() + a.scratch_offset, a.scratch_bytes)
          .ok());
  for (const LandingCopy& c : landing_copies(a, i)) std::memcpy(landing.data() + c.to, bounce.data() + c.from, c.bytes);
}

TEST(T0DeviceEncode, AStoresDeviceBlobsEnterT0AsTheHostWouldHaveEncodedThem) {
  if (kernels::kvc1_cuda_scratch_bytes(1) == 0) GTEST_SKIP() << "built without the CUDA decoder (no validation)";
  const kernels::ChunkGeometry g = geometry();
  const kdn_key fp{11, 13};
  for (uint8_t codec : {kInt8, kKivi4}) {
    const EncodeArea a = plan_encode_area(kBounce, g, codec, kernels::kvc1_encode_emulated_scratch_bytes);
    ASSERT_TRUE(a.fits());
    std::vector<std::byte> bounce(kBounce), landing(3 * a.landing_stride);
    std::vector<std::vector<uint16_t>> chunks;
    for (uint32_t i = 0; i < 3; ++i) {
      chunks.push_back(chunk_of(g, 100 * codec + i));
      emulate_store_encode(a, g, fp, codec, chunks[i], i, bounce, landing);
    }
    for (uint32_t i = 0; i < 3; ++i) {
      auto bytes = landed_blob_bytes(landing.data(), a, i, kernels::chunk_bytes(g));
      ASSERT_TRUE(bytes.ok()) << bytes.status().what();
      T0EncodeJob dev;
      dev.geo = g;
      dev.fingerprint = fp;
      dev.codec = codec;
      dev.device_blob = landed_blob(landing.data(), a, i);
      dev.device_blob_bytes = *bytes;
      dev.run();
      ASSERT_TRUE(dev.status.ok()) << dev.status.what();
      T0EncodeJob host;
      host.geo = g;
      host.fingerprint = fp;
      host.codec = codec;
      host.chunk = reinterpret_cast<const std::byte*>(chunks[i].data());
      host.run();
      ASSERT_TRUE(host.status.ok()) << host.status.what();
      ASSERT_EQ(dev.encoding.bytes, host.encoding.bytes) << int(codec) << " chunk " << i;
      EXPECT_EQ(std::memcmp(dev.encoding.blob.data(), host.encoding.blob.data(), host.encoding.bytes), 0);
    }
  }
}

TEST(T0DeviceEncode, BadLandingsNeverEnterT0) {
  if (kernels::kvc1_cuda_scratch_bytes(1) == 0) GTEST_SKIP() << "built without the CUDA decoder (no validation)";
  const kernels::ChunkGeometry g = geometry();
  const kdn_key fp{11, 13};
  const EncodeArea a = plan_encode_area(kBounce, g, kKivi4, kernels::kvc1_encode_emulated_scratch_bytes);
  std::vector<std::byte> bounce(kBounce), landing(2 * a.landing_stride);
  std::vector<uint16_t> bad = chunk_of(g, 1);
  bad[77] = 0x7e00;  // NaN: the encoder's result says so, and the chunk stays in T1 only
  emulate_store_encode(a, g, fp, kKivi4, bad, 0, bounce, landing);
  EXPECT_EQ(landed_blob_bytes(landing.data(), a, 0, kernels::chunk_bytes(g)).status().code(), Code::kInvalidArgument);
  // A blob damaged between the device and the worker fails the job's validation.
  emulate_store_encode(a, g, fp, kKivi4, chunk_of(g, 2), 1, bounce, landing);
  auto bytes = landed_blob_bytes(landing.data(), a, 1, kernels::chunk_bytes(g));
  ASSERT_TRUE(bytes.ok());
  landing[1 * a.landing_stride + a.head_room + *bytes / 2] ^= std::byte{0x10};
  T0EncodeJob job;
  job.geo = g;
  job.fingerprint = fp;
  job.codec = kKivi4;
  job.device_blob = landed_blob(landing.data(), a, 1);
  job.device_blob_bytes = *bytes;
  job.run();
  EXPECT_EQ(job.status.code(), Code::kCorrupt);
  // A size past the blob's room, and one no smaller than the chunk.
  uint64_t size = a.cap + 1;
  std::memcpy(landing.data() + a.landing_stride + 16, &size, 8);
  EXPECT_EQ(landed_blob_bytes(landing.data(), a, 1, kernels::chunk_bytes(g)).status().code(), Code::kCorrupt);
  size = a.cap;  // within the room, but a chunk of this many bytes saves nothing
  std::memcpy(landing.data() + a.landing_stride + 16, &size, 8);
  EXPECT_EQ(landed_blob_bytes(landing.data(), a, 1, a.cap).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace kdn::sidecar::gpu
