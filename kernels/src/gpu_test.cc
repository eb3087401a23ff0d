// The CUDA launchers run the same bodies as the CPU launchers: every op's device result must
// equal the CPU result bit for bit. Every case skips when no CUDA device is present.
#include <kdn/kernels/blend.h>
#include <kdn/kernels/device.h>
#include <kdn/kernels/ops.h>

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "test_support.h"

namespace kdn::kernels {
namespace {

using testing::EngineBuffers;

#define SKIP_WITHOUT_DEVICE() \
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device"

// Device memory freed on scope exit.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) { EXPECT_TRUE(device_alloc(bytes ? bytes : 1, &p_).ok()); }
  template <class T>
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size() * sizeof(T)) {
    EXPECT_TRUE(copy_to_device(p_, host.data(), host.size() * sizeof(T)).ok());
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_) { o.p_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&&) = delete;
  ~DeviceBuffer() { device_free(p_); }
  void* get() const { return p_; }
  template <class T>
  std::vector<T> to_host(size_t n) const {
    std::vector<T> out(n);
    EXPECT_TRUE(copy_to_host(out.data(), p_, n * sizeof(T)).ok());
    return out;
  }

 private:
  void* p_ = nullptr;
};

// A device mirror of EngineBuffers: same contents, device pointer arrays, device slot mapping.
struct DeviceEngine {
  std::vector<DeviceBuffer> k, v;
  std::unique_ptr<DeviceBuffer> k_bases, v_bases, slots;
  EngineView view;

  DeviceEngine(const EngineBuffers& host, const std::vector<int64_t>* slot_mapping) {
    std::vector<void*> kp, vp;
    for (const auto& b : host.k) kp.push_back(k.emplace_back(b).get());
    for (const auto& b : host.v) vp.push_back(v.emplace_back(b).get());
    k_bases = std::make_unique<DeviceBuffer>(kp);
    view = host.view;
    view.layer_base[0] = static_cast<void* const*>(k_bases->get());
    view.layer_base[1] = view.layer_base[0];
    if (!vp.empty()) {
      v_bases = std::make_unique<DeviceBuffer>(vp);
      view.layer_base[1] = static_cast<void* const*>(v_bases->get());
    }
    if (slot_mapping) {
      slots = std::make_unique<DeviceBuffer>(*slot_mapping);
      view.slot_mapping = static_cast<const int64_t*>(slots->get());
    }
  }
  // Copies device contents back into a host EngineBuffers for comparison.
  void read_into(EngineBuffers* host) const {
    for (size_t l = 0; l < k.size(); ++l) host->k[l] = k[l].to_host<uint8_t>(host->k[l].size());
    for (size_t l = 0; l < v.size(); ++l) host->v[l] = v[l].to_host<uint8_t>(host->v[l].size());
  }
};

const PagedShape kShape{3, 4, 64, 12, 16, DType::kF16};

struct Case {
  EngineLayoutKind kind;
  DType chunk, engine;
  bool permute;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (EngineLayoutKind kind : kAllEngineLayouts)
    for (auto [c, e] : {std::pair{DType::kF16, DType::kF16},
                        {DType::kBF16, DType::kF16},
                        {DType::kF32, DType::kFP8E4M3},
                        {DType::kF16, DType::kF32}})
      out.push_back({kind, c, e, kind == EngineLayoutKind::kLlamaCppRows});
  return out;
}

TEST(Gpu, ScatterAndGatherEqualCpu) {
  SKIP_WITHOUT_DEVICE();
  uint64_t seed = 1;
  for (const Case& c : cases()) {
    SCOPED_TRACE(engine_layout_name(c.kind));
    CounterRng rng(++seed);
    const ChunkGeometry g{kShape.layers, kShape.kv_heads, kShape.head_dim, 150, c.chunk};
    const std::vector<uint8_t> src = testing::random_chunk(g, seed);
    const std::vector<int64_t> slots = testing::random_slots(rng, g.tokens, kShape.num_blocks, kShape.block_size, 10);
    PagedShape shape = kShape;
    shape.dtype = c.engine;
    EngineBuffers cpu, gpu_result;
    ASSERT_TRUE(cpu.init(c.kind, shape, c.permute).ok());
    ASSERT_TRUE(gpu_result.init(c.kind, shape, c.permute).ok());
    DeviceEngine dev(cpu, &slots);
    cpu.view.slot_mapping = slots.data();
    DeviceBuffer dsrc(src);
    ASSERT_TRUE(scatter(src.data(), g, cpu.view, Executor::cpu()).ok());
    ASSERT_TRUE(scatter(dsrc.get(), g, dev.view, Executor::cuda(nullptr)).ok());
    ASSERT_TRUE(stream_sync(nullptr).ok());
    dev.read_into(&gpu_result);
    ASSERT_TRUE(cpu == gpu_result);
    std::vector<uint8_t> cpu_back(src.size(), 0);
    DeviceBuffer dback(cpu_back);
    ASSERT_TRUE(gather(cpu.view, cpu_back.data(), g, Executor::cpu()).ok());
    ASSERT_TRUE(gather(dev.view, dback.get(), g, Executor::cuda(nullptr)).ok());
    ASSERT_TRUE(stream_sync(nullptr).ok());
    ASSERT_EQ(dback.to_host<uint8_t>(src.size()), cpu_back);
  }
}

