// kvc1_encode / kvc1_decode through the public API: round trips, error bounds, options and
// every error path the header promises.
#include "codec_test_util.h"
#include "crc32c.h"
#include "format.h"
#include "quant.h"
#include "validate.h"

#include <kdn/kernels/codec.h>
#include <kdn/kernels/dtype.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

namespace kdn::kernels {
namespace {

using testing::config;
using testing::encode;
using testing::geometry;
using testing::geometry_bytes;
using testing::kAllModes;
using testing::kTestFingerprint;
using testing::no_sinks;
using testing::synthetic_chunk;

std::vector<uint8_t> decode_ok(const std::vector<uint8_t>& blob, const ChunkGeometry& g, DecodeOptions opts = {}) {
  std::vector<uint8_t> out(geometry_bytes(g));
  const Status st = kvc1_decode(blob.data(), blob.size(), g, kTestFingerprint, out.data(), out.size(), opts);
  EXPECT_TRUE(st.ok()) << st.what();
  return out;
}

Code decode_code(const std::vector<uint8_t>& blob, const ChunkGeometry& g, DecodeOptions opts = {},
                 kdn_key fp = kTestFingerprint) {
  std::vector<uint8_t> out(geometry_bytes(g));
  return kvc1_decode(blob.data(), blob.size(), g, fp, out.data(), out.size(), opts).code();
}

// Stored scale S' of element (layer, plane, t, h, d) of a quantized blob.
float stored_scale(const std::vector<uint8_t>& blob, uint32_t layer, uint32_t plane, uint32_t t, uint32_t h,
                   uint32_t d) {
  kvc1::Header hdr;
  kvc1::Plane pl[2];
  EXPECT_EQ(kvc1::parse_header(blob.data(), blob.size(), &hdr), kvc1::kParseOk);
  EXPECT_EQ(kvc1::locate_planes(blob.data(), hdr, layer, pl), kvc1::kParseOk);
  uint64_t s_off, z_off;
  kvc1::row_scale_offsets(hdr, pl[plane], t, h, &s_off, &z_off);
  const uint32_t per = pl[plane].codec == kvc1::kCodecUintChannel ? 1 : pl[plane].group;
  return kvc1::load_scale(blob.data() + pl[plane].params_off + s_off, d / per, pl[plane].scale_dtype);
}

// Spacing of dtype values at |v|.
float ulp_of(float v, DType t) {
  const int mant = t == DType::kF16 ? 10 : t == DType::kBF16 ? 7 : 23;
  const int min_exp = t == DType::kF16 ? -14 : -126;
  const int e = v == 0.0f ? min_exp : std::max(std::ilogb(v), min_exp);
  return std::ldexp(1.0f, e - mant);
}

bool quantized(CodecMode m) { return m != CodecMode::kRaw && m != CodecMode::kLossless; }

TEST(Codec, RoundTripEveryModeDtypeAndShape) {
  const ChunkGeometry shapes[] = {geometry(2, 3, 64, 256), geometry(3, 2, 80, 37), geometry(1, 1, 32, 1),
                                  geometry(2, 1, 7, 5)};
  for (ChunkGeometry g : shapes) {
    for (DType dt : {DType::kF16, DType::kBF16, DType::kF32}) {
      g.dtype = dt;
      const std::vector<uint8_t> chunk = synthetic_chunk(g);
      for (CodecMode m : kAllModes) {
        SCOPED_TRACE(::testing::Message() << codec_mode_name(m) << " D=" << g.head_dim << " T=" << g.tokens
                                          << " dtype=" << static_cast<int>(dt));
        const std::vector<uint8_t> blob = encode(g, chunk.data(), config(m));
        const std::vector<uint8_t> out = decode_ok(blob, g);
        if (!quantized(m)) {
          EXPECT_EQ(out, chunk);
          continue;
        }
        const CodecQuality q = kvc1_quality(g, chunk.data(), out.data(), blob.size());
        const double min_cos = m == CodecMode::kInt8 ? 0.9999 : m == CodecMode::kKivi4 ? 0.99 : 0.9;
        EXPECT_GE(q.cosine_min, min_cos);
      }
    }
  }
}

// |x - x^| <= S'/2 + ulp of the output dtype, element by element, S' read from the blob.
TEST(Codec, QuantizerErrorBoundHoldsForEveryElement) {
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    const ChunkGeometry g = geometry(2, 2, 64, 100, dt);
    const std::vector<uint8_t> chunk = synthetic_chunk(g, 3);
    for (CodecMode m : {CodecMode::kInt8, CodecMode::kKivi4, CodecMode::kKivi2}) {
      const std::vector<uint8_t> blob = encode(g, chunk.data(), config(m));
      const std::vector<uint8_t> out = decode_ok(blob, g);
      for (uint32_t l = 0; l < g.layers; ++l)
        for (uint32_t p = 0; p < 2; ++p)
          for (uint32_t t = 0; t < g.tokens; ++t)
            for (uint32_t h = 0; h < g.kv_heads; ++h)
              for (uint32_t d = 0; d < g.head_dim; ++d) {
                const int64_t i = chunk_offset(g, l, p, t, h, d);
                const float x = load_f32(chunk.data(), i, dt, 1.0f), xh = load_f32(out.data(), i, dt, 1.0f);
                const float s = stored_scale(blob, l, p, t, h, d);
                // ulp terms: the output rounding, and the f32 arithmetic of (x - Z) / S (q <= 255).
                const float slack = ulp_of(xh, dt) + 2 * ulp_of(std::max(std::fabs(x), 256 * s), DType::kF32);
                ASSERT_LE(std::fabs(x - xh), s / 2 + slack)
                    << codec_mode_name(m) << " l=" << l << " p=" << p << " t=" << t << " h=" << h << " d=" << d;
              }
    }
  }
}

// K constant along tokens per channel, V constant along channels per token: every K and V
// group is constant, and f16 holds the values, so decoding is exact.
TEST(Codec, ConstantGroupsDecodeExactly) {
  const ChunkGeometry g = geometry(2, 2, 32, 64);
  std::vector<uint8_t> chunk(geometry_bytes(g));
  auto* v = reinterpret_cast<uint16_t*>(chunk.data());
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t t = 0; t < g.tokens; ++t)
      for (uint32_t h = 0; h < g.kv_heads; ++h)
        for (uint32_t d = 0; d < g.head_dim; ++d) {
          v[chunk_offset(g, l, 0, t, h, d)] = f32_to_f16(d % 3 == 0 ? 0.75f : -2.5f * static_cast<float>(d + h));
          v[chunk_offset(g, l, 1, t, h, d)] = f32_to_f16(0.125f * static_cast<float>(t) - 3.0f);
        }
  for (CodecMode m : {CodecMode::kKivi4, CodecMode::kKivi2})
    EXPECT_EQ(decode_ok(encode(g, chunk.data(), config(m)), g), chunk);
}

