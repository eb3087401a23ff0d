// The tiers' transform mode (chunk_codec with a CalibrationCatalog): a chunk coded with a
// calibration decodes only where that calibration is held; a damaged or swapped calibration is
// refused before it is held; the store key lives in a domain of its own. Small geometry: ms.
#include "chunk_calibration.h"
#include "chunk_codec.h"

#include <kdn/kernels/synthetic.h>

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace kdn::sidecar {
namespace {

constexpr kdn_key kModel{0x1234, 0x5678};
constexpr kdn_key kOtherModel{0x9abc, 0xdef0};

kernels::ChunkGeometry geometry() {
  kernels::ChunkGeometry g;
  g.layers = 2, g.kv_heads = 2, g.head_dim = 64, g.tokens = 64;
  return g;
}

std::vector<std::byte> chunk(const kernels::ChunkGeometry& g, uint64_t seed) {
  std::vector<std::byte> c(kernels::chunk_bytes(g));
  kernels::SyntheticKvParams p;
  p.seed = seed;
  EXPECT_TRUE(kernels::fill_synthetic_kv(c.data(), g, p).ok());
  return c;
}

std::vector<std::byte> calibration(const kernels::ChunkGeometry& g, const kdn_key& model, uint64_t seed) {
  std::vector<std::vector<std::byte>> chunks;
  std::vector<kernels::Kvc1CalibrationSample> samples;
  for (uint64_t i = 0; i < 3; ++i) chunks.push_back(chunk(g, seed + i));
  for (uint64_t i = 0; i < 3; ++i) samples.push_back({chunks[i].data(), int64_t(i + 1) * g.tokens});
  std::vector<std::byte> out(kernels::kvc1_calibration_bytes(g));
  size_t written = 0;
  EXPECT_TRUE(
      kernels::kvc1_calibrate(g, model, samples, reinterpret_cast<uint8_t*>(out.data()), out.size(), &written).ok());
  out.resize(written);
  return out;
}

TEST(ChunkCalibration, TransformChunkDecodesWhereItsCalibrationIsHeld) {
  const auto g = geometry();
  CalibrationCatalog writer;
  CalibrationRef cal;
  ASSERT_TRUE(writer.add(calibration(g, kModel, 10), nullptr, true, &cal).ok());
  ASSERT_EQ(writer.current(kModel), cal);
  EXPECT_EQ(writer.current(kOtherModel), nullptr);

  const auto c = chunk(g, 50);
  ChunkEncoding e;
  ASSERT_TRUE(encode_chunk(g, kModel, c.data(), kTransformCodecId, 0, &e, &cal->view));
  EXPECT_LT(e.bytes, c.size());
  std::vector<std::byte> out(c.size());
  ASSERT_TRUE(
      decode_chunk(e.blob.data(), e.bytes, kTransformCodecId, kModel, {}, out.data(), out.size(), &writer).ok());

  // Another node: without the calibration the chunk is a miss (kNotFound), not a wrong load.
  CalibrationCatalog reader;
  EXPECT_EQ(decode_chunk(e.blob.data(), e.bytes, kTransformCodecId, kModel, {}, out.data(), out.size(), &reader).code(),
            Code::kNotFound);
  EXPECT_EQ(decode_chunk(e.blob.data(), e.bytes, kTransformCodecId, kModel, {}, out.data(), out.size()).code(),
            Code::kNotFound);
  // Once it fetched the object (by the key the blob's calibration id gives), it decodes the same bytes.
  const kdn_key id = cal->view.id;
  ASSERT_TRUE(reader.add({cal->bytes.data(), cal->view.bytes}, &id, false).ok());
  std::vector<std::byte> again(c.size());
  ASSERT_TRUE(
      decode_chunk(e.blob.data(), e.bytes, kTransformCodecId, kModel, {}, again.data(), again.size(), &reader).ok());
  EXPECT_EQ(std::memcmp(out.data(), again.data(), out.size()), 0);
}

TEST(ChunkCalibration, EncodeNeedsTheModelsCalibration) {
  const auto g = geometry();
  CalibrationCatalog cat;
  CalibrationRef other;
  ASSERT_TRUE(cat.add(calibration(g, kOtherModel, 10), nullptr, true, &other).ok());
  const auto c = chunk(g, 50);
  ChunkEncoding e;
  EXPECT_FALSE(encode_chunk(g, kModel, c.data(), kTransformCodecId, 0, &e));
  EXPECT_FALSE(encode_chunk(g, kModel, c.data(), kTransformCodecId, 0, &e, &other->view));
  EXPECT_EQ(e.bytes, 0u);
}

TEST(ChunkCalibration, DamagedOrSwappedCalibrationIsRefused) {
  const auto g = geometry();
  auto a = calibration(g, kModel, 10);
  const auto b = calibration(g, kModel, 20);
  CalibrationCatalog cat;
  CalibrationRef ra, rb;
  {
    CalibrationCatalog scratch;
    ASSERT_TRUE(scratch.add(a, nullptr, false, &ra).ok());
    ASSERT_TRUE(scratch.add(b, nullptr, false, &rb).ok());
  }
  ASSERT_FALSE(ra->view.id == rb->view.id);
  const kdn_key want = ra->view.id;
  // Stored under a's key but holding b: refused, so a's blobs stay misses.
  EXPECT_EQ(cat.add(b, &want, false).code(), Code::kCorrupt);
  // One flipped byte anywhere: refused by the object's CRCs.
  for (size_t at : {size_t{0}, size_t{17}, a.size() / 2, a.size() - 1}) {
    auto bad = a;
    bad[at] ^= std::byte{0x40};
    EXPECT_FALSE(cat.add(bad, &want, false).ok()) << "byte " << at;
  }
  a.resize(a.size() - 4);
  EXPECT_FALSE(cat.add(a, nullptr, false).ok());
  EXPECT_FALSE(cat.add({}, nullptr, false).ok());
  EXPECT_EQ(cat.size(), 0u);
  EXPECT_EQ(cat.find(want), nullptr);
}

TEST(ChunkCalibration, StoreKeyIsItsOwnDomain) {
  const kdn_key id{7, 8};
  const kdn_key k = calibration_store_key(kModel, id);
  EXPECT_FALSE(k == id);
  EXPECT_FALSE(k == kModel);
  EXPECT_FALSE(k == calibration_store_key(kOtherModel, id));
  EXPECT_FALSE(k == calibration_store_key(kModel, kdn_key{8, 7}));
  EXPECT_TRUE(k == calibration_store_key(kModel, id));
  EXPECT_FALSE(k == chunk_hash(&id, sizeof(id)));
}

}  // namespace
}  // namespace kdn::sidecar
