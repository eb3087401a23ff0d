// The remote benchmark's chunks and checks: synthetic KV chunks are all different, wrong bytes
// are counted exactly, and a stored value (codec none, or a KVC1 payload as a T3 codec will
// store it) is decoded independently of RemoteTier, refusing another namespace's value.
#include "remote_chunks.h"

#include "remote_format.h"

#include <kdn/common/model_presets.h>
#include <kdn/kernels/codec.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

namespace kdn::bench {
namespace {

using sidecar::remote::RemoteCodec;

ModelInfo small_model() {
  kdn_model_desc d = shaped_desc(4, 2, 64, 64, "kdn-bench/remote-test");
  Result<ModelInfo> m = ModelInfo::from_desc(d);
  EXPECT_TRUE(m.ok());
  return m.value();
}

std::string stored_value(const ModelInfo& m, const std::string& ns, const kdn_key& key, RemoteCodec codec,
                         std::span<const std::byte> payload) {
  sidecar::remote::ValueHeader h;
  h.key = key;
  h.fingerprint = m.fingerprint;
  h.codec = codec;
  h.raw_bytes = m.chunk_bytes;
  h.stored_bytes = payload.size();
  h.payload_crc = sidecar::remote::crc32c(payload.data(), payload.size());
  h.name_space = ns;
  std::string value(sidecar::remote::kHeaderBytes + payload.size(), '\0');
  sidecar::remote::encode_header(h, reinterpret_cast<std::byte*>(value.data()));
  std::memcpy(value.data() + sidecar::remote::kHeaderBytes, payload.data(), payload.size());
  return value;
}

TEST(RemoteChunks, SyntheticKvChunksAreAllDifferentAndAligned) {
  const ModelInfo m = small_model();
  const uint32_t count = 8 * m.desc.num_layers;  // every rotation of every generated chunk
  Result<ChunkSet> set = make_chunks(m, m.chunk_bytes, count);
  ASSERT_TRUE(set.ok());
  EXPECT_TRUE(set->synthetic_kv);
  EXPECT_EQ(set->stride % kSlotAlign, 0u);
  std::set<std::string> distinct;
  for (uint32_t i = 0; i < count; ++i) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(set->chunk(i)) % kSlotAlign, 0u);
    distinct.emplace(reinterpret_cast<const char*>(set->chunk(i)), set->chunk_bytes);
  }
  EXPECT_EQ(distinct.size(), count);
  Result<ChunkSet> pattern = make_chunks(m, 12345, 3);
  ASSERT_TRUE(pattern.ok());
  EXPECT_FALSE(pattern->synthetic_kv);
  EXPECT_NE(std::memcmp(pattern->chunk(0), pattern->chunk(1), 12345), 0);
}

TEST(RemoteChunks, CountsEveryWrongByte) {
  const ModelInfo m = small_model();
  Result<ChunkSet> set = make_chunks(m, 10000, 2);
  Result<PageBuffer> slots = make_slots(10000, 2);
  ASSERT_TRUE(set.ok() && slots.ok());
  std::memcpy(slots->data(), set->chunk(0), 10000);
  std::memcpy(slots->data() + set->stride, set->chunk(1), 10000);
  EXPECT_EQ(wrong_bytes(*slots, *set), 0u);
  slots->data()[5] ^= std::byte{1};
  slots->data()[set->stride + 9999] ^= std::byte{0x80};
  slots->data()[set->stride + 4096] ^= std::byte{0xff};
  EXPECT_EQ(wrong_bytes(*slots, *set), 3u);
}

TEST(RemoteChunks, DecodesAStoredValueIndependently) {
  const ModelInfo m = small_model();
  Result<ChunkSet> set = make_chunks(m, m.chunk_bytes, 1);
  ASSERT_TRUE(set.ok());
  const kdn_key key = set->keys[0];
  std::vector<std::byte> out(m.chunk_bytes);

  // Codec none: the payload is the chunk.
  const std::string plain =
      stored_value(m, "bench", key, RemoteCodec::kNone, std::span<const std::byte>(set->chunk(0), m.chunk_bytes));
  Result<ReferenceDecode> d = decode_stored_value(plain, "bench", key, m, out.data());
  ASSERT_TRUE(d.ok()) << d.status().what();
  EXPECT_EQ(wrong_bytes(out.data(), set->chunk(0), m.chunk_bytes), 0u);
  EXPECT_FALSE(decode_stored_value(plain, "other", key, m, out.data()).ok());  // another namespace's

  // kivi4: a KVC1 payload, decoded here, close to the original but not equal.
  const kernels::ChunkGeometry g = kernels::kvc1_geometry(m);
  kernels::CodecConfig cfg;
  cfg.mode = kernels::CodecMode::kKivi4;
  std::vector<uint8_t> blob(kernels::kvc1_max_encoded_size(g, cfg));
  std::vector<uint8_t> scratch(kernels::kvc1_encode_scratch_bytes(g, cfg));
  size_t written = 0;
  ASSERT_TRUE(kernels::kvc1_encode(g, m.fingerprint, set->chunk(0), cfg, blob.data(), blob.size(), &written,
                                   scratch.data(), scratch.size())
                  .ok());
  const std::string kivi =
      stored_value(m, "bench-kivi4", key, RemoteCodec::kKivi4,
                   std::span<const std::byte>(reinterpret_cast<const std::byte*>(blob.data()), written));
  d = decode_stored_value(kivi, "bench-kivi4", key, m, out.data());
  ASSERT_TRUE(d.ok()) << d.status().what();
  EXPECT_EQ(d->codec, uint8_t(RemoteCodec::kKivi4));
  EXPECT_EQ(d->stored_bytes, written);
  EXPECT_LT(written, m.chunk_bytes / 2);
  const double err = relative_error(m, set->chunk(0), out.data());
  EXPECT_GT(err, 0.0);
  EXPECT_LT(err, 0.2);
  // A damaged payload fails its CRC: never decoded.
  std::string damaged = kivi;
  damaged.back() ^= 1;
  EXPECT_FALSE(decode_stored_value(damaged, "bench-kivi4", key, m, out.data()).ok());
}

}  // namespace
}  // namespace kdn::bench