TEST(Codec, EntropyCodingNeverChangesTheDecodeAndNeverGrows) {
  const ChunkGeometry g = geometry(2, 3, 64, 256);
  const std::vector<uint8_t> chunk = synthetic_chunk(g, 5);
  for (CodecMode m : kAllModes) {
    CodecConfig packed = config(m);
    packed.entropy = false;
    const std::vector<uint8_t> a = encode(g, chunk.data(), config(m));
    const std::vector<uint8_t> b = encode(g, chunk.data(), packed);
    EXPECT_LE(a.size(), b.size()) << codec_mode_name(m);
    EXPECT_EQ(decode_ok(a, g), decode_ok(b, g)) << codec_mode_name(m);
  }
}

TEST(Codec, ParallelAndLayerRangeDecodes) {
  const ChunkGeometry g = geometry(4, 3, 64, 128);
  const std::vector<uint8_t> chunk = synthetic_chunk(g, 6);
  for (CodecMode m : kAllModes) {
    const std::vector<uint8_t> blob = encode(g, chunk.data(), config(m));
    const std::vector<uint8_t> serial = decode_ok(blob, g);
    DecodeOptions all, two;
    all.cpu_threads = 0;
    two.cpu_threads = 2;
    EXPECT_EQ(decode_ok(blob, g, all), serial);
    EXPECT_EQ(decode_ok(blob, g, two), serial);
    DecodeOptions range;
    range.layers = {1, 3};
    std::vector<uint8_t> part(geometry_bytes(g), 0xab);
    ASSERT_TRUE(kvc1_decode(blob.data(), blob.size(), g, kTestFingerprint, part.data(), part.size(), range).ok());
    const size_t layer_bytes = part.size() / g.layers;
    for (size_t i = 0; i < part.size(); ++i) {
      const size_t l = i / layer_bytes;
      ASSERT_EQ(part[i], (l == 1 || l == 2) ? serial[i] : 0xab) << i;
    }
  }
}

TEST(Codec, PerLayerBitWidths) {
  const ChunkGeometry g = geometry(3, 2, 64, 128);
  const std::vector<uint8_t> chunk = synthetic_chunk(g, 8);
  const uint8_t k_bits[3] = {8, 4, 2}, v_bits[3] = {8, 3, 2};
  CodecConfig cfg = config(CodecMode::kKivi4);
  cfg.layer_k_bits = k_bits;
  cfg.layer_v_bits = v_bits;
  const std::vector<uint8_t> blob = encode(g, chunk.data(), cfg);
  kvc1::Header h;
  ASSERT_EQ(kvc1::parse_header(blob.data(), blob.size(), &h), kvc1::kParseOk);
  for (uint32_t l = 0; l < 3; ++l) {
    kvc1::LayerEntry e;
    ASSERT_EQ(kvc1::parse_layer_entry(blob.data(), h, l, &e), kvc1::kParseOk);
    EXPECT_EQ(e.bits[0], k_bits[l]);
    EXPECT_EQ(e.bits[1], v_bits[l]);
  }
  const std::vector<uint8_t> out = decode_ok(blob, g);
  // More bits, less error: compare layer by layer.
  double err[3];
  for (uint32_t l = 0; l < 3; ++l) {
    ChunkGeometry one = g;
    one.layers = 1;
    const size_t off = geometry_bytes(g) / 3 * l;
    err[l] = kvc1_quality(one, chunk.data() + off, out.data() + off, 1).rel_frobenius_error;
  }
  EXPECT_LT(err[0], err[1]);
  EXPECT_LT(err[1], err[2]);
}

TEST(Codec, NonFiniteValuesRejectedByQuantizersCarriedByLossless) {
  const ChunkGeometry g = geometry(1, 1, 32, 16);
  std::vector<uint8_t> chunk = synthetic_chunk(g);
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    std::vector<uint8_t> c = chunk;
    reinterpret_cast<uint16_t*>(c.data())[600] = f32_to_f16(bad);
    for (CodecMode m : {CodecMode::kInt8, CodecMode::kKivi4, CodecMode::kKivi2}) {
      const CodecConfig cfg = config(m);
      std::vector<uint8_t> out(kvc1_max_encoded_size(g, cfg)), scratch(kvc1_encode_scratch_bytes(g, cfg));
      size_t n = 0;
      EXPECT_EQ(
          kvc1_encode(g, kTestFingerprint, c.data(), cfg, out.data(), out.size(), &n, scratch.data(), scratch.size())
              .code(),
          Code::kInvalidArgument);
    }
    EXPECT_EQ(decode_ok(encode(g, c.data(), config(CodecMode::kLossless)), g), c);
  }
}

TEST(Codec, CrcMismatchIsRejected) {
  const ChunkGeometry g = geometry(2, 2, 64, 64);
  const std::vector<uint8_t> chunk = synthetic_chunk(g);
  for (CodecMode m : kAllModes) {
    const std::vector<uint8_t> blob = encode(g, chunk.data(), config(m));
    for (size_t pos : {size_t{5}, size_t{130}, blob.size() / 2, blob.size() - 1}) {
      std::vector<uint8_t> bad = blob;
      bad[pos] ^= 0x10;
      EXPECT_EQ(decode_code(bad, g), Code::kCorrupt) << codec_mode_name(m) << " byte " << pos;
    }
  }
}

