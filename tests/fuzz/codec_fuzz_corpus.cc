// Writes the seed corpus of the KVC1 decoder fuzzer: valid blobs of small chunks in every mode
// and dtype, with and without entropy coding and the token-delta predictor, with rotated rows, and
// with exact sink and recent rows, and transform-coded blobs made with the identity calibration
// the fuzzer builds for their geometry.
//   codec_fuzz_corpus DIR
#include "calibration_test_util.h"

#include <kdn/kernels/codec.h>
#include <kdn/kernels/codec_transform.h>
#include <kdn/kernels/layout.h>
#include <kdn/kernels/synthetic.h>

#include <bit>
#include <cstdio>
#include <string>
#include <vector>

using namespace kdn::kernels;

namespace {

bool write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return false;
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  return std::fclose(f) == 0 && ok;
}

bool encode_one(const ChunkGeometry& g, const CodecConfig& c, const std::string& path) {
  std::vector<uint8_t> chunk(static_cast<size_t>(g.layers) * 2 * g.tokens * g.kv_heads * g.head_dim *
                             dtype_size(g.dtype));
  SyntheticKvParams p;
  p.seed = g.tokens * 131u + g.head_dim;
  if (!fill_synthetic_kv(chunk.data(), g, p).ok()) return false;
  std::vector<uint8_t> blob(kvc1_max_encoded_size(g, c)), scratch(kvc1_encode_scratch_bytes(g, c));
  size_t n = 0;
  const kdn_key fp{0x1234, 0x5678};
  if (!kvc1_encode(g, fp, chunk.data(), c, blob.data(), blob.size(), &n, scratch.data(), scratch.size()).ok())
    return false;
  blob.resize(n);
  return write_file(path, blob);
}

// A calibration learnt from two synthetic chunks of g: sorted variances and a rotated basis, as
// kdnd's calibrations have, rather than the identity's.
bool learn_calibration(const ChunkGeometry& g, std::vector<uint8_t>* out) {
  std::vector<std::vector<uint8_t>> chunks(2, std::vector<uint8_t>(chunk_bytes(g)));
  std::vector<Kvc1CalibrationSample> samples;
  for (size_t i = 0; i < chunks.size(); ++i) {
    SyntheticKvParams p;
    p.seed = 977 + uint32_t(i);
    if (!fill_synthetic_kv(chunks[i].data(), g, p).ok()) return false;
    samples.push_back(Kvc1CalibrationSample{chunks[i].data(), int64_t(i + 1) * g.tokens});
  }
  out->resize(kvc1_calibration_bytes(g));
  size_t n = 0;
  return kvc1_calibrate(g, kdn_key{0x1234, 0x5678}, samples, out->data(), out->size(), &n).ok() && n == out->size();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTPUT_DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  struct Shape {
    uint32_t layers, heads, dim, tokens;
    DType dtype;
  };
  const Shape shapes[] = {
      {1, 1, 32, 8, DType::kF16}, {2, 2, 32, 24, DType::kF16}, {1, 1, 64, 40, DType::kBF16}, {1, 2, 7, 5, DType::kF32}};
  const CodecMode modes[] = {CodecMode::kRaw, CodecMode::kLossless, CodecMode::kInt8, CodecMode::kKivi4,
                             CodecMode::kKivi2};
  int written = 0;
  for (const Shape& s : shapes) {
    ChunkGeometry g;
    g.layers = s.layers;
    g.kv_heads = s.heads;
    g.head_dim = s.dim;
    g.tokens = s.tokens;
    g.dtype = s.dtype;
    for (CodecMode m : modes) {
      for (int variant = 0; variant < 4; ++variant) {
        if (m == CodecMode::kRaw && variant > 0) continue;
        // variant 3: Hadamard-rotated rows (quantized modes, power-of-two head_dim)
        if (variant == 3 && (m == CodecMode::kLossless || !std::has_single_bit(s.dim))) continue;
        CodecConfig c;
        c.mode = m;
        c.entropy = variant != 1;
        c.token_delta = variant != 2;
        c.rotate = variant == 3;
        c.pos_base = variant == 2 ? 512 : 0;  // quantized chunks at position 0 carry exact sink rows
        c.ends_context = variant >= 2;        // and chunks that end their context exact recent rows
        c.recent_tokens = 3;
        c.block_tokens = 16;
        const std::string path = dir + "/" + codec_mode_name(m) + "-" + std::to_string(s.layers) + "x" +
                                 std::to_string(s.heads) + "x" + std::to_string(s.dim) + "x" +
                                 std::to_string(s.tokens) + "-" + std::to_string(variant) + ".kvc1";
        if (!encode_one(g, c, path)) {
          std::fprintf(stderr, "failed to write %s\n", path.c_str());
          return 1;
        }
        ++written;
      }
    }
    const std::vector<uint8_t> cal_bytes = testing::identity_calibration(s.layers, s.heads, s.dim, {0x1234, 0x5678});
    Kvc1Calibration cal;
    if (!kvc1_calibration_open(cal_bytes.data(), cal_bytes.size(), &cal).ok()) return 1;
    // The calibration objects themselves: the identity one, and one learnt from synthetic KV.
    const std::string shape = std::to_string(s.layers) + "x" + std::to_string(s.heads) + "x" + std::to_string(s.dim);
    std::vector<uint8_t> learnt;
    if (!write_file(dir + "/calibration-identity-" + shape + ".kvt", cal_bytes) || !learn_calibration(g, &learnt) ||
        !write_file(dir + "/calibration-learnt-" + shape + ".kvt", learnt)) {
      std::fprintf(stderr, "failed to write the calibrations of %s\n", shape.c_str());
      return 1;
    }
    written += 2;
    for (int variant = 0; variant < 3; ++variant) {
      CodecConfig c;
      c.mode = CodecMode::kTransform;
      c.calibration = &cal;
      c.transform_mean_bits = 1.0 + variant;
      c.entropy = variant != 1;
      c.ends_context = variant == 2;
      c.recent_tokens = 3;
      c.block_tokens = 16;
      const std::string path = dir + "/transform-" + std::to_string(s.layers) + "x" + std::to_string(s.heads) + "x" +
                               std::to_string(s.dim) + "x" + std::to_string(s.tokens) + "-" + std::to_string(variant) +
                               ".kvc1";
      if (!encode_one(g, c, path)) {
        std::fprintf(stderr, "failed to write %s\n", path.c_str());
        return 1;
      }
      ++written;
    }
  }
  std::printf("wrote %d seed blobs to %s\n", written, dir.c_str());
  return 0;
}