TEST(Gpu, RopeScatterAndRopeChunkEqualCpu) {
  SKIP_WITHOUT_DEVICE();
  RopeConfig cfg{RopeStyle::kNeox, 64, 0, 500000.0, RopeScaling::kLlama3, {8.0f, 1.0f, 4.0f, 8192.0f}};
  uint64_t seed = 50;
  for (const Case& c : cases())
    for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kGptj}) {
      SCOPED_TRACE(engine_layout_name(c.kind));
      cfg.style = style;
      cfg.rotary_dim = style == RopeStyle::kNeox ? 64 : 48;
      std::vector<float> inv(cfg.rotary_dim / 2);
      ASSERT_TRUE(compute_inv_freq(cfg, inv.data(), inv.size()).ok());
      CounterRng rng(++seed);
      const ChunkGeometry g{kShape.layers, kShape.kv_heads, kShape.head_dim, 100, c.chunk};
      std::vector<int64_t> deltas(g.tokens);
      for (int64_t& d : deltas) d = static_cast<int64_t>(rng.next_below(1 << 18)) - (1 << 17);
      std::vector<float> table(rope_table_floats(g.tokens, cfg.rotary_dim));
      ASSERT_TRUE(
          build_rope_table(inv.data(), cfg.rotary_dim, deltas.data(), g.tokens, table.data(), table.size()).ok());
      DeviceBuffer dtable(table);
      const RopeTable host_rt{style, cfg.rotary_dim, table.data(), 1};
      const RopeTable dev_rt{style, cfg.rotary_dim, static_cast<const float*>(dtable.get()), 1};
      const std::vector<uint8_t> src = testing::random_chunk(g, seed);
      const std::vector<int64_t> slots = testing::random_slots(rng, g.tokens, kShape.num_blocks, kShape.block_size, 10);
      PagedShape shape = kShape;
      shape.dtype = c.engine;
      EngineBuffers cpu, gpu_result;
      ASSERT_TRUE(cpu.init(c.kind, shape, c.permute).ok());
      ASSERT_TRUE(gpu_result.init(c.kind, shape, c.permute).ok());
      DeviceEngine dev(cpu, &slots);
      cpu.view.slot_mapping = slots.data();
      DeviceBuffer dsrc(src);
      ASSERT_TRUE(rope_scatter(src.data(), g, cpu.view, host_rt, Executor::cpu()).ok());
      ASSERT_TRUE(rope_scatter(dsrc.get(), g, dev.view, dev_rt, Executor::cuda(nullptr)).ok());
      ASSERT_TRUE(stream_sync(nullptr).ok());
      dev.read_into(&gpu_result);
      ASSERT_TRUE(cpu == gpu_result);
      std::vector<uint8_t> cpu_chunk = src;
      ASSERT_TRUE(rope_chunk(cpu_chunk.data(), g, host_rt, Executor::cpu()).ok());
      ASSERT_TRUE(rope_chunk(dsrc.get(), g, dev_rt, Executor::cuda(nullptr)).ok());
      ASSERT_TRUE(stream_sync(nullptr).ok());
      ASSERT_EQ(dsrc.to_host<uint8_t>(src.size()), cpu_chunk);
    }
}

TEST(Gpu, OutOfBoundsSlotsAreSkippedOnDevice) {
  SKIP_WITHOUT_DEVICE();
  const ChunkGeometry g{kShape.layers, kShape.kv_heads, kShape.head_dim, 4, DType::kF16};
  const std::vector<uint8_t> src = testing::random_chunk(g, 9);
  std::vector<int64_t> slots = {0, kShape.num_blocks * kShape.block_size, -1, 5};
  EngineBuffers cpu, gpu_result;
  ASSERT_TRUE(cpu.init(EngineLayoutKind::kVllmFlashNhd, kShape, false).ok());
  ASSERT_TRUE(gpu_result.init(EngineLayoutKind::kVllmFlashNhd, kShape, false).ok());
  DeviceEngine dev(cpu, &slots);
  DeviceBuffer dsrc(src);
  ASSERT_TRUE(scatter(dsrc.get(), g, dev.view, Executor::cuda(nullptr)).ok());
  ASSERT_TRUE(stream_sync(nullptr).ok());
  dev.read_into(&gpu_result);
  slots[1] = -1;  // the CPU equivalent of skipping the out-of-range token
  cpu.view.slot_mapping = slots.data();
  ASSERT_TRUE(scatter(src.data(), g, cpu.view, Executor::cpu()).ok());
  EXPECT_TRUE(cpu == gpu_result);
}