// An exponent reference below an element's exponent can only come from corruption: the decoder
// must notice (here with CRCs off, so that the change reaches it).
TEST(Codec, LosslessRejectsExponentsAboveTheirReference) {
  for (DType dt : {DType::kF16, DType::kBF16, DType::kF32}) {
    const ChunkGeometry g = geometry(1, 1, 64, 32, dt);
    std::vector<uint8_t> blob = encode(g, synthetic_chunk(g).data(), config(CodecMode::kLossless));
    kvc1::Header h;
    kvc1::Plane pl[2];
    ASSERT_EQ(kvc1::parse_header(blob.data(), blob.size(), &h), kvc1::kParseOk);
    ASSERT_EQ(kvc1::locate_planes(blob.data(), h, 0, pl), kvc1::kParseOk);
    ASSERT_EQ(pl[0].codec, kvc1::kCodecBytePlanes);
    for (uint32_t d = 0; d < g.head_dim; ++d) blob[pl[0].params_off + d] = 0;  // emax[0][d]
    DecodeOptions no_crc;
    no_crc.verify_crc = false;
    EXPECT_EQ(decode_code(blob, g, no_crc), Code::kCorrupt) << static_cast<int>(dt);
  }
}

TEST(Codec, WrongModelOrGeometryIsAMismatch) {
  const ChunkGeometry g = geometry(2, 2, 64, 64);
  const std::vector<uint8_t> blob = encode(g, synthetic_chunk(g).data(), config(CodecMode::kKivi4));
  EXPECT_EQ(decode_code(blob, g, {}, kdn_key{1, 2}), Code::kModelMismatch);
  ChunkGeometry other = g;
  other.tokens = 63;
  EXPECT_EQ(decode_code(blob, other), Code::kModelMismatch);
  other = g;
  other.dtype = DType::kBF16;
  EXPECT_EQ(decode_code(blob, other), Code::kModelMismatch);
}

TEST(Codec, EveryTruncationIsRejected) {
  const ChunkGeometry g = geometry(2, 1, 32, 40);
  const std::vector<uint8_t> blob = encode(g, synthetic_chunk(g).data(), config(CodecMode::kKivi4));
  std::vector<uint8_t> out(geometry_bytes(g));
  for (size_t n = 0; n < blob.size(); ++n)
    ASSERT_EQ(kvc1_decode(blob.data(), n, g, kTestFingerprint, out.data(), out.size()).code(), Code::kCorrupt) << n;
}

CodecConfig rotated(CodecMode m) {
  CodecConfig c = config(m);
  c.rotate = true;
  return c;
}

// Rotated rows: x^ = H y^ / n with |y_j - y^_j| <= S_j / 2, so each element of a row is off by
// at most the mean of S_j / 2 over the row (plus f32 and output rounding).
TEST(Codec, RotatedRowsStayWithinTheMeanHalfScaleOfTheirRow) {
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    const ChunkGeometry g = geometry(2, 2, 64, 100, dt);
    const std::vector<uint8_t> chunk = synthetic_chunk(g, 5);
    for (CodecMode m : {CodecMode::kInt8, CodecMode::kKivi4, CodecMode::kKivi2}) {
      const std::vector<uint8_t> blob = encode(g, chunk.data(), rotated(m));
      const std::vector<uint8_t> out = decode_ok(blob, g);
      for (uint32_t l = 0; l < g.layers; ++l)
        for (uint32_t p = 0; p < 2; ++p)
          for (uint32_t t = 0; t < g.tokens; ++t)
            for (uint32_t h = 0; h < g.kv_heads; ++h) {
              double half_scales = 0, row_max = 0;
              float s_max = 0;
              for (uint32_t j = 0; j < g.head_dim; ++j) {
                const float s = stored_scale(blob, l, p, t, h, j);
                half_scales += s / 2;
                s_max = std::max(s_max, s);
                row_max = std::max(row_max,
                                   std::fabs(double{load_f32(chunk.data(), chunk_offset(g, l, p, t, h, j), dt, 1.0f)}));
              }
              const double bound = half_scales / g.head_dim;
              for (uint32_t d = 0; d < g.head_dim; ++d) {
                const int64_t i = chunk_offset(g, l, p, t, h, d);
                const float x = load_f32(chunk.data(), i, dt, 1.0f), xh = load_f32(out.data(), i, dt, 1.0f);
                // The output rounding, the quantizer's f32 arithmetic, and both transforms' f32
                // sums (about log2(n) roundings of values up to n * row_max, divided by n).
                const double slack = ulp_of(xh, dt) + 2 * ulp_of(256 * s_max, DType::kF32) + 1e-5 * row_max;
                ASSERT_LE(std::fabs(double{x} - xh), bound + slack)
                    << codec_mode_name(m) << " l=" << l << " p=" << p << " t=" << t << " h=" << h << " d=" << d;
              }
            }
    }
  }
}

TEST(Codec, RotatedBlobsAreMinorVersion1WithEveryPlanePerTokenAndHadamard) {
  const ChunkGeometry g = geometry(2, 2, 32, 40);
  const std::vector<uint8_t> chunk = synthetic_chunk(g);
  const std::vector<uint8_t> plain = encode(g, chunk.data(), no_sinks(CodecMode::kKivi4));
  CodecConfig rc = rotated(CodecMode::kKivi4);
  rc.sink_tokens = 0;
  const std::vector<uint8_t> rot = encode(g, chunk.data(), rc);
  EXPECT_EQ(kvc1::ld16(plain.data() + kvc1::kHfVersionMinor), 0);
  EXPECT_EQ(kvc1::ld16(rot.data() + kvc1::kHfVersionMinor), kvc1::kVersionMinorTransform);
  kvc1::Header h;
  ASSERT_EQ(kvc1::parse_header(rot.data(), rot.size(), &h), kvc1::kParseOk);
  for (uint32_t l = 0; l < g.layers; ++l) {
    kvc1::Plane pl[2];
    ASSERT_EQ(kvc1::locate_planes(rot.data(), h, l, pl), kvc1::kParseOk);
    for (const kvc1::Plane& p : pl) {
      EXPECT_EQ(p.codec, kvc1::kCodecUintToken);
      EXPECT_EQ(p.transform, kvc1::kTransformHadamard);
      EXPECT_EQ(p.bits, 4);
    }
  }
  // Rotating changes what is stored, not how well the decode matches: same mode, same size class.
  const CodecQuality q = kvc1_quality(g, chunk.data(), decode_ok(rot, g).data(), rot.size());
  EXPECT_GE(q.cosine_min, 0.99);
}

