// The CUDA decoder's warp code (decode_warp.h) run on the CPU: 32 threads play the 32 lanes of
// a warp, and ballots, broadcasts and warp barriers become a std::barrier. This checks the
// device algorithm — word sharing by ballot and popcount, shared-memory tables, the token-delta
// predictor, byte planes, dequantization — against the CPU decoder on every machine, GPU or
// not; gpu_test.cc repeats the comparison on a real device.
#include "codec_test_util.h"

#include <kdn/kernels/codec_transform.h>

#include <atomic>
#include <barrier>
#include <bit>
#include <thread>
#include <vector>

namespace kdn::kernels::kvc1 {
namespace emu {

struct Warp {
  std::barrier<> barrier{32};
  uint32_t slots[32] = {};
};

thread_local Warp* g_warp = nullptr;
thread_local uint32_t g_lane = 0;

// Every lane publishes a value, then reads them all once everyone has published.
template <class Reduce>
uint32_t exchange(uint32_t mine, Reduce&& reduce) {
  g_warp->slots[g_lane] = mine;
  g_warp->barrier.arrive_and_wait();
  const uint32_t r = reduce(g_warp->slots);
  g_warp->barrier.arrive_and_wait();  // nobody overwrites a slot before everyone has read
  return r;
}

}  // namespace emu

inline uint32_t warp_ballot(bool p) {
  return emu::exchange(p ? 1u : 0u, [](const uint32_t* v) {
    uint32_t m = 0;
    for (uint32_t j = 0; j < 32; ++j) m |= v[j] << j;
    return m;
  });
}
inline bool warp_all(bool p) { return warp_ballot(p) == 0xffffffffu; }
inline bool warp_any(bool p) { return warp_ballot(p) != 0; }
inline uint32_t warp_broadcast0(uint32_t v) {
  return emu::exchange(v, [](const uint32_t* s) { return s[0]; });
}
inline void warp_sync() { emu::g_warp->barrier.arrive_and_wait(); }
inline void atomic_or(uint32_t* p, uint32_t v) { std::atomic_ref<uint32_t>(*p).fetch_or(v); }

}  // namespace kdn::kernels::kvc1

#define KDN_WARP_FN inline
#include "decode_warp.h"

#include <gtest/gtest.h>