TEST(Gpu, BlendOpsEqualCpu) {
  SKIP_WITHOUT_DEVICE();
  const uint32_t n = 5000, width = 8 * 128 + 3;
  CounterRng rng(77);
  std::vector<uint16_t> fresh(size_t{n} * width), cached(size_t{n} * width);
  testing::fill_random(fresh.data(), fresh.size(), DType::kF16, rng, 1.0);
  testing::fill_random(cached.data(), cached.size(), DType::kF16, rng, 1.0);
  std::vector<uint8_t> cand(n);
  for (auto& c : cand) c = rng.next_below(5) != 0;
  cand[17] = cand[18] = 1;
  const TokenRows hf{fresh.data(), DType::kF16, width, width}, hc{cached.data(), DType::kF16, width, width};
  std::vector<float> cpu_dev(n);
  ASSERT_TRUE(kv_deviation(hf, hc, n, cand.data(), cpu_dev.data(), Executor::cpu()).ok());
  DeviceBuffer dfresh(fresh), dcached(cached), dcand(cand), ddev(n * sizeof(float));
  const TokenRows df{dfresh.get(), DType::kF16, width, width}, dc{dcached.get(), DType::kF16, width, width};
  ASSERT_TRUE(kv_deviation(df, dc, n, static_cast<const uint8_t*>(dcand.get()), static_cast<float*>(ddev.get()),
                           Executor::cuda(nullptr))
                  .ok());
  ASSERT_TRUE(stream_sync(nullptr).ok());
  const std::vector<float> gpu_dev = ddev.to_host<float>(n);
  ASSERT_EQ(0, memcmp(gpu_dev.data(), cpu_dev.data(), n * sizeof(float)));
  cpu_dev[17] = cpu_dev[18];  // a tie, so the index rule decides (both sides rank cpu_dev)
  for (uint32_t k : {0u, 1u, 750u, n}) {
    std::vector<uint8_t> cpu_scratch(*top_k_scratch_bytes(n, Executor::cpu()));
    std::vector<int32_t> cpu_sel(n);
    uint32_t cpu_count = 0;
    ASSERT_TRUE(select_top_k(cpu_dev.data(), cand.data(), n, k, cpu_sel.data(), &cpu_count, cpu_scratch.data(),
                             cpu_scratch.size(), Executor::cpu())
                    .ok());
    Result<size_t> need = top_k_scratch_bytes(n, Executor::cuda(nullptr));
    ASSERT_TRUE(need.ok());
    DeviceBuffer scratch(*need), dsel(n * sizeof(int32_t)), dcount(sizeof(uint32_t)), ddev2(cpu_dev);
    ASSERT_TRUE(select_top_k(static_cast<const float*>(ddev2.get()), static_cast<const uint8_t*>(dcand.get()), n, k,
                             static_cast<int32_t*>(dsel.get()), static_cast<uint32_t*>(dcount.get()), scratch.get(),
                             *need, Executor::cuda(nullptr))
                    .ok());
    ASSERT_TRUE(stream_sync(nullptr).ok());
    const uint32_t gpu_count = dcount.to_host<uint32_t>(1)[0];
    ASSERT_EQ(gpu_count, cpu_count) << "k " << k;
    const std::vector<int32_t> gpu_sel = dsel.to_host<int32_t>(n);
    ASSERT_TRUE(std::equal(cpu_sel.begin(), cpu_sel.begin() + cpu_count, gpu_sel.begin())) << "k " << k;
  }
  const std::vector<int32_t> sel = {1, 2, 400, 4999};
  std::vector<uint16_t> cpu_ctx = cached;
  ASSERT_TRUE(
      merge_rows(hf, sel.data(), 4, MutableTokenRows{cpu_ctx.data(), DType::kF16, width, width}, n, Executor::cpu())
          .ok());
  DeviceBuffer dsel(sel);
  ASSERT_TRUE(merge_rows(df, static_cast<const int32_t*>(dsel.get()), 4,
                         MutableTokenRows{dcached.get(), DType::kF16, width, width}, n, Executor::cuda(nullptr))
                  .ok());
  ASSERT_TRUE(stream_sync(nullptr).ok());
  EXPECT_EQ(dcached.to_host<uint16_t>(cached.size()), cpu_ctx);
}

}  // namespace
}  // namespace kdn::kernels