// The transform byte is checked where it is read: unknown values, a transform on a
// per-channel plane, and a transformed plane in a minor-0 blob are all corrupt (CRCs redone,
// so the structure checks are what must catch them).
// Recomputes the CRCs of a one-layer blob after an edit, so the structure checks behind them
// are what must catch it.
void recrc(std::vector<uint8_t>& b) {
  kvc1::Header h;
  ASSERT_EQ(kvc1::parse_header(b.data(), b.size(), &h), kvc1::kParseOk);
  const uint8_t* e = b.data() + h.dir_off;
  const uint64_t off = kvc1::ld64(e), bytes = kvc1::ld64(e + 8);
  const uint32_t layer_crc = kvc1::crc32c(b.data() + off, bytes);
  std::memcpy(b.data() + h.dir_off + 16, &layer_crc, 4);
  const uint32_t dir_crc = kvc1::crc32c(b.data() + h.dir_off, h.dir_bytes);
  std::memcpy(b.data() + kvc1::kHfDirCrc, &dir_crc, 4);
  const uint32_t hdr_crc = kvc1::crc32c(b.data(), kvc1::kHeaderCrcOffset);
  std::memcpy(b.data() + kvc1::kHfHeaderCrc, &hdr_crc, 4);
}

// Plane `plane` of layer 0.
kvc1::Plane plane_of(const std::vector<uint8_t>& b, uint32_t plane) {
  kvc1::Header h;
  kvc1::Plane pl[2];
  EXPECT_EQ(kvc1::parse_header(b.data(), b.size(), &h), kvc1::kParseOk);
  EXPECT_EQ(kvc1::locate_planes(b.data(), h, 0, pl), kvc1::kParseOk);
  return pl[plane];
}

TEST(Codec, BadTransformBytesAreCorrupt) {
  const ChunkGeometry g = geometry(1, 1, 32, 16);
  const std::vector<uint8_t> chunk = synthetic_chunk(g);
  auto k_plane = [](const std::vector<uint8_t>& b) { return plane_of(b, 0).offset; };
  const std::vector<uint8_t> rot = encode(g, chunk.data(), rotated(CodecMode::kKivi4));
  std::vector<uint8_t> b = rot;
  recrc(b);
  ASSERT_EQ(b, rot);  // the CRC helper reproduces the encoder's CRCs
  b[k_plane(b) + 3] = 2;
  recrc(b);
  EXPECT_EQ(decode_code(b, g), Code::kCorrupt);
  b = rot;
  b[kvc1::kHfVersionMinor] = 0;
  recrc(b);
  EXPECT_EQ(decode_code(b, g), Code::kCorrupt);
  b = encode(g, chunk.data(), no_sinks(CodecMode::kKivi4));
  b[kvc1::kHfVersionMinor] = 1;
  b[k_plane(b) + 3] = kvc1::kTransformHadamard;  // K is per channel in plain kivi4
  recrc(b);
  EXPECT_EQ(decode_code(b, g), Code::kCorrupt);
}

TEST(Codec, UnknownMajorVersionIsRejected) {
  const ChunkGeometry g = geometry(1, 1, 32, 8);
  std::vector<uint8_t> blob = encode(g, synthetic_chunk(g).data(), config(CodecMode::kRaw));
  blob[kvc1::kHfVersionMajor] = 2;
  EXPECT_EQ(decode_code(blob, g), Code::kVersion);
  Kvc1Info info;
  EXPECT_EQ(kvc1_inspect(blob.data(), blob.size(), &info).code(), Code::kVersion);
}

TEST(Codec, CapacityAndScratchChecks) {
  const ChunkGeometry g = geometry(2, 2, 64, 64);
  const std::vector<uint8_t> chunk = synthetic_chunk(g);
  for (CodecMode m : kAllModes) {
    const CodecConfig cfg = config(m);
    const std::vector<uint8_t> blob = encode(g, chunk.data(), cfg);
    EXPECT_LE(blob.size(), kvc1_max_encoded_size(g, cfg));
    std::vector<uint8_t> out(blob.size()), scratch(kvc1_encode_scratch_bytes(g, cfg));
    size_t n = 0;
    EXPECT_TRUE(
        kvc1_encode(g, kTestFingerprint, chunk.data(), cfg, out.data(), out.size(), &n, scratch.data(), scratch.size())
            .ok());
    EXPECT_EQ(out, blob);  // deterministic
    EXPECT_EQ(kvc1_encode(g, kTestFingerprint, chunk.data(), cfg, out.data(), out.size() - 1, &n, scratch.data(),
                          scratch.size())
                  .code(),
              Code::kNoSpace);
    EXPECT_EQ(kvc1_encode(g, kTestFingerprint, chunk.data(), cfg, out.data(), out.size(), &n, scratch.data(),
                          scratch.size() - 1)
                  .code(),
              Code::kInvalidArgument);
    std::vector<uint8_t> small(geometry_bytes(g) - 1);
    EXPECT_EQ(kvc1_decode(blob.data(), blob.size(), g, kTestFingerprint, small.data(), small.size()).code(),
              Code::kInvalidArgument);
  }
}

TEST(Codec, IncompressibleDataStaysWithinTheBound) {
  const ChunkGeometry g = geometry(1, 2, 64, 64, DType::kF32);
  std::vector<uint8_t> chunk(geometry_bytes(g));
  uint64_t s = 99;
  auto* f = reinterpret_cast<float*>(chunk.data());
  for (size_t i = 0; i < chunk.size() / 4; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    f[i] = std::ldexp(static_cast<float>(s >> 40) / 16777216.0f - 0.5f, static_cast<int>(s >> 59) % 30 - 15);
  }
  for (CodecMode m : kAllModes) {
    const std::vector<uint8_t> blob = encode(g, chunk.data(), config(m));
    EXPECT_LE(blob.size(), kvc1_max_encoded_size(g, config(m)));
    if (!quantized(m)) {
      EXPECT_EQ(decode_ok(blob, g), chunk);
    }
  }
}

