// The llama.cpp sequence-state blob <-> canonical chunk conversion, without llama.cpp: exact
// sizes, exact byte layout on a hand-built example, round trips for every supported layout,
// and rejection of every malformed blob and chunk.
#include <kdn/llama/state_blob.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

namespace kdn::llama {
namespace {

KvGeometry small_geometry(bool v_trans, uint32_t n_stream = 1, KvType type = KvType::kF16) {
  KvGeometry g;
  g.n_layer = 3;
  g.n_kv_heads = 2;
  g.head_dim = 4;
  g.type = type;
  g.v_trans = v_trans;
  g.n_stream = n_stream;
  g.chunk_tokens = 5;
  return g;
}

// A chunk of random finite values (exponent field never all ones).
std::vector<uint8_t> random_chunk(const KvGeometry& g, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> c(g.chunk_bytes());
  if (g.elem_bytes() == 2) {
    const uint16_t exp_mask = g.type == KvType::kF16 ? 0x7c00 : 0x7f80;
    for (size_t i = 0; i < c.size(); i += 2) {
      uint16_t v = static_cast<uint16_t>(rng());
      if ((v & exp_mask) == exp_mask) v &= 0xbfff;
      std::memcpy(&c[i], &v, 2);
    }
  } else {
    for (size_t i = 0; i < c.size(); i += 4) {
      uint32_t v = static_cast<uint32_t>(rng());
      if ((v & 0x7f800000u) == 0x7f800000u) v &= 0xbfffffffu;
      std::memcpy(&c[i], &v, 4);
    }
  }
  return c;
}

std::vector<uint8_t> build(const KvGeometry& g, const std::vector<std::vector<uint8_t>>& chunks,
                           int32_t first_pos = 0) {
  std::vector<std::span<const uint8_t>> spans(chunks.begin(), chunks.end());
  // Not zeroed: every byte of the blob must be written by build_seq_blob.
  std::vector<uint8_t> blob(seq_blob_bytes(g, chunks.size() * uint64_t{g.chunk_tokens}), 0xab);
  EXPECT_TRUE(build_seq_blob(g, spans, first_pos, blob).ok());
  return blob;
}

template <class T>
void put(std::vector<uint8_t>& b, size_t off, T v) {
  std::memcpy(&b[off], &v, sizeof v);
}

TEST(StateBlob, CheckedCopyAtEveryDestinationAlignment) {
  // The SIMD copies store to aligned addresses and hand what comes before and after to the
  // scalar path: every alignment and length copies exactly and still sees every bad value.
  const KvGeometry g = small_geometry(false);
  const std::vector<uint8_t> src = random_chunk(g, 9);  // f16, finite
  std::vector<uint8_t> dst(src.size() + 128);
  for (size_t align = 0; align < 66; align += 2)
    for (size_t len : {size_t{0}, size_t{2}, size_t{126}, size_t{128}, size_t{130}, size_t{382}, size_t{478}}) {
      ASSERT_LE(len, src.size());
      std::fill(dst.begin(), dst.end(), uint8_t{0x55});
      ASSERT_TRUE(copy_finite(KvType::kF16, dst.data() + align, src.data(), len)) << align << " " << len;
      EXPECT_EQ(std::memcmp(dst.data() + align, src.data(), len), 0) << align << " " << len;
      EXPECT_EQ(dst[align + len], 0x55) << "wrote past the end: " << align << " " << len;
      if (align > 0) {
        EXPECT_EQ(dst[align - 1], 0x55) << "wrote before the start: " << align << " " << len;
      }
      for (size_t bad_at = 0; bad_at < len; bad_at += 2) {
        std::vector<uint8_t> bad(src.begin(), src.begin() + static_cast<std::ptrdiff_t>(len));
        bad[bad_at] = 0x00;
        bad[bad_at + 1] = 0x7c;  // +inf
        std::fill(dst.begin(), dst.end(), uint8_t{0x55});
        ASSERT_FALSE(copy_finite(KvType::kF16, dst.data() + align, bad.data(), len))
            << align << " " << len << " " << bad_at;
        // Zeros in place of the copy, nothing outside it touched.
        EXPECT_TRUE(std::all_of(dst.begin() + static_cast<std::ptrdiff_t>(align),
                                dst.begin() + static_cast<std::ptrdiff_t>(align + len),
                                [](uint8_t b) { return b == 0; }))
            << align << " " << len << " " << bad_at;
        EXPECT_EQ(dst[align + len], 0x55) << align << " " << len << " " << bad_at;
        if (align > 0) {
          EXPECT_EQ(dst[align - 1], 0x55) << align << " " << len << " " << bad_at;
        }
      }
    }
}

TEST(StateBlob, PiecesPointIntoTheChunksAndAreReusable) {
  // A load copies KV once: untransposed K and V pieces are the chunks' own bytes, in order,
  // and the fields between them are exactly what the blob holds there.
  for (bool v_trans : {false, true}) {
    const KvGeometry g = small_geometry(v_trans, 2);
    const std::vector<std::vector<uint8_t>> chunks{random_chunk(g, 1), random_chunk(g, 2)};
    const std::vector<std::span<const uint8_t>> spans(chunks.begin(), chunks.end());
    SeqBlobPieces pieces;
    for (int32_t first_pos : {0, 40}) {  // a second describe reuses the buffers
      ASSERT_TRUE(pieces.describe(g, spans, first_pos).ok());
      const std::vector<uint8_t> blob = build(g, chunks, first_pos);
      ASSERT_EQ(pieces.size(), blob.size());
      uint64_t at = 0, into_chunks = 0;
      for (const BlobPiece& p : pieces.pieces()) {
        ASSERT_LE(at + p.size, blob.size());
        EXPECT_EQ(std::memcmp(p.data, blob.data() + at, p.size), 0) << "piece at " << at;
        for (const auto& c : chunks)
          if (p.data >= c.data() && p.data + p.size <= c.data() + c.size()) into_chunks += p.size;
        at += p.size;
      }
      EXPECT_EQ(at, blob.size());
      // K always, V too unless it is transposed: 2 chunks x 3 layers x 5 tokens x 16 bytes.
      EXPECT_EQ(into_chunks, (v_trans ? 1u : 2u) * 2 * 3 * 5 * 16) << "v_trans " << v_trans;
    }
  }
  // Pieces whose KV is not finite are refused where they are copied.
  const KvGeometry g = small_geometry(false);
  std::vector<uint8_t> bad = random_chunk(g, 3);
  const uint16_t nan = 0x7e00;
  std::memcpy(bad.data() + bad.size() - 2, &nan, 2);
  const std::vector<std::span<const uint8_t>> one{bad};
  SeqBlobPieces pieces;
  ASSERT_TRUE(pieces.describe(g, one, 0).ok());
  std::vector<uint8_t> out(pieces.size());
  EXPECT_EQ(gather_pieces(g.type, pieces.pieces(), out).code(), Code::kCorrupt);
  EXPECT_EQ(gather_pieces(g.type, pieces.pieces(), std::span(out).first(out.size() - 1)).code(),
            Code::kInvalidArgument);
  EXPECT_FALSE(pieces.describe(g, {}, 0).ok());
  EXPECT_TRUE(pieces.pieces().empty());
}

TEST(StateBlob, SizeMatchesLlamaCppForSmolLM2) {
  // 30 layers, 3 KV heads x 64, f16: llama.cpp writes 744 + 23052 * n bytes (measured).
  KvGeometry g;
  g.n_layer = 30;
  g.n_kv_heads = 3;
  g.head_dim = 64;
  for (bool v_trans : {false, true}) {
    g.v_trans = v_trans;
    EXPECT_EQ(seq_blob_bytes(g, 1024), 744u + 23052u * 1024);
    EXPECT_EQ(seq_blob_bytes(g, 512), 11803368u);
  }
  g.n_stream = 4;  // three more empty streams: one u32 each
  EXPECT_EQ(seq_blob_bytes(g, 512), 11803368u + 12);
  EXPECT_EQ(seq_blob_bytes(g, 0), 12u + 16);
}

TEST(StateBlob, ExactBytesOfAHandBuiltBlob) {
  KvGeometry g;
  g.n_layer = 1;
  g.n_kv_heads = 1;
  g.head_dim = 2;
  g.chunk_tokens = 2;
  // canonical [layer][K|V][token][head][dim]: K rows {1,2},{3,4}; V rows {5,6},{7,8} (f16 bits)
  const uint16_t vals[8] = {0x3c00, 0x4000, 0x4200, 0x4400, 0x4500, 0x4600, 0x4700, 0x4800};
  std::vector<uint8_t> chunk(sizeof vals);
  std::memcpy(chunk.data(), vals, sizeof vals);
  for (bool v_trans : {false, true}) {
    g.v_trans = v_trans;
    std::vector<uint8_t> want;
    auto u32 = [&](uint32_t v) { want.insert(want.end(), (uint8_t*)&v, (uint8_t*)&v + 4); };
    auto u64 = [&](uint64_t v) { want.insert(want.end(), (uint8_t*)&v, (uint8_t*)&v + 8); };
    auto f16 = [&](uint16_t v) { want.insert(want.end(), (uint8_t*)&v, (uint8_t*)&v + 2); };
    u32(0xaf143cd8);
    u32(0);
    u32(1);  // magic, seq, n_stream
    u32(2);  // cell_count
    u32(7);
    u32(1);
    u32(0);
    u32(8);
    u32(1);
    u32(0);  // cells at positions 7, 8
    u32(v_trans);
    u32(1);  // v_trans, n_layer
    u32(1);
    u64(4);
    f16(vals[0]);
    f16(vals[1]);
    f16(vals[2]);
    f16(vals[3]);
    if (!v_trans) {
      u32(1);
      u64(4);
      f16(vals[4]);
      f16(vals[5]);
      f16(vals[6]);
      f16(vals[7]);
    } else {  // element j of every cell, then element j + 1
      u32(1);
      u32(2);
      u32(2);
      f16(vals[4]);
      f16(vals[6]);
      f16(vals[5]);
      f16(vals[7]);
    }
    EXPECT_EQ(build(g, {chunk}, 7), want) << "v_trans=" << v_trans;
  }
}

TEST(StateBlob, RoundTripEveryLayout) {
  for (bool v_trans : {false, true})
    for (uint32_t streams : {1u, 4u})
      for (KvType type : {KvType::kF16, KvType::kBF16, KvType::kF32}) {
        const KvGeometry g = small_geometry(v_trans, streams, type);
        std::vector<std::vector<uint8_t>> chunks;
        for (uint32_t i = 0; i < 3; ++i) chunks.push_back(random_chunk(g, 100 + i));
        const std::vector<uint8_t> blob = build(g, chunks, 10);
        Result<SeqBlobView> v = parse_seq_blob(g, blob);
        ASSERT_TRUE(v.ok()) << v.status().what();
        EXPECT_EQ(v->n_cells, 15u);
        EXPECT_EQ(v->first_pos, 10);
        for (uint32_t i = 0; i < 3; ++i) {
          std::vector<uint8_t> out(g.chunk_bytes());
          ASSERT_TRUE(blob_chunk_to_canonical(g, v.value(), i, out).ok());
          EXPECT_EQ(out, chunks[i]) << "chunk " << i << " v_trans=" << v_trans;
        }
        std::vector<uint8_t> out(g.chunk_bytes());
        EXPECT_FALSE(blob_chunk_to_canonical(g, v.value(), 3, out).ok());
      }
}

TEST(StateBlob, TransposedVElementsSitWhereLlamaCppPutsThem) {
  const KvGeometry g = small_geometry(true);
  const std::vector<std::vector<uint8_t>> chunks{random_chunk(g, 1), random_chunk(g, 2)};
  const std::vector<uint8_t> blob = build(g, chunks);
  Result<SeqBlobView> v = parse_seq_blob(g, blob);
  ASSERT_TRUE(v.ok());
  const uint32_t embd = g.n_kv_heads * g.head_dim;
  for (uint32_t l = 0; l < g.n_layer; ++l)
    for (uint32_t cell = 0; cell < v->n_cells; ++cell)
      for (uint32_t j = 0; j < embd; ++j) {
        const auto& c = chunks[cell / g.chunk_tokens];
        const size_t t = cell % g.chunk_tokens;
        const size_t canon = (2 * l + 1) * g.plane_bytes() + (t * embd + j) * 2;
        ASSERT_EQ(0, std::memcmp(v->v_data[l] + (size_t{j} * v->n_cells + cell) * 2, &c[canon], 2));
      }
}

TEST(StateBlob, EveryTruncationAndTrailingByteIsRejected) {
  for (bool v_trans : {false, true}) {
    const KvGeometry g = small_geometry(v_trans, 2);
    std::vector<uint8_t> blob = build(g, {random_chunk(g, 7)});
    for (size_t n = 0; n < blob.size(); ++n)
      ASSERT_FALSE(parse_seq_blob(g, std::span(blob.data(), n)).ok()) << "length " << n;
    blob.push_back(0);
    EXPECT_FALSE(parse_seq_blob(g, blob).ok());
  }
}

TEST(StateBlob, MismatchedHeadersAreRejected) {
  const KvGeometry g = small_geometry(false);
  const std::vector<uint8_t> good = build(g, {random_chunk(g, 3)});
  ASSERT_TRUE(parse_seq_blob(g, good).ok());
  const size_t cells_end = 16 + 5 * 12;
  struct Case {
    const char* what;
    size_t off;
    uint32_t value;
    Code code;
  };
  const Case cases[] = {
      {"magic", 0, 0x12345678, Code::kCorrupt},
      {"n_stream", 8, 2, Code::kModelMismatch},
      {"cell count too large", 12, 6, Code::kCorrupt},
      {"non-consecutive position", 16 + 12, 5, Code::kCorrupt},
      {"negative position", 16, uint32_t(-1), Code::kCorrupt},
      {"two sequences in a cell", 16 + 4, 2, Code::kCorrupt},
      {"negative seq id", 16 + 8, uint32_t(-3), Code::kCorrupt},
      {"v_trans", cells_end, 1, Code::kModelMismatch},
      {"n_layer", cells_end + 4, 4, Code::kModelMismatch},
      {"K type", cells_end + 8, 0, Code::kModelMismatch},
      {"K row bytes", cells_end + 12, 17, Code::kModelMismatch},
  };
  for (const Case& c : cases) {
    std::vector<uint8_t> bad = good;
    put(bad, c.off, c.value);
    Result<SeqBlobView> v = parse_seq_blob(g, bad);
    ASSERT_FALSE(v.ok()) << c.what;
    EXPECT_EQ(v.status().code(), c.code) << c.what;
  }
  // Geometry the engine did not create: other types or dims.
  KvGeometry other = g;
  other.type = KvType::kF32;
  EXPECT_FALSE(parse_seq_blob(other, good).ok());
  other = g;
  other.head_dim = 2;
  EXPECT_FALSE(parse_seq_blob(other, good).ok());
}

TEST(StateBlob, EmptyOrDoublyFilledStreamsAreRejected) {
  const KvGeometry g = small_geometry(false, 2);
  std::vector<uint8_t> empty(seq_blob_bytes(g, 0), 0);
  put<uint32_t>(empty, 0, kSeqStateMagic);
  put<uint32_t>(empty, 8, 2);
  EXPECT_FALSE(parse_seq_blob(g, empty).ok());
  // Stream 0 filled by build; append stream 1 filled too (drop its trailing zero count first).
  std::vector<uint8_t> one = build(g, {random_chunk(g, 4)});
  std::vector<uint8_t> two(one.begin(), one.end() - 4);
  two.insert(two.end(), one.begin() + 12, one.end() - 4);
  EXPECT_FALSE(parse_seq_blob(g, two).ok());
}

TEST(StateBlob, NonFiniteOrMissizedChunksAreNeverBuilt) {
  for (bool v_trans : {false, true})
    for (KvType type : {KvType::kF16, KvType::kBF16, KvType::kF32}) {
      const KvGeometry g = small_geometry(v_trans, 1, type);
      const std::vector<uint8_t> good = random_chunk(g, 9);
      EXPECT_TRUE(check_chunk(g, good).ok());
      const uint32_t e = g.elem_bytes();
      // A NaN, +Inf and -Inf in the first K element, the last V element, and the middle.
      const uint32_t nan = e == 2 ? (type == KvType::kF16 ? 0x7e00 : 0x7fc0) : 0x7fc00000u;
      const uint32_t inf = e == 2 ? (type == KvType::kF16 ? 0x7c00 : 0x7f80) : 0x7f800000u;
      const uint32_t neg_inf = inf | (e == 2 ? 0x8000u : 0x80000000u);
      for (size_t off : {size_t{0}, good.size() - e, (good.size() / 2 / e) * e})
        for (uint32_t bits : {nan, inf, neg_inf}) {
          std::vector<uint8_t> bad = good;
          std::memcpy(&bad[off], &bits, e);
          EXPECT_EQ(check_chunk(g, bad).code(), Code::kCorrupt);
          std::vector<std::span<const uint8_t>> spans{good, bad};
          std::vector<uint8_t> blob(seq_blob_bytes(g, 2 * g.chunk_tokens));
          EXPECT_EQ(build_seq_blob(g, spans, 0, blob).code(), Code::kCorrupt);
        }
      std::vector<uint8_t> short_chunk(good.begin(), good.end() - 1);
      std::vector<std::span<const uint8_t>> spans{short_chunk};
      std::vector<uint8_t> blob(seq_blob_bytes(g, g.chunk_tokens));
      EXPECT_EQ(build_seq_blob(g, spans, 0, blob).code(), Code::kCorrupt);
      EXPECT_EQ(check_chunk(g, short_chunk).code(), Code::kCorrupt);
    }
}

// Planes long enough for the vectorized check (128-byte steps plus a ragged tail): every
// element position of a plane, every lane, is caught; the largest finite values pass; the
// copy the check rides on is exact.
TEST(StateBlob, VectorizedCheckCatchesEveryPositionAndPassesLargestFinite) {
  for (KvType type : {KvType::kF16, KvType::kBF16, KvType::kF32}) {
    KvGeometry g;
    g.n_layer = 2;
    g.n_kv_heads = 3;
    g.head_dim = 63;
    g.type = type;
    g.chunk_tokens = 7;  // a K plane is 7 rows of 378 (f32: 756) bytes: not a multiple of 128
    const uint32_t e = g.elem_bytes();
    std::vector<uint8_t> good = random_chunk(g, 21);
    const uint32_t max_finite = e == 4 ? 0x7f7fffffu : type == KvType::kF16 ? 0x7bffu : 0x7f7fu;
    const uint32_t sign = e == 4 ? 0x80000000u : 0x8000u;
    for (size_t off : {size_t{0}, size_t{128}, good.size() / 2})
      for (uint32_t bits : {max_finite, max_finite | sign}) std::memcpy(&good[off + e], &bits, e);
    ASSERT_TRUE(check_chunk(g, good).ok()) << static_cast<int>(type);
    const std::vector<std::span<const uint8_t>> one{good};
    std::vector<uint8_t> blob(seq_blob_bytes(g, g.chunk_tokens));
    ASSERT_TRUE(build_seq_blob(g, one, 0, blob).ok());
    Result<SeqBlobView> view = parse_seq_blob(g, blob);
    ASSERT_TRUE(view.ok());
    std::vector<uint8_t> back(g.chunk_bytes());
    ASSERT_TRUE(blob_chunk_to_canonical(g, view.value(), 0, back).ok());
    EXPECT_EQ(back, good);

    const uint32_t inf = e == 4 ? 0x7f800000u : type == KvType::kF16 ? 0x7c00u : 0x7f80u;
    const uint32_t nan = inf | 1u;
    // Every element of layer 0's K plane and of the last V plane.
    std::vector<size_t> offsets;
    for (uint64_t i = 0; i < g.plane_bytes(); i += e) {
      offsets.push_back(i);
      offsets.push_back(good.size() - g.plane_bytes() + i);
    }
    size_t missed = 0;
    for (size_t k = 0; k < offsets.size(); ++k) {
      std::vector<uint8_t> bad = good;
      const uint32_t bits = (k % 3 == 0 ? nan : inf) | (k % 2 ? sign : 0u);
      std::memcpy(&bad[offsets[k]], &bits, e);
      const std::vector<std::span<const uint8_t>> spans{bad};
      missed += check_chunk(g, bad).code() != Code::kCorrupt;
      missed += build_seq_blob(g, spans, 0, blob).code() != Code::kCorrupt;
    }
    EXPECT_EQ(missed, 0u) << "type " << static_cast<int>(type);
  }
}

TEST(StateBlob, BuildRejectsBadArguments) {
  const KvGeometry g = small_geometry(false);
  const std::vector<uint8_t> c = random_chunk(g, 5);
  std::vector<std::span<const uint8_t>> one{c};
  std::vector<uint8_t> blob(seq_blob_bytes(g, g.chunk_tokens));
  EXPECT_FALSE(build_seq_blob(g, {}, 0, blob).ok());
  EXPECT_FALSE(build_seq_blob(g, one, -1, blob).ok());
  EXPECT_FALSE(build_seq_blob(g, one, INT32_MAX - 2, blob).ok());
  std::vector<uint8_t> small(blob.size() - 1);
  EXPECT_FALSE(build_seq_blob(g, one, 0, small).ok());
  KvGeometry bad = g;
  bad.n_layer = 0;
  EXPECT_FALSE(build_seq_blob(bad, one, 0, blob).ok());
  bad = g;
  bad.type = static_cast<KvType>(8);  // q8_0: not convertible
  EXPECT_EQ(validate_geometry(bad).code(), Code::kUnsupported);
}

TEST(StateBlob, RandomCorruptionNeverYieldsAnInconsistentView) {
  const KvGeometry g = small_geometry(true, 2);
  const std::vector<uint8_t> good = build(g, {random_chunk(g, 11), random_chunk(g, 12)});
  std::mt19937 rng(42);
  const size_t header = 16 + 10 * 12 + 8;  // the part where a flip can change the structure
  int accepted = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::vector<uint8_t> bad = good;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < flips; ++f) bad[rng() % header] ^= static_cast<uint8_t>(1u << (rng() % 8));
    Result<SeqBlobView> v = parse_seq_blob(g, bad);
    if (!v.ok()) continue;
    // Only flips in ignored fields (the seq ids) may pass, and they change nothing we read.
    ++accepted;
    EXPECT_EQ(v->n_cells, 10u);
    EXPECT_EQ(v->first_pos, 0);
  }
  EXPECT_LT(accepted, 20000);
}

}  // namespace
}  // namespace kdn::llama