namespace kdn::kernels {
namespace {

using testing::geometry;
using testing::geometry_bytes;
using testing::kTestFingerprint;

// Runs one pass (decode_warp or rebuild_warp) over every warp, one warp (32 lane threads) at a time.
template <class Pass>
void run_warps(const kvc1::Job& job, const ChunkGeometry& g, Pass pass) {
  const uint64_t warps = uint64_t{job.n_chunks} * g.layers * 2 * g.kv_heads;
  for (uint64_t w = 0; w < warps; ++w) {
    kvc1::emu::Warp warp;
    std::vector<uint64_t> smem((job.smem_per_warp + 7) / 8);  // 8-byte aligned, like shared memory
    std::vector<std::thread> lanes;
    for (uint32_t lane = 0; lane < 32; ++lane) {
      lanes.emplace_back([&, lane] {
        kvc1::emu::g_warp = &warp;
        kvc1::emu::g_lane = lane;
        pass(job, w, lane, reinterpret_cast<uint8_t*>(smem.data()));
      });
    }
    for (auto& t : lanes) t.join();
  }
}

// Runs every warp of a decode job, as the launcher does (a second pass with a calibration, for
// transform planes); returns the error word.
uint32_t emulate(const std::vector<std::vector<uint8_t>>& blobs, const ChunkGeometry& g,
                 std::vector<std::vector<uint8_t>>* outs, const uint8_t* cal = nullptr) {
  std::vector<const uint8_t*> ptrs;
  std::vector<uint64_t> lens;
  std::vector<uint8_t*> out_ptrs;
  outs->assign(blobs.size(), std::vector<uint8_t>(geometry_bytes(g), 0));
  for (size_t i = 0; i < blobs.size(); ++i) {
    ptrs.push_back(blobs[i].data());
    lens.push_back(blobs[i].size());
    out_ptrs.push_back((*outs)[i].data());
  }
  uint32_t error = 0;
  kvc1::Job job{ptrs.data(),
                lens.data(),
                out_ptrs.data(),
                &error,
                static_cast<uint32_t>(blobs.size()),
                0,
                g.layers,
                g.kv_heads,
                g.head_dim,
                g.tokens,
                static_cast<uint32_t>(g.dtype),
                0,
                cal ? g.kv_heads * g.head_dim : g.head_dim,
                cal};
  job.smem_per_warp = kvc1::smem_bytes_per_warp(job.cols);
  run_warps(job, g,
            [](const kvc1::Job& j, uint64_t w, uint32_t lane, uint8_t* smem) { kvc1::decode_warp(j, w, lane, smem); });
  if (cal) {
    run_warps(job, g, [](const kvc1::Job& j, uint64_t w, uint32_t lane, uint8_t* smem) {
      kvc1::rebuild_warp(j, w, lane, smem);
    });
  }
  return error;
}

std::vector<uint8_t> cpu_decode(const std::vector<uint8_t>& blob, const ChunkGeometry& g) {
  std::vector<uint8_t> out(geometry_bytes(g), 0);
  const Status st = kvc1_decode(blob.data(), blob.size(), g, kTestFingerprint, out.data(), out.size());
  EXPECT_TRUE(st.ok()) << st.what();
  return out;
}

TEST(WarpEmulation, DeviceAlgorithmEqualsCpuDecoder) {
  const ChunkGeometry shapes[] = {geometry(1, 2, 64, 48), geometry(1, 1, 32, 37, DType::kBF16),
                                  geometry(1, 1, 40, 20, DType::kF32), geometry(1, 1, 7, 9)};
  for (const ChunkGeometry& g : shapes) {
    for (CodecMode m : testing::kAllModes) {
      for (int variant = 0; variant < 3; ++variant) {
        const bool entropy = variant != 1, rotate = variant == 2;
        if (rotate && (m == CodecMode::kRaw || m == CodecMode::kLossless || !std::has_single_bit(g.head_dim))) continue;
        CodecConfig c = testing::config(m);
        c.entropy = entropy;
        c.rotate = rotate;
        c.block_tokens = 16;   // several blocks, the last one partial
        CodecConfig last = c;  // the second chunk ends its context: recent rows after the sink rows
        last.ends_context = true;
        last.recent_tokens = 5;
        const std::vector<std::vector<uint8_t>> blobs = {
            testing::encode(g, testing::synthetic_chunk(g, 11).data(), c),
            testing::encode(g, testing::synthetic_chunk(g, 12).data(), last)};
        std::vector<std::vector<uint8_t>> outs;
        ASSERT_EQ(emulate(blobs, g, &outs), 0u) << codec_mode_name(m);
        for (size_t i = 0; i < blobs.size(); ++i)
          EXPECT_EQ(outs[i], cpu_decode(blobs[i], g))
              << codec_mode_name(m) << " entropy " << entropy << " rotate " << rotate << " D=" << g.head_dim;
      }
    }
  }
}

// Transform planes: bands parked by head 0's warp, rows rebuilt by every head's warp in a second
// pass, against kvc1_decode with the same calibration, bit for bit (the rotation back sums the
// axes in the CPU's order with the same rounded steps: transform_body.h).
TEST(WarpEmulation, TransformPlanesEqualCpuDecoder) {
  struct Case {
    ChunkGeometry g;
    double bits;
    bool entropy;
  };
  // Small shapes: every warp step is a 32-thread barrier here.
  const Case cases[] = {{geometry(1, 2, 32, 24), 1.5, true},
                        {geometry(1, 2, 32, 24, DType::kBF16), 3.0, false},
                        {geometry(1, 1, 16, 20, DType::kF32), 2.0, true}};
  for (const Case& k : cases) {
    const ChunkGeometry& g = k.g;
    const testing::SyntheticCalibration sc = testing::synthetic_calibration(g, 30);
    ASSERT_FALSE(::testing::Test::HasFailure());
    const auto& chunks = sc.chunks;
    const auto& cal_bytes = sc.bytes;
    const Kvc1Calibration& cal = sc.view;
    CodecConfig c;
    c.mode = CodecMode::kTransform;
    c.calibration = &cal;
    c.transform_mean_bits = k.bits;
    c.entropy = k.entropy;
    c.block_tokens = 16;
    CodecConfig last = c;  // sink rows in the first chunk, recent rows in the second
    last.pos_base = 100;
    last.ends_context = true;
    last.recent_tokens = 5;
    const std::vector<std::vector<uint8_t>> blobs = {testing::encode(g, chunks[0].data(), c),
                                                     testing::encode(g, chunks[1].data(), last)};
    std::vector<std::vector<uint8_t>> outs;
    ASSERT_EQ(emulate(blobs, g, &outs, cal_bytes.data()), 0u);
    DecodeOptions o;
    o.calibration = &cal;
    for (size_t i = 0; i < blobs.size(); ++i) {
      std::vector<uint8_t> cpu(geometry_bytes(g), 0);
      ASSERT_TRUE(kvc1_decode(blobs[i].data(), blobs[i].size(), g, kTestFingerprint, cpu.data(), cpu.size(), o).ok());
      EXPECT_EQ(outs[i], cpu) << "bits " << k.bits << " entropy " << k.entropy << " D=" << g.head_dim << " chunk " << i;
    }
  }
}

TEST(WarpEmulation, CorruptWordsSetTheErrorWord) {
  const ChunkGeometry g = geometry(1, 1, 64, 256);
  std::vector<uint8_t> blob =
      testing::encode(g, testing::synthetic_chunk(g, 4).data(), testing::config(CodecMode::kKivi4));
  const size_t word = testing::v_rans_word_offset(blob);
  ASSERT_GT(word, 0u);
  blob[word] ^= 0x40;  // no CRC check on this path: the end-state check must catch it
  DecodeOptions no_crc;
  no_crc.verify_crc = false;
  std::vector<uint8_t> cpu(geometry_bytes(g));
  ASSERT_EQ(kvc1_decode(blob.data(), blob.size(), g, kTestFingerprint, cpu.data(), cpu.size(), no_crc).code(),
            Code::kCorrupt);
  std::vector<std::vector<uint8_t>> outs;
  EXPECT_EQ(emulate({blob}, g, &outs), kvc1::kErrorCorrupt);
}

}  // namespace
}  // namespace kdn::kernels