TEST(Codec, ConfigValidation) {
  const ChunkGeometry g = geometry(2, 2, 64, 64);
  CodecConfig c = config(CodecMode::kKivi4);
  c.v_group_channels = 48;
  EXPECT_EQ(kvc1_max_encoded_size(g, c), 0u);
  c = config(CodecMode::kKivi4);
  c.k_bits = 9;
  EXPECT_EQ(kvc1_max_encoded_size(g, c), 0u);
  c = config(CodecMode::kLossless);
  c.k_bits = 4;
  EXPECT_EQ(kvc1_max_encoded_size(g, c), 0u);
  c = config(static_cast<CodecMode>(9));
  EXPECT_EQ(kvc1_max_encoded_size(g, c), 0u);
  c = config(CodecMode::kLossless);
  c.rotate = true;  // nothing to rotate without a quantizer
  EXPECT_EQ(kvc1_max_encoded_size(g, c), 0u);
  c = config(CodecMode::kKivi4);
  c.rotate = true;
  EXPECT_GT(kvc1_max_encoded_size(g, c), 0u);
  EXPECT_EQ(kvc1_max_encoded_size(geometry(2, 2, 80, 64), c), 0u);  // head_dim not a power of two
  ChunkGeometry fp8 = g;
  fp8.dtype = DType::kFP8E4M3;
  EXPECT_EQ(kvc1_max_encoded_size(fp8, config(CodecMode::kKivi4)), 0u);
  std::vector<uint8_t> raw(geometry_bytes(fp8));
  for (size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<uint8_t>(i * 37);
  EXPECT_EQ(decode_ok(encode(fp8, raw.data(), config(CodecMode::kRaw)), fp8), raw);
}

TEST(Codec, LargeValuesSwitchThePlaneToF32Scales) {
  const ChunkGeometry g = geometry(1, 1, 32, 64, DType::kF32);
  std::vector<uint8_t> chunk = synthetic_chunk(g);
  auto* f = reinterpret_cast<float*>(chunk.data());
  f[3] = 2e6f;  // K plane, beyond f16
  const std::vector<uint8_t> blob = encode(g, chunk.data(), no_sinks(CodecMode::kKivi4));
  kvc1::Header h;
  kvc1::Plane pl[2];
  ASSERT_EQ(kvc1::parse_header(blob.data(), blob.size(), &h), kvc1::kParseOk);
  ASSERT_EQ(kvc1::locate_planes(blob.data(), h, 0, pl), kvc1::kParseOk);
  EXPECT_EQ(pl[0].scale_dtype, kvc1::kScaleF32);
  EXPECT_EQ(pl[1].scale_dtype, kvc1::kScaleF16);
  const std::vector<uint8_t> out = decode_ok(blob, g);
  EXPECT_LE(std::fabs(reinterpret_cast<const float*>(out.data())[3] - 2e6f), stored_scale(blob, 0, 0, 0, 0, 3) / 2 + 1);
}

TEST(Codec, InspectReportsTheHeader) {
  const ChunkGeometry g = geometry(3, 2, 64, 50, DType::kBF16);
  CodecConfig c = config(CodecMode::kKivi2);
  c.pos_base = 4096;
  c.chunk_key = kdn_key{7, 8};
  c.block_tokens = 16;
  const std::vector<uint8_t> blob = encode(g, synthetic_chunk(g).data(), c);
  Kvc1Info info;
  ASSERT_TRUE(kvc1_inspect(blob.data(), blob.size(), &info).ok());
  EXPECT_EQ(info.version_major, 1);
  EXPECT_EQ(info.total_bytes, blob.size());
  EXPECT_EQ(info.geometry.layers, 3u);
  EXPECT_EQ(info.geometry.tokens, 50u);
  EXPECT_EQ(info.geometry.dtype, DType::kBF16);
  EXPECT_EQ(info.fingerprint.lo, kTestFingerprint.lo);
  EXPECT_EQ(info.mode, CodecMode::kKivi2);
  EXPECT_EQ(info.block_tokens, 16u);
  EXPECT_EQ(info.pos_base, 4096);
  EXPECT_EQ(info.chunk_key.hi, 8u);
  EXPECT_EQ(decode_code(blob, g), Code::kOk);  // several rANS blocks per segment
}

// The 4-bit packed layout's size is structural: codes plus f16 scales (K groups of 128 tokens,
// V groups of head_dim channels) plus framing. A chunk that starts its sequence also carries its
// sink rows at f16 (4 of 256 tokens: 6% more at 4 bits), so this is a later chunk.
TEST(Codec, Kivi4PackedRatioIsAtLeast3p5) {
  const ChunkGeometry g = geometry(30, 3, 64, 256);
  const std::vector<uint8_t> chunk = synthetic_chunk(g, 10);
  CodecConfig c = config(CodecMode::kKivi4);
  c.pos_base = 256;
  c.entropy = false;
  const std::vector<uint8_t> blob = encode(g, chunk.data(), c);
  EXPECT_GE(kvc1_quality(g, chunk.data(), chunk.data(), blob.size()).ratio_vs_fp16, 3.5);
}

// Sink rows: in a chunk at position 0 the first sink_tokens rows of every quantized plane are
// stored exactly (bit for bit, any dtype, rotated or not), minor 2; later chunks, sink_tokens 0
// and lossless modes leave blobs as before.
TEST(Codec, SinkRowsOfASequenceStartDecodeBitExact) {
  for (DType dt : {DType::kF16, DType::kBF16, DType::kF32})
    for (CodecMode m : {CodecMode::kInt8, CodecMode::kKivi4, CodecMode::kKivi2})
      for (bool rot : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << "dtype " << static_cast<int>(dt) << " mode " << static_cast<int>(m) << " rotate " << rot);
        const ChunkGeometry g = geometry(2, 3, 32, 40, dt);
        const std::vector<uint8_t> chunk = synthetic_chunk(g, 11);
        CodecConfig c = rot ? rotated(m) : config(m);
        const std::vector<uint8_t> blob = encode(g, chunk.data(), c);
        EXPECT_EQ(kvc1::ld16(blob.data() + kvc1::kHfVersionMinor), kvc1::kVersionMinorExact);
        EXPECT_EQ(plane_of(blob, 0).exact_tokens, kDefaultSinkTokens);
        EXPECT_EQ(plane_of(blob, 1).exact_tokens, kDefaultSinkTokens);
        const std::vector<uint8_t> out = decode_ok(blob, g);
        const size_t row = size_t{g.head_dim} * dtype_size(g.dtype);
        size_t differing_later_rows = 0;
        for (uint32_t l = 0; l < g.layers; ++l)
          for (uint32_t p = 0; p < 2; ++p)
            for (uint32_t t = 0; t < g.tokens; ++t)
              for (uint32_t h = 0; h < g.kv_heads; ++h) {
                const size_t at = static_cast<size_t>(chunk_offset(g, l, p, t, h, 0)) * dtype_size(g.dtype);
                const bool same = std::memcmp(out.data() + at, chunk.data() + at, row) == 0;
                if (t < kDefaultSinkTokens)
                  EXPECT_TRUE(same) << "layer " << l << " plane " << p << " token " << t;
                else
                  differing_later_rows += !same;
              }
        EXPECT_GT(differing_later_rows, 0u);  // the other rows are quantized
        c.pos_base = 40;
        const std::vector<uint8_t> later = encode(g, chunk.data(), c);
        EXPECT_EQ(plane_of(later, 0).exact_tokens, 0u);
        EXPECT_LT(later.size(), blob.size());
        c.pos_base = 0;
        c.sink_tokens = 0;
        const std::vector<uint8_t> off = encode(g, chunk.data(), c);
        EXPECT_EQ(off.size(), later.size());
        EXPECT_EQ(kvc1::ld16(off.data() + kvc1::kHfVersionMinor), rot ? kvc1::kVersionMinorTransform : 0);
      }
  const ChunkGeometry g = geometry(1, 2, 32, 8);
  const std::vector<uint8_t> chunk = synthetic_chunk(g);
  CodecConfig all = config(CodecMode::kKivi2);
  all.sink_tokens = 100;  // more than the chunk: every row exact
  const std::vector<uint8_t> blob = encode(g, chunk.data(), all);
  EXPECT_EQ(plane_of(blob, 1).exact_tokens, g.tokens);
  EXPECT_EQ(decode_ok(blob, g), chunk);
  EXPECT_EQ(encode(g, chunk.data(), config(CodecMode::kLossless)),
            encode(g, chunk.data(), no_sinks(CodecMode::kLossless)));
}

