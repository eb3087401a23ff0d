// Helpers shared by the codec tests: geometries, synthetic chunks, encode into vectors.
#pragma once

#include "format.h"

#include <kdn/kernels/codec.h>
#include <kdn/kernels/codec_transform.h>
#include <kdn/kernels/synthetic.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace kdn::kernels::testing {

inline ChunkGeometry geometry(uint32_t layers, uint32_t heads, uint32_t dim, uint32_t tokens,
                              DType dtype = DType::kF16) {
  ChunkGeometry g;
  g.layers = layers;
  g.kv_heads = heads;
  g.head_dim = dim;
  g.tokens = tokens;
  g.dtype = dtype;
  return g;
}

inline size_t geometry_bytes(const ChunkGeometry& g) {
  return size_t{g.layers} * 2 * g.tokens * g.kv_heads * g.head_dim * dtype_size(g.dtype);
}

constexpr kdn_key kTestFingerprint{0x0123456789abcdefull, 0xfedcba9876543210ull};

// Synthetic KV with outlier channels (kdn/kernels/synthetic.h).
inline std::vector<uint8_t> synthetic_chunk(const ChunkGeometry& g, uint64_t seed = 7) {
  std::vector<uint8_t> chunk(geometry_bytes(g));
  SyntheticKvParams p;
  p.seed = seed;
  EXPECT_TRUE(fill_synthetic_kv(chunk.data(), g, p).ok());
  return chunk;
}

// Four synthetic chunks (seeds seed..seed+3) and a calibration computed from them.
struct SyntheticCalibration {
  std::vector<std::vector<uint8_t>> chunks;
  std::vector<uint8_t> bytes;
  Kvc1Calibration view;
};

inline SyntheticCalibration synthetic_calibration(const ChunkGeometry& g, uint64_t seed) {
  SyntheticCalibration c;
  std::vector<Kvc1CalibrationSample> samples;
  for (uint32_t i = 0; i < 4; ++i) c.chunks.push_back(synthetic_chunk(g, seed + i));
  for (uint32_t i = 0; i < 4; ++i) samples.push_back({c.chunks[i].data(), int64_t{i} * g.tokens});
  c.bytes.resize(kvc1_calibration_bytes(g));
  size_t written = 0;
  EXPECT_TRUE(kvc1_calibrate(g, kTestFingerprint, samples, c.bytes.data(), c.bytes.size(), &written).ok());
  EXPECT_TRUE(kvc1_calibration_open(c.bytes.data(), c.bytes.size(), &c.view).ok());
  return c;
}

// Encodes or fails the test; returns the blob sized to what was written.
inline std::vector<uint8_t> encode(const ChunkGeometry& g, const void* chunk, const CodecConfig& cfg,
                                   kdn_key fp = kTestFingerprint) {
  const size_t cap = kvc1_max_encoded_size(g, cfg);
  EXPECT_GT(cap, 0u);
  std::vector<uint8_t> out(cap);
  std::vector<uint8_t> scratch(kvc1_encode_scratch_bytes(g, cfg));
  size_t written = 0;
  const Status st = kvc1_encode(g, fp, chunk, cfg, out.data(), out.size(), &written, scratch.data(), scratch.size());
  EXPECT_TRUE(st.ok()) << st.what();
  out.resize(st.ok() ? written : 0);
  return out;
}

inline CodecConfig config(CodecMode mode) {
  CodecConfig c;
  c.mode = mode;
  return c;
}

// A config without sink rows: blobs of minor 0 (or 1 with rotate), as before they existed.
inline CodecConfig no_sinks(CodecMode mode) {
  CodecConfig c = config(mode);
  c.sink_tokens = 0;
  return c;
}

constexpr CodecMode kAllModes[] = {CodecMode::kRaw, CodecMode::kLossless, CodecMode::kInt8, CodecMode::kKivi4,
                                   CodecMode::kKivi2};

// Offset of a rANS word in the middle of the first block of the V plane's first segment of
// layer 0, or 0 if that segment is not rANS-coded.
inline size_t v_rans_word_offset(const std::vector<uint8_t>& blob) {
  kvc1::Header h;
  kvc1::Plane pl[2];
  kvc1::Segment sg;
  kvc1::Block bk;
  if (kvc1::parse_header(blob.data(), blob.size(), &h) != kvc1::kParseOk ||
      kvc1::locate_planes(blob.data(), h, 0, pl) != kvc1::kParseOk ||
      kvc1::parse_segment(blob.data(), h, pl[1], 0, &sg) != kvc1::kParseOk || sg.coding != kvc1::kCodingRans ||
      kvc1::parse_block(blob.data(), sg, 0, &bk) != kvc1::kParseOk || bk.n_words == 0)
    return 0;
  return static_cast<size_t>(bk.words_off) + 2 * (bk.n_words / 2);
}

}  // namespace kdn::kernels::testing
