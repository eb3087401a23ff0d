// The CPU-side parts of T0 holding KVC1 blobs (t0_codec.h): codec names, the bounce-buffer plan of
// a decode launch, slot sizes, the host-copy bookkeeping and the encode job.
#include "t0_codec.h"

#include <kdn/kernels/codec.h>
#include <kdn/kernels/codec_cuda.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace kdn::sidecar::gpu {
namespace {

size_t fake_scratch(uint32_t n) { return 16 + 24 * size_t{n}; }
size_t no_decoder(uint32_t) { return 0; }

TEST(T0Codec, NamesMapToTheTierCodecIds) {
  EXPECT_EQ(t0_codec_id("none"), uint8_t{0});
  EXPECT_EQ(t0_codec_id("lossless"), uint8_t{1});
  EXPECT_EQ(t0_codec_id("int8"), uint8_t{2});
  EXPECT_EQ(t0_codec_id("kivi4"), uint8_t{3});
  EXPECT_FALSE(t0_codec_id("kivi2"));
  EXPECT_FALSE(t0_codec_id(""));
  EXPECT_EQ(codec_mode_of(*t0_codec_id("kivi4")), kernels::CodecMode::kKivi4);
}

TEST(T0Codec, DecodeAreaFitsOutputsAndScratchInTheBounceBuffer) {
  const uint64_t chunk = 32ull << 20;  // llama3-8b, 256 tokens
  DecodeArea a = plan_decode_area(64ull << 20, chunk, kMaxDecodeChunks, fake_scratch);
  EXPECT_EQ(a.chunks, 1u);  // two outputs leave no room for the scratch
  EXPECT_EQ(a.stride, chunk);
  EXPECT_EQ(a.scratch_offset, chunk);
  EXPECT_LE(a.scratch_offset + a.scratch_bytes, 64ull << 20);
  a = plan_decode_area((64ull << 20) + 4096, chunk, kMaxDecodeChunks, fake_scratch);
  EXPECT_EQ(a.chunks, 2u);
  a = plan_decode_area(1ull << 30, 1000, 32, fake_scratch);
  EXPECT_EQ(a.chunks, 32u);    // capped
  EXPECT_EQ(a.stride, 1024u);  // aligned
  EXPECT_EQ(a.scratch_offset % kDecodeAlign, 0u);
  EXPECT_EQ(plan_decode_area(chunk, chunk, 8, fake_scratch).chunks, 0u);  // the scratch does not fit
  EXPECT_EQ(plan_decode_area(1ull << 30, chunk, 8, no_decoder).chunks, 0u);
  EXPECT_EQ(plan_decode_area(1ull << 30, 0, 8, fake_scratch).chunks, 0u);
  for (uint64_t bounce : {4096ull, 65536ull, 1ull << 20, 3ull << 20, 64ull << 20}) {
    for (uint64_t bytes : {100ull, 4096ull, 70000ull, 1ull << 20}) {
      a = plan_decode_area(bounce, bytes, kMaxDecodeChunks, fake_scratch);
      if (a.chunks == 0) continue;
      EXPECT_LE(uint64_t(a.chunks) * a.stride + fake_scratch(a.chunks), bounce);
      EXPECT_EQ(a.scratch_bytes, fake_scratch(a.chunks));
      EXPECT_GE(a.stride, bytes);
    }
  }
}

TEST(T0Codec, SlotSizesWasteLittleAndShareClasses) {
  EXPECT_EQ(t0_slot_bytes(1), 4096u);
  EXPECT_EQ(t0_slot_bytes(4096), 4096u);
  for (uint64_t b = 1000; b < (64ull << 20); b = b * 5 / 4 + 7) {
    const uint64_t s = t0_slot_bytes(b);
    EXPECT_GE(s, b);
    EXPECT_EQ(s % 4096, 0u);
    if (b > 65536) {
      EXPECT_LE(s - b, b / 8) << b;
    }
  }
  // Blobs of one model (within a few percent of each other) fall into a handful of classes.
  std::vector<uint64_t> sizes;
  for (uint64_t b = 7'000'000; b < 7'400'000; b += 1000) sizes.push_back(t0_slot_bytes(b));
  std::sort(sizes.begin(), sizes.end());
  EXPECT_LE(std::unique(sizes.begin(), sizes.end()) - sizes.begin(), 3);
}

TEST(T0Codec, BlobStoreCountsRawAndStoredBytesAndRefusesSecondEncodes) {
  T0BlobStore store;
  const T0Key a{1, {1, 2}, 3}, b{1, {1, 2}, 4};
  EXPECT_TRUE(store.begin_encode(a));
  EXPECT_FALSE(store.begin_encode(a));
  EXPECT_TRUE(store.encoding(a));
  EXPECT_EQ(store.in_flight(), 1u);
  T0Blob blob{AlignedBuffer(4096), 1000, 4500};
  store.put(a, std::move(blob));
  store.end_encode(a);
  EXPECT_FALSE(store.begin_encode(a));  // its blob is here
  ASSERT_NE(store.find(a), nullptr);
  EXPECT_EQ(store.find(b), nullptr);
  EXPECT_EQ(store.raw_bytes(), 4500u);
  EXPECT_EQ(store.stored_bytes(), 1000u);
  store.put(b, T0Blob{AlignedBuffer(4096), 2000, 4500});
  EXPECT_EQ(store.blobs(), 2u);
  store.erase(a);
  store.erase(a);
  EXPECT_EQ(store.raw_bytes(), 4500u);
  EXPECT_EQ(store.stored_bytes(), 2000u);
  EXPECT_TRUE(store.begin_encode(a));
}

TEST(T0Codec, TheIndexTellsTheBlobStoreWhenASlotGoes) {
  T0Index idx(8 << 20, 4 << 20);
  T0BlobStore blobs;
  idx.on_erase([&](const T0Key& k) { blobs.erase(k); });
  for (uint64_t i = 0; i < 3; ++i) {
    const T0Key k{1, {i, 0}, 1};
    ASSERT_TRUE(idx.insert(k, 3 << 20));  // the third evicts the first
    blobs.put(k, T0Blob{AlignedBuffer(64), 64, 1 << 20});
    idx.publish(k);
  }
  EXPECT_EQ(blobs.find(T0Key{1, {0, 0}, 1}), nullptr);
  EXPECT_EQ(blobs.blobs(), 2u);
  EXPECT_TRUE(idx.erase(T0Key{1, {1, 0}, 1}));
  EXPECT_EQ(blobs.blobs(), 1u);
}

std::vector<uint16_t> random_f16_chunk(const kernels::ChunkGeometry& g, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  std::vector<uint16_t> out(kernels::chunk_bytes(g) / 2);
  for (uint16_t& h : out) {  // fp16 of a normal sample: sign, exponent around 15, 10 mantissa bits
    const float f = n(rng);
    const float a = std::min(std::fabs(f), 60000.f);
    int e = 0;
    const float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
    uint16_t bits = 0;
    if (a >= 6.1e-5f) bits = uint16_t(((e - 1 + 15) << 10) | (uint16_t(std::lround((m * 2 - 1) * 1024)) & 0x3ff));
    h = uint16_t((f < 0 ? 0x8000 : 0) | bits);
  }
  return out;
}

kernels::ChunkGeometry small_geometry() {
  kernels::ChunkGeometry g;
  g.layers = 2;
  g.kv_heads = 2;
  g.head_dim = 64;
  g.tokens = 64;
  g.dtype = kernels::DType::kF16;
  return g;
}

TEST(T0Codec, TheEncodeJobMakesAValidatedBlobThatDecodesLikeTheCpu) {
  if (kernels::kvc1_cuda_scratch_bytes(1) == 0) GTEST_SKIP() << "built without the CUDA decoder (no validation)";
  const kernels::ChunkGeometry g = small_geometry();
  const kdn_key fp{7, 9};
  for (uint8_t codec : {uint8_t{1}, uint8_t{2}, uint8_t{3}}) {
    std::vector<uint16_t> chunk = random_f16_chunk(g, codec);
    T0EncodeJob job;
    job.geo = g;
    job.fingerprint = fp;
    job.chunk = reinterpret_cast<const std::byte*>(chunk.data());
    job.codec = codec;
    job.run();
    ASSERT_TRUE(job.status.ok()) << int(codec) << ": " << job.status.what();
    ASSERT_GT(job.encoding.bytes, 0u);
    EXPECT_LT(job.encoding.blob.size(), job.encoding.bytes + 4096);  // fitted to the blob
    EXPECT_LT(job.encoding.bytes, kernels::chunk_bytes(g));
    std::vector<uint16_t> back(chunk.size());
    ASSERT_TRUE(kernels::kvc1_decode(reinterpret_cast<const uint8_t*>(job.encoding.blob.data()), job.encoding.bytes, g,
                                     fp, back.data(), back.size() * 2)
                    .ok());
    if (codec == 1) {  // lossless: exact
      EXPECT_EQ(std::memcmp(back.data(), chunk.data(), chunk.size() * 2), 0);
    }
  }
}

TEST(T0Codec, AChunkThatCannotBeEncodedFailsTheJob) {
  const kernels::ChunkGeometry g = small_geometry();
  std::vector<uint16_t> chunk = random_f16_chunk(g, 1);
  chunk[100] = 0x7c00;  // +Inf: a lossy codec refuses it
  T0EncodeJob job;
  job.geo = g;
  job.fingerprint = kdn_key{1, 1};
  job.chunk = reinterpret_cast<const std::byte*>(chunk.data());
  job.codec = 3;
  job.run();
  EXPECT_FALSE(job.status.ok());
  EXPECT_EQ(job.encoding.bytes, 0u);
}

TEST(T0Codec, ResultWordsReadWithoutWaiting) {
  if (kernels::kvc1_cuda_scratch_bytes(1) == 0) GTEST_SKIP() << "built without the CUDA decoder";
  EXPECT_TRUE(kernels::kvc1_cuda_result_of(0).ok());
  EXPECT_EQ(kernels::kvc1_cuda_result_of(1).code(), Code::kCorrupt);
  EXPECT_EQ(kernels::kvc1_cuda_result_of(2).code(), Code::kInternal);
}

}  // namespace
}  // namespace kdn::sidecar::gpu