// Exact rows are left out of the quantizer ranges: a huge first token does not coarsen the
// steps of the tokens that share its K group or its V row scale.
TEST(Codec, SinkRowsStayOutOfTheQuantizerRanges) {
  const ChunkGeometry g = geometry(1, 1, 32, 64, DType::kF32);
  std::vector<uint8_t> chunk = synthetic_chunk(g);
  auto* f = reinterpret_cast<float*>(chunk.data());
  const size_t plane_elems = size_t{g.tokens} * g.head_dim;
  for (uint32_t d = 0; d < g.head_dim; ++d) f[d] = f[plane_elems + d] = 5000.0f;  // token 0 of K and V
  const std::vector<uint8_t> with = encode(g, chunk.data(), config(CodecMode::kKivi4));
  const std::vector<uint8_t> without = encode(g, chunk.data(), no_sinks(CodecMode::kKivi4));
  const std::vector<uint8_t> a = decode_ok(with, g), b = decode_ok(without, g);
  const float* fa = reinterpret_cast<const float*>(a.data());
  const float* fb = reinterpret_cast<const float*>(b.data());
  double err_with = 0, err_without = 0;
  for (size_t i = 0; i < 2 * plane_elems; ++i) {
    if (i % plane_elems < size_t{kDefaultSinkTokens} * g.head_dim) {
      EXPECT_EQ(fa[i], f[i]);
      continue;
    }
    err_with = std::max(err_with, std::fabs(double{fa[i]} - f[i]));
    err_without = std::max(err_without, std::fabs(double{fb[i]} - f[i]));
  }
  EXPECT_GT(err_without, 100.0);  // up to 5000 / 15 / 2 in token 0's K group and V rows
  EXPECT_LT(err_with * 10, err_without);
  EXPECT_LT(stored_scale(with, 0, 0, 4, 0, 0) * 10, stored_scale(without, 0, 0, 4, 0, 0));
  EXPECT_EQ(stored_scale(with, 0, 1, 3, 0, 0), 0.0f);
  EXPECT_GT(stored_scale(with, 0, 1, 4, 0, 0), 0.0f);
}

// Expects a copy of `good` to decode as kCorrupt once `edit` changed it (CRCs redone).
template <class Edit>
void expect_corrupt_after(const std::vector<uint8_t>& good, const ChunkGeometry& g, const char* what, Edit&& edit) {
  std::vector<uint8_t> b = good;
  edit(b);
  recrc(b);
  EXPECT_EQ(decode_code(b, g), Code::kCorrupt) << what;
}

