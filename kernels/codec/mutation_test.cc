// Random mutations of valid KVC1 blobs through the decoder: the libFuzzer harness
// (tests/fuzz/codec_decode_fuzz.cc) explores much further, but needs clang; this runs in every
// build. Blobs and outputs live in exactly sized heap buffers, so sanitizer builds catch any
// stray access, and guard bytes around the outputs catch stray writes in plain builds.
#include "codec_test_util.h"

#include <kdn/kernels/codec.h>
#include <kdn/kernels/presets.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

namespace kdn::kernels {
namespace {

using testing::geometry;
using testing::geometry_bytes;
using testing::kTestFingerprint;

struct Sample {
  ChunkGeometry g;
  std::vector<uint8_t> blob;
};

std::vector<Sample> samples() {
  std::vector<Sample> out;
  const ChunkGeometry shapes[] = {geometry(2, 2, 32, 24), geometry(1, 1, 64, 40, DType::kBF16),
                                  geometry(2, 1, 7, 9, DType::kF32)};
  for (const ChunkGeometry& g : shapes) {
    const std::vector<uint8_t> chunk = testing::synthetic_chunk(g, 3);
    for (CodecMode m : testing::kAllModes) {
      CodecConfig c = testing::config(m);
      c.block_tokens = 16;
      c.ends_context = true;  // sink rows and recent rows
      c.recent_tokens = 4;
      out.push_back({g, testing::encode(g, chunk.data(), c)});
    }
  }
  return out;
}

void mutate(std::vector<uint8_t>& b, std::mt19937_64& rng) {
  const int n = 1 + static_cast<int>(rng() % 4);
  for (int k = 0; k < n && !b.empty(); ++k) {
    const size_t at = rng() % b.size();
    switch (rng() % 6) {
      case 0:
        b[at] ^= static_cast<uint8_t>(1u << (rng() % 8));
        break;
      case 1:
        b[at] = static_cast<uint8_t>(rng());
        break;
      case 2: {  // an interesting 32-bit value over a length or offset field
        static constexpr uint32_t kValues[] = {0, 1, 15, 16, 0x7fffffff, 0x80000000, 0xffffffff, 0x10000};
        const uint32_t v = kValues[rng() % 8];
        if (at + 4 <= b.size()) std::memcpy(&b[at], &v, 4);
        break;
      }
      case 3:
        b.resize(at);
        break;
      case 4:
        b.insert(b.begin() + static_cast<std::ptrdiff_t>(at), static_cast<uint8_t>(rng()));
        break;
      default: {  // copy a run from elsewhere (plausible-looking structure in the wrong place)
        const size_t from = rng() % b.size(), len = std::min<size_t>(rng() % 64, b.size() - std::max(at, from));
        std::memmove(&b[at], &b[from], len);
        break;
      }
    }
  }
}

constexpr size_t kGuard = 64;
constexpr uint8_t kGuardByte = 0x5c;

// Decodes into an output framed by guard bytes; returns the status and checks the guards.
Status guarded_decode(const std::vector<uint8_t>& blob, const ChunkGeometry& g, bool verify_crc) {
  const size_t n = geometry_bytes(g);
  std::unique_ptr<uint8_t[]> in(new uint8_t[blob.size() + 1]);  // +1: never a null pointer
  std::memcpy(in.get(), blob.data(), blob.size());
  std::vector<uint8_t> out(n + 2 * kGuard, kGuardByte);
  DecodeOptions o;
  o.verify_crc = verify_crc;
  const Status st = kvc1_decode(in.get(), blob.size(), g, kTestFingerprint, out.data() + kGuard, n, o);
  for (size_t i = 0; i < kGuard; ++i) {
    EXPECT_EQ(out[i], kGuardByte);
    EXPECT_EQ(out[kGuard + n + i], kGuardByte);
  }
  return st;
}

TEST(Mutation, CrcCatchesEveryChangeAndNothingCrashesWithoutIt) {
  const std::vector<Sample> base = samples();
  std::mt19937_64 rng(20240601);
  int rejected_without_crc = 0, total = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    const Sample& s = base[iter % base.size()];
    std::vector<uint8_t> b = s.blob;
    mutate(b, rng);
    if (b == s.blob) continue;
    ++total;
    const Status with_crc = guarded_decode(b, s.g, true);
    EXPECT_FALSE(with_crc.ok()) << "iteration " << iter;
    const Status without = guarded_decode(b, s.g, false);
    rejected_without_crc += without.ok() ? 0 : 1;
    Kvc1Info info;
    (void)kvc1_inspect(b.data(), b.size(), &info);
  }
  // Structure checks alone still reject most mutations (a changed scale or code can decode).
  EXPECT_GT(rejected_without_crc, total / 2) << rejected_without_crc << " of " << total;
  std::printf("%d mutated blobs, %d rejected by structure checks alone\n", total, rejected_without_crc);
}

TEST(Mutation, ScatterSurvivesMutationsWithoutCrc) {
  const ChunkGeometry g = geometry(2, 2, 32, 24);
  const std::vector<uint8_t> chunk = testing::synthetic_chunk(g, 8);
  PagedShape shape{g.layers, g.kv_heads, g.head_dim, 4, 8, DType::kF16};
  const size_t bytes = static_cast<size_t>(engine_layer_elements(EngineLayoutKind::kVllmFlashNhd, shape)) * 2;
  std::vector<std::vector<uint8_t>> layers(g.layers, std::vector<uint8_t>(bytes));
  std::vector<void*> bases;
  for (auto& l : layers) bases.push_back(l.data());
  EngineView view;
  ASSERT_TRUE(preset_view(EngineLayoutKind::kVllmFlashNhd, shape, bases.data(), nullptr, false, &view).ok());
  std::mt19937_64 rng(7);
  DecodeOptions o;
  o.verify_crc = false;
  for (CodecMode m : testing::kAllModes) {
    const std::vector<uint8_t> blob = testing::encode(g, chunk.data(), testing::config(m));
    for (int iter = 0; iter < 300; ++iter) {
      std::vector<uint8_t> b = blob;
      mutate(b, rng);
      std::unique_ptr<uint8_t[]> in(new uint8_t[b.size() + 1]);
      std::memcpy(in.get(), b.data(), b.size());
      (void)kvc1_decode_scatter(in.get(), b.size(), g, kTestFingerprint, view, nullptr, o);
    }
  }
}

}  // namespace
}  // namespace kdn::kernels