// The exact-row fields are checked like every other: a count beyond the chunk, exact rows in a
// minor-1 blob, a non-zero scale on an exact row, NaN in an exact row, non-zero padding before
// the rows, and a count on a lossless plane are corrupt (CRCs redone).
TEST(Codec, BadExactRowsAreCorrupt) {
  const ChunkGeometry g = geometry(1, 1, 32, 18);  // V's scales end 8 bytes short of 16-alignment
  const std::vector<uint8_t> chunk = synthetic_chunk(g);
  const std::vector<uint8_t> good = encode(g, chunk.data(), config(CodecMode::kKivi4));
  ASSERT_EQ(decode_code(good, g), Code::kOk);
  const kvc1::Plane k = plane_of(good, 0), v = plane_of(good, 1);
  kvc1::Header h;
  ASSERT_EQ(kvc1::parse_header(good.data(), good.size(), &h), kvc1::kParseOk);
  auto expect_corrupt = [&](const char* what, auto&& edit) { expect_corrupt_after(good, g, what, edit); };
  expect_corrupt("count beyond tokens", [&](std::vector<uint8_t>& b) { b[k.offset + 20] = 19; });
  expect_corrupt("count disagrees with the params size", [&](std::vector<uint8_t>& b) { b[v.offset + 20] = 3; });
  expect_corrupt("minor 1", [&](std::vector<uint8_t>& b) { b[kvc1::kHfVersionMinor] = 1; });
  expect_corrupt("scale of an exact V row", [&](std::vector<uint8_t>& b) { b[v.params_off + 1] = 0x3c; });
  const uint64_t exact = kvc1::exact_rows_offset(h, v);
  expect_corrupt("NaN in an exact row", [&](std::vector<uint8_t>& b) {
    b[v.params_off + exact + 2] = 0x00;
    b[v.params_off + exact + 3] = 0x7e;
  });
  const uint64_t scales = 2 * kvc1::scale_array_elems(h, v) * 2;
  ASSERT_LT(scales, exact);
  expect_corrupt("padding", [&](std::vector<uint8_t>& b) { b[v.params_off + scales] = 1; });
  const std::vector<uint8_t> lossless = encode(g, chunk.data(), config(CodecMode::kLossless));
  expect_corrupt_after(lossless, g, "exact count on a lossless plane",
                       [&](std::vector<uint8_t>& b) { b[plane_of(lossless, 0).offset + 20] = 1; });
}

// Whether every row of `out` at token t equals `chunk`'s, over every layer, plane and head.
bool token_rows_equal(const std::vector<uint8_t>& out, const std::vector<uint8_t>& chunk, const ChunkGeometry& g,
                      uint32_t t) {
  const size_t row = size_t{g.head_dim} * dtype_size(g.dtype);
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t p = 0; p < 2; ++p)
      for (uint32_t h = 0; h < g.kv_heads; ++h) {
        const size_t at = static_cast<size_t>(chunk_offset(g, l, p, t, h, 0)) * dtype_size(g.dtype);
        if (std::memcmp(out.data() + at, chunk.data() + at, row) != 0) return false;
      }
  return true;
}

// Recent rows: in a chunk that ends its context the last recent_tokens rows of every quantized
// plane are stored exactly (bit for bit, any dtype, rotated or not, with or without sink rows
// before them), minor 3; without ends_context, with recent_tokens 0 and in lossless modes the
// blobs are those of before.
TEST(Codec, RecentRowsOfAContextEndDecodeBitExact) {
  for (DType dt : {DType::kF16, DType::kBF16, DType::kF32})
    for (CodecMode m : {CodecMode::kInt8, CodecMode::kKivi4, CodecMode::kKivi2})
      for (bool rot : {false, true})
        for (int64_t pos_base : {0, 40}) {
          SCOPED_TRACE(::testing::Message() << "dtype " << static_cast<int>(dt) << " mode " << static_cast<int>(m)
                                            << " rotate " << rot << " pos_base " << pos_base);
          const ChunkGeometry g = geometry(2, 3, 32, 40, dt);
          const std::vector<uint8_t> chunk = synthetic_chunk(g, 12);
          CodecConfig c = rot ? rotated(m) : config(m);
          c.pos_base = pos_base;
          const std::vector<uint8_t> plain = encode(g, chunk.data(), c);
          c.ends_context = true;
          const std::vector<uint8_t> blob = encode(g, chunk.data(), c);
          EXPECT_EQ(kvc1::ld16(blob.data() + kvc1::kHfVersionMinor), kvc1::kVersionMinorExactTail);
          const uint32_t sinks = pos_base == 0 ? kDefaultSinkTokens : 0;
          kvc1::Header h;
          ASSERT_EQ(kvc1::parse_header(blob.data(), blob.size(), &h), kvc1::kParseOk);
          for (uint32_t p = 0; p < 2; ++p) {
            const kvc1::Plane pl = plane_of(blob, p);
            EXPECT_EQ(pl.exact_tokens, sinks);
            EXPECT_EQ(pl.exact_tail_tokens, kDefaultRecentTokens);
            // The segments code the rows before the recent ones, the sinks' placeholders included.
            for (uint32_t s = 0; s < pl.n_segments; ++s) {
              kvc1::Segment sg;
              ASSERT_EQ(kvc1::parse_segment(blob.data(), h, pl, s, &sg), kvc1::kParseOk);
              EXPECT_EQ(sg.n_symbols, (g.tokens - kDefaultRecentTokens) * g.head_dim);
            }
          }
          const std::vector<uint8_t> out = decode_ok(blob, g);
          const std::vector<uint8_t> plain_out = decode_ok(plain, g);
          size_t differing_middle_rows = 0;
          for (uint32_t t = 0; t < g.tokens; ++t) {
            const bool exact = t < sinks || t >= g.tokens - kDefaultRecentTokens;
            if (exact)
              EXPECT_TRUE(token_rows_equal(out, chunk, g, t)) << "token " << t;
            else
              differing_middle_rows += !token_rows_equal(out, chunk, g, t);
          }
          EXPECT_GT(differing_middle_rows, 0u);  // the rows between are quantized
          EXPECT_GT(blob.size(), plain.size());
          c.recent_tokens = 0;
          EXPECT_EQ(encode(g, chunk.data(), c), plain);
        }
  const ChunkGeometry g = geometry(1, 2, 32, 8);
  const std::vector<uint8_t> chunk = synthetic_chunk(g);
  CodecConfig all = config(CodecMode::kKivi2);
  all.ends_context = true;
  all.recent_tokens = 100;  // more than the chunk: the rows the sinks leave are recent rows
  const std::vector<uint8_t> blob = encode(g, chunk.data(), all);
  EXPECT_EQ(plane_of(blob, 0).exact_tokens, kDefaultSinkTokens);
  EXPECT_EQ(plane_of(blob, 0).exact_tail_tokens, g.tokens - kDefaultSinkTokens);
  EXPECT_EQ(decode_ok(blob, g), chunk);
  // Without sinks the recent rows leave one token row to code.
  CodecConfig no_sink = no_sinks(CodecMode::kKivi4);
  no_sink.ends_context = true;
  no_sink.recent_tokens = 100;
  const std::vector<uint8_t> tail_only = encode(g, chunk.data(), no_sink);
  EXPECT_EQ(plane_of(tail_only, 0).exact_tail_tokens, g.tokens - 1);
  const std::vector<uint8_t> tail_out = decode_ok(tail_only, g);
  for (uint32_t t = 1; t < g.tokens; ++t) EXPECT_TRUE(token_rows_equal(tail_out, chunk, g, t)) << "token " << t;
  CodecConfig lossless = config(CodecMode::kLossless);
  lossless.ends_context = true;
  EXPECT_EQ(encode(g, chunk.data(), lossless), encode(g, chunk.data(), config(CodecMode::kLossless)));
}

// Recent rows are left out of the quantizer ranges: a huge last token does not coarsen the
// steps of the tokens that share its K group or its V row scale.
TEST(Codec, RecentRowsStayOutOfTheQuantizerRanges) {
  const ChunkGeometry g = geometry(1, 1, 32, 64, DType::kF32);
  std::vector<uint8_t> chunk = synthetic_chunk(g);
  auto* f = reinterpret_cast<float*>(chunk.data());
  const size_t plane_elems = size_t{g.tokens} * g.head_dim;
  const size_t last = size_t{g.tokens - 1} * g.head_dim;
  for (uint32_t d = 0; d < g.head_dim; ++d) f[last + d] = f[plane_elems + last + d] = 5000.0f;  // K and V
  CodecConfig c = no_sinks(CodecMode::kKivi4);
  c.recent_tokens = 1;
  const std::vector<uint8_t> without = encode(g, chunk.data(), c);
  c.ends_context = true;
  const std::vector<uint8_t> with = encode(g, chunk.data(), c);
  const std::vector<uint8_t> a = decode_ok(with, g), b = decode_ok(without, g);
  const float* fa = reinterpret_cast<const float*>(a.data());
  const float* fb = reinterpret_cast<const float*>(b.data());
  double err_with = 0, err_without = 0;
  for (size_t i = 0; i < 2 * plane_elems; ++i) {
    if (i % plane_elems >= last) {
      EXPECT_EQ(fa[i], f[i]);
      continue;
    }
    err_with = std::max(err_with, std::fabs(double{fa[i]} - f[i]));
    err_without = std::max(err_without, std::fabs(double{fb[i]} - f[i]));
  }
  EXPECT_GT(err_without, 100.0);  // up to 5000 / 15 / 2 in the last token's K group
  EXPECT_LT(err_with * 10, err_without);
  EXPECT_LT(stored_scale(with, 0, 0, 0, 0, 0) * 10, stored_scale(without, 0, 0, 0, 0, 0));
  EXPECT_EQ(stored_scale(with, 0, 1, g.tokens - 1, 0, 0), 0.0f);
  EXPECT_GT(stored_scale(with, 0, 1, g.tokens - 2, 0, 0), 0.0f);
}

// The trailing exact-row field is checked like the leading one: sink and recent rows beyond the
// chunk, recent rows in a minor-2 blob, a non-zero scale on a recent row or on a K group of
// recent rows only, NaN in a recent row, and a count on a lossless plane are corrupt.
TEST(Codec, BadRecentRowsAreCorrupt) {
  const ChunkGeometry g = geometry(1, 1, 32, 24);
  const std::vector<uint8_t> chunk = synthetic_chunk(g);
  CodecConfig c = config(CodecMode::kKivi4);
  c.k_group_tokens = 8;
  c.recent_tokens = 8;
  c.ends_context = true;
  const std::vector<uint8_t> good = encode(g, chunk.data(), c);
  ASSERT_EQ(decode_code(good, g), Code::kOk);
  const kvc1::Plane k = plane_of(good, 0), v = plane_of(good, 1);
  ASSERT_EQ(k.exact_tail_tokens, 8u);
  kvc1::Header h;
  ASSERT_EQ(kvc1::parse_header(good.data(), good.size(), &h), kvc1::kParseOk);
  auto expect_corrupt = [&](const char* what, auto&& edit) { expect_corrupt_after(good, g, what, edit); };
  expect_corrupt("sinks and recent rows beyond tokens", [&](std::vector<uint8_t>& b) { b[k.offset + 24] = 21; });
  expect_corrupt("count disagrees with the params size", [&](std::vector<uint8_t>& b) { b[v.offset + 24] = 7; });
  expect_corrupt("minor 2", [&](std::vector<uint8_t>& b) { b[kvc1::kHfVersionMinor] = 2; });
  expect_corrupt("segments that code the recent rows too", [&](std::vector<uint8_t>& b) {
    kvc1::Segment sg;
    ASSERT_EQ(kvc1::parse_segment(b.data(), h, k, 0, &sg), kvc1::kParseOk);
    const uint32_t all_rows = g.tokens * g.head_dim;
    std::memcpy(b.data() + sg.offset + 4, &all_rows, 4);
  });
  expect_corrupt("reserved bytes after the count", [&](std::vector<uint8_t>& b) { b[k.offset + 28] = 1; });
  uint64_t s_off, z_off;
  kvc1::row_scale_offsets(h, v, g.tokens - 1, 0, &s_off, &z_off);
  expect_corrupt("scale of a recent V row", [&](std::vector<uint8_t>& b) { b[v.params_off + s_off + 1] = 0x3c; });
  kvc1::row_scale_offsets(h, k, g.tokens - 1, 0, &s_off, &z_off);  // the last K group holds recent rows only
  expect_corrupt("scale of a recent K group", [&](std::vector<uint8_t>& b) { b[k.params_off + z_off + 1] = 0x3c; });
  const uint64_t last_row = kvc1::exact_rows_offset(h, v) + (kvc1::exact_rows(v) - 1) * g.head_dim * 2;
  expect_corrupt("NaN in a recent row", [&](std::vector<uint8_t>& b) {
    b[v.params_off + last_row + 2] = 0x00;
    b[v.params_off + last_row + 3] = 0x7e;
  });
  const std::vector<uint8_t> lossless = encode(g, chunk.data(), config(CodecMode::kLossless));
  expect_corrupt_after(lossless, g, "recent count on a lossless plane",
                       [&](std::vector<uint8_t>& b) { b[plane_of(lossless, 0).offset + 24] = 1; });
}

}  // namespace
}  // namespace kdn::kernels
