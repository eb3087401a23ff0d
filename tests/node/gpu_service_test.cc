// kdnd's GPU tier end to end with a real device: this process is the engine (CUDA runtime,
// its KV in a cudaMalloc'd paged cache, shared with kdnd by a legacy IPC handle), kdnd the
// other process. Chunks stored from device blocks (GPU_STORE) must be byte for byte what the
// CPU gather makes of the same blocks; chunks retrieved into other blocks (GPU_RETRIEVE, with
// and without T0, from T0 the second time) must be byte for byte what the CPU scatter writes;
// a layout reaching outside the registration is refused; with tier.gpu.codec, chunks decoded from
// T0 blobs are what the CPU decoder makes of them. Skips without a device.
#include "kdnd_process.h"

#include <kdn/kernels/codec.h>
#include <kdn/kernels/dtype.h>
#include <kdn/kernels/layout.h>
#include <kdn/kernels/ops.h>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

namespace kdn::testing {
namespace {

constexpr int64_t kBlocks = 16, kBlockSize = 16, kHeads = 2, kDim = 64;
constexpr int64_t kLayerElems = 2 * kBlocks * kBlockSize * kHeads * kDim;  // (2, NB, BS, H, D), f16
constexpr uint32_t kLayers = 2, kT = 16, kChunks = 4;

bool have_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// A vLLM flash-attn NHD cache, on the device and mirrored on the host.
struct Cache {
  uint16_t* dev = nullptr;
  std::vector<uint16_t> host = std::vector<uint16_t>(kLayers * kLayerElems);
  std::vector<void*> dev_bases, host_bases;
  ~Cache() {
    if (dev) cudaFree(dev);
  }
  bool init() {
    if (cudaMalloc(&dev, host.size() * 2) != cudaSuccess) return false;
    for (uint32_t l = 0; l < kLayers; ++l) {
      dev_bases.push_back(dev + l * kLayerElems);
      host_bases.push_back(host.data() + l * kLayerElems);
    }
    return true;
  }
  kdn_engine_layout layout(bool on_device, const int64_t* slots) const {
    kdn_engine_layout l{};
    l.struct_size = sizeof l;
    l.engine_dtype = KDN_DTYPE_F16;
    l.layer_base = on_device ? dev_bases.data() : host_bases.data();
    l.stride_kv = kBlocks * kBlockSize * kHeads * kDim;
    l.stride_block = kBlockSize * kHeads * kDim;
    l.stride_offset = kHeads * kDim;
    l.stride_head = kDim;
    l.stride_dim = 1;
    l.block_size = kBlockSize;
    l.slot_mapping = slots;
    return l;
  }
  bool upload() { return cudaMemcpy(dev, host.data(), host.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess; }
  std::vector<uint16_t> download() const {
    std::vector<uint16_t> out(host.size());
    if (cudaMemcpy(out.data(), dev, out.size() * 2, cudaMemcpyDeviceToHost) != cudaSuccess) out.clear();
    return out;
  }
};

kernels::ChunkGeometry geo(const kdn_model* m) {
  kernels::ChunkGeometry g;
  g.layers = kLayers;
  g.kv_heads = kHeads;
  g.head_dim = kDim;
  g.tokens = kdn_model_chunk_tokens(m);
  g.dtype = kernels::DType::kF16;
  return g;
}

// Registers `cache` with kdnd (legacy IPC handle; the engine event, when given, is what kdnd's
// gathers and comparisons wait for).
kdn_gpu_kv* register_cache(Conn& k, const Cache& cache, const cudaIpcEventHandle_t* engine_event = nullptr) {
  cudaDeviceProp prop{};
  cudaIpcMemHandle_t mem{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess || cudaIpcGetMemHandle(&mem, cache.dev) != cudaSuccess)
    return nullptr;
  kdn_gpu_kv_desc desc{};
  desc.struct_size = sizeof desc;
  desc.kind = KDN_GPU_MEMORY_IPC;
  std::memcpy(desc.device_uuid, &prop.uuid, 16);
  desc.engine_base = uint64_t(uintptr_t(cache.dev));
  desc.bytes = cache.host.size() * 2;
  desc.alloc_bytes = desc.bytes;
  desc.vmm_fd = -1;
  std::memcpy(desc.ipc_handle, &mem, sizeof mem);
  if (engine_event) std::memcpy(desc.engine_event, engine_event, sizeof *engine_event);
  kdn_gpu_kv* kv = nullptr;
  return kdn_gpu_register(k.c, &desc, &kv) == KDN_OK ? kv : nullptr;
}

void run_store_and_retrieve(const std::vector<std::string>& flags) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  KdndProcess d(flags);
  Conn k(d, tiny_model(kT));
  ASSERT_TRUE(k.ok()) << d.log();
  Cache cache;
  ASSERT_TRUE(cache.init());
  for (size_t i = 0; i < cache.host.size(); ++i) cache.host[i] = uint16_t(0x3000 + (i * 7 + 3) % 0x0800);
  ASSERT_TRUE(cache.upload());

  cudaEvent_t written = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&written, cudaEventInterprocess | cudaEventDisableTiming), cudaSuccess);
  cudaIpcEventHandle_t written_handle{};
  ASSERT_EQ(cudaIpcGetEventHandle(&written_handle, written), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(written, 0), cudaSuccess);
  kdn_gpu_kv* kv = register_cache(k, cache, &written_handle);
  ASSERT_NE(kv, nullptr) << d.log();

  // Store chunks 0..3 from engine tokens 0..63 (identity mapping: blocks 0..3).
  const std::vector<int32_t> toks = doc_tokens(11, kChunks * kT);
  const kdn_engine_layout src = cache.layout(true, nullptr);
  uint32_t stored = 0;
  ASSERT_EQ(kdn_gpu_store(k.c, k.m, toks.data(), toks.size(), 0, kChunks, kv, &src, &stored), KDN_OK) << d.log();
  EXPECT_EQ(stored, kChunks);
  // A second store finds them cached.
  ASSERT_EQ(kdn_gpu_store(k.c, k.m, toks.data(), toks.size(), 0, kChunks, kv, &src, &stored), KDN_OK);
  EXPECT_EQ(stored, 0u);

  // What kdnd stored is what the CPU gathers from the same blocks.
  const kernels::ChunkGeometry g = geo(k.m);
  const size_t chunk_bytes = kdn_model_chunk_bytes(k.m);
  kdn_lease* lease = nullptr;
  ASSERT_EQ(kdn_retrieve_lease(k.c, k.m, toks.data(), toks.size(), 0, &lease), KDN_OK);
  ASSERT_EQ(kdn_lease_chunks(lease), kChunks);
  std::vector<std::vector<uint8_t>> chunks(kChunks, std::vector<uint8_t>(chunk_bytes));
  for (uint32_t i = 0; i < kChunks; ++i) {
    std::memcpy(chunks[i].data(), kdn_lease_chunk_data(lease, i), chunk_bytes);
    kernels::EngineView view;
    const kdn_engine_layout host_src = cache.layout(false, nullptr);
    ASSERT_TRUE(kernels::view_from_abi(host_src, g, {0, int64_t(i) * kT}, &view).ok());
    std::vector<uint8_t> want(chunk_bytes);
    ASSERT_TRUE(kernels::gather(view, want.data(), g, kernels::Executor::cpu(1)).ok());
    EXPECT_EQ(std::memcmp(want.data(), chunks[i].data(), chunk_bytes), 0) << "chunk " << i;
  }
  ASSERT_EQ(kdn_lease_release(k.c, lease), KDN_OK);

  // Retrieve into blocks 8..11 (slots 128..191) of a zeroed cache, twice (the second time from
  // T0 where there is one); the result is what the CPU scatter writes.
  std::vector<int64_t> slots(kChunks * kT);
  for (size_t t = 0; t < slots.size(); ++t) slots[t] = 128 + int64_t(t);
  const kdn_engine_layout dst = cache.layout(true, slots.data());
  cudaEvent_t done = nullptr;
  cudaIpcEventHandle_t done_handle;
  std::memcpy(&done_handle, kdn_gpu_kv_done_event(kv), sizeof done_handle);
  ASSERT_EQ(cudaIpcOpenEventHandle(&done, done_handle), cudaSuccess);
  std::vector<uint16_t> want(cache.host.size(), 0);
  for (uint32_t i = 0; i < kChunks; ++i) {
    kernels::EngineView view;
    std::vector<void*> bases;
    for (uint32_t l = 0; l < kLayers; ++l) bases.push_back(want.data() + l * kLayerElems);
    kdn_engine_layout host_dst = cache.layout(false, slots.data());
    host_dst.layer_base = bases.data();
    ASSERT_TRUE(kernels::view_from_abi(host_dst, g, {0, int64_t(i) * kT}, &view).ok());
    ASSERT_TRUE(kernels::scatter(chunks[i].data(), g, view, kernels::Executor::cpu(1)).ok());
  }
  for (int round = 0; round < 2; ++round) {
    ASSERT_EQ(cudaMemset(cache.dev, 0, cache.host.size() * 2), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    uint32_t loaded = 0;
    ASSERT_EQ(kdn_gpu_retrieve(k.c, k.m, toks.data(), toks.size(), 0, kv, &dst, &loaded), KDN_OK) << d.log();
    EXPECT_EQ(loaded, kChunks);
    ASSERT_EQ(cudaStreamWaitEvent(0, done, 0), cudaSuccess);
    const std::vector<uint16_t> got = cache.download();
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 2), 0) << "round " << round;
  }

  // A layout reaching past the registration is refused, and nothing is written.
  std::vector<void*> far = cache.dev_bases;
  far[1] = static_cast<char*>(far[1]) + (1 << 20);
  kdn_engine_layout bad = dst;
  bad.layer_base = far.data();
  uint32_t loaded = 0;
  EXPECT_EQ(kdn_gpu_retrieve(k.c, k.m, toks.data(), toks.size(), 0, kv, &bad, &loaded), KDN_ERR_INVALID_ARGUMENT);
  std::vector<int64_t> wild(slots.size(), kBlocks * kBlockSize);  // one block past the cache
  kdn_engine_layout bad_slots = cache.layout(true, wild.data());
  EXPECT_EQ(kdn_gpu_retrieve(k.c, k.m, toks.data(), toks.size(), 0, kv, &bad_slots, &loaded), KDN_ERR_INVALID_ARGUMENT);

  EXPECT_EQ(kdn_gpu_unregister(k.c, kv), KDN_OK);
  cudaEventDestroy(done);
  cudaEventDestroy(written);
  EXPECT_EQ(kdn_ping(k.c), KDN_OK);
}

// With tier.gpu.codec, T0 holds KVC1 blobs that kdnd encodes after the store: once LOOKUP
// reports every chunk in T0, a retrieve decodes them on the device, and the engine's blocks must
// hold bit for bit what the CPU decoder makes of the same blob (the encoder is deterministic, so
// the blob is re-made here from the stored chunk), scattered as the CPU scatter does. Lossless
// must give back the stored bytes themselves.
void run_coded(const char* codec, kernels::CodecMode mode) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  KdndProcess d({"--log-level", "info", "--set", "tier.gpu.enable=on", "--set", "tier.gpu.bytes=64M", "--set",
                 "tier.gpu.staging_bytes=8M", "--set", std::string("tier.gpu.codec=") + codec});
  Conn k(d, tiny_model(kT));
  ASSERT_TRUE(k.ok()) << d.log();
  Cache cache;
  ASSERT_TRUE(cache.init());
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.f, 1.f);
  // Lossless must save bytes or kdnd keeps the chunk raw in T1 only: Gaussian noise in every
  // mantissa bit does not compress (a 16 KiB chunk encodes to 16.3 KiB), values on a 1/4 grid
  // do (10 KiB).
  const bool grid = mode == kernels::CodecMode::kLossless;
  for (uint16_t& h : cache.host) {
    const float v = normal(rng);
    h = kernels::f32_to_f16(grid ? std::round(v * 4.f) / 4.f : v);
  }
  ASSERT_TRUE(cache.upload());
  kdn_gpu_kv* kv = register_cache(k, cache);
  ASSERT_NE(kv, nullptr) << d.log();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // no engine event: the blocks are written now

  const std::vector<int32_t> toks = doc_tokens(12, kChunks * kT);
  const kdn_engine_layout src = cache.layout(true, nullptr);
  uint32_t stored = 0;
  ASSERT_EQ(kdn_gpu_store(k.c, k.m, toks.data(), toks.size(), 0, kChunks, kv, &src, &stored), KDN_OK) << d.log();
  ASSERT_EQ(stored, kChunks);
  // The encodes run after the store: wait (bounded) until LOOKUP finds every chunk in T0.
  kdn_lookup_result lr{};
  for (int i = 0; i < 1000; ++i) {
    ASSERT_EQ(kdn_lookup(k.c, k.m, toks.data(), toks.size(), &lr), KDN_OK);
    if (lr.tier_chunks[0] == kChunks) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(lr.tier_chunks[0], kChunks) << d.log();
  // int8 and kivi4 blobs of a GPU_STORE are made on the device; lossless ones on the host.
  const bool on_device = d.log().find("encoded on the device") != std::string::npos;
  EXPECT_EQ(on_device, mode != kernels::CodecMode::kLossless) << d.log();

  // The expected blocks: each stored chunk (from T1) encoded and decoded on the CPU, scattered.
  const kernels::ChunkGeometry g = geo(k.m);
  const size_t chunk_bytes = kdn_model_chunk_bytes(k.m);
  const kdn_model_desc model = tiny_model(kT);
  kdn_key fingerprint{};
  ASSERT_EQ(kdn_model_fingerprint(&model, &fingerprint), KDN_OK);
  kdn_lease* lease = nullptr;
  ASSERT_EQ(kdn_retrieve_lease(k.c, k.m, toks.data(), toks.size(), 0, &lease), KDN_OK);
  ASSERT_EQ(kdn_lease_chunks(lease), kChunks);
  std::vector<int64_t> slots(kChunks * kT);
  for (size_t t = 0; t < slots.size(); ++t) slots[t] = 128 + int64_t(t);
  std::vector<uint16_t> want(cache.host.size(), 0);
  kernels::CodecConfig cfg;
  cfg.mode = mode;
  std::vector<uint8_t> blob(kernels::kvc1_max_encoded_size(g, cfg)),
      scratch(kernels::kvc1_encode_scratch_bytes(g, cfg));
  std::vector<uint8_t> decoded(chunk_bytes);
  for (uint32_t i = 0; i < kChunks; ++i) {
    const void* chunk = kdn_lease_chunk_data(lease, i);
    size_t written = 0;
    ASSERT_TRUE(kernels::kvc1_encode(g, fingerprint, chunk, cfg, blob.data(), blob.size(), &written, scratch.data(),
                                     scratch.size())
                    .ok());
    ASSERT_TRUE(kernels::kvc1_decode(blob.data(), written, g, fingerprint, decoded.data(), decoded.size()).ok());
    if (mode == kernels::CodecMode::kLossless) {
      EXPECT_EQ(std::memcmp(decoded.data(), chunk, chunk_bytes), 0);
    }
    std::vector<void*> bases;
    for (uint32_t l = 0; l < kLayers; ++l) bases.push_back(want.data() + l * kLayerElems);
    kdn_engine_layout host_dst = cache.layout(false, slots.data());
    host_dst.layer_base = bases.data();
    kernels::EngineView view;
    ASSERT_TRUE(kernels::view_from_abi(host_dst, g, {0, int64_t(i) * kT}, &view).ok());
    ASSERT_TRUE(kernels::scatter(decoded.data(), g, view, kernels::Executor::cpu(1)).ok());
  }
  ASSERT_EQ(kdn_lease_release(k.c, lease), KDN_OK);

  const kdn_engine_layout dst = cache.layout(true, slots.data());
  cudaEvent_t done = nullptr;
  cudaIpcEventHandle_t done_handle;
  std::memcpy(&done_handle, kdn_gpu_kv_done_event(kv), sizeof done_handle);
  ASSERT_EQ(cudaIpcOpenEventHandle(&done, done_handle), cudaSuccess);
  const std::vector<uint16_t> original = cache.host;
  for (int round = 0; round < 2; ++round) {
    ASSERT_EQ(cudaMemset(cache.dev, 0, cache.host.size() * 2), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    uint32_t loaded = 0;
    ASSERT_EQ(kdn_gpu_retrieve(k.c, k.m, toks.data(), toks.size(), 0, kv, &dst, &loaded), KDN_OK) << d.log();
    EXPECT_EQ(loaded, kChunks);
    ASSERT_EQ(cudaStreamWaitEvent(0, done, 0), cudaSuccess);
    const std::vector<uint16_t> got = cache.download();
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 2), 0) << codec << " round " << round;
    if (mode == kernels::CodecMode::kLossless) {  // the stored tokens 0..63 land bit-exact at slots 128..191
      for (uint32_t l = 0; l < kLayers; ++l)
        for (int64_t p = 0; p < 2; ++p) {
          const size_t plane = l * kLayerElems + p * kBlocks * kBlockSize * kHeads * kDim;
          const size_t n = size_t(kChunks) * kT * kHeads * kDim;
          EXPECT_EQ(std::memcmp(got.data() + plane + 128 * kHeads * kDim, original.data() + plane, n * 2), 0);
        }
    }
  }
  EXPECT_EQ(kdn_gpu_unregister(k.c, kv), KDN_OK);
  cudaEventDestroy(done);
  EXPECT_EQ(kdn_ping(k.c), KDN_OK);
}

TEST(GpuEngine, Kivi4BlobsInT0DecodeLikeTheCpuDecoder) { run_coded("kivi4", kernels::CodecMode::kKivi4); }
TEST(GpuEngine, Int8BlobsInT0DecodeLikeTheCpuDecoder) { run_coded("int8", kernels::CodecMode::kInt8); }
TEST(GpuEngine, LosslessBlobsInT0RoundTripExactly) { run_coded("lossless", kernels::CodecMode::kLossless); }

TEST(GpuEngine, StoreAndRetrieveThroughPinnedHostOnly) {
  run_store_and_retrieve({"--log-level", "info", "--set", "tier.gpu.enable=on"});
}

TEST(GpuEngine, StoreAndRetrieveThroughT0) {
  run_store_and_retrieve({"--log-level", "info", "--set", "tier.gpu.enable=on", "--set", "tier.gpu.bytes=64M", "--set",
                          "tier.gpu.staging_bytes=8M", "--set", "tier.gpu.slice_bytes=64K"});
}

// Segment retrieves on the device (GPU_SEGMENT_RETRIEVE, K re-rotated on kdnd's stream):
// segments stored from the host, then loaded at `target` into device blocks by kdnd and into a
// host buffer of the same layout by libkdn (kdn_segment_retrieve_to): the two must agree bit
// for bit. The third segment
// is never stored (a miss: both calls skip it and answer KDN_ERR_NOT_FOUND).
// Three segments of a test: 40 tokens (a partial last chunk) at base 5, 16 at base 0, and 20 at
// base 9 that are never stored. store() stores the first two from the host mirror of `cache`:
// segment 0 from engine tokens 0..39, segment 1 from 64..79.
struct ThreeSegments {
  std::vector<int32_t> toks[3];
  kdn_segment segs[3] = {};
  ThreeSegments(const ThreeSegments&) = delete;  // segs point into toks
  explicit ThreeSegments(uint32_t seed) {
    const size_t n[3] = {40, 16, 20};
    const int64_t base[3] = {5, 0, 9};
    for (int s = 0; s < 3; ++s) {
      toks[s] = doc_tokens(seed + uint32_t(s), n[s]);
      segs[s].struct_size = sizeof(kdn_segment);
      segs[s].tokens = toks[s].data();
      segs[s].n_tokens = toks[s].size();
      segs[s].base_pos = base[s];
    }
  }
  void store(Conn& k, const Cache& cache) const {
    std::vector<int64_t> from1(16);
    for (size_t t = 0; t < from1.size(); ++t) from1[t] = 64 + int64_t(t);
    const kdn_engine_layout src0 = cache.layout(false, nullptr), src1 = cache.layout(false, from1.data());
    uint32_t stored = 0;
    ASSERT_EQ(kdn_segment_store_from(k.c, k.m, &segs[0], &src0, &stored), KDN_OK);
    EXPECT_EQ(stored, 3u);
    ASSERT_EQ(kdn_segment_store_from(k.c, k.m, &segs[1], &src1, &stored), KDN_OK);
    EXPECT_EQ(stored, 1u);
  }
};

void run_segment_retrieve(const std::vector<std::string>& flags, const int64_t (&target)[3]) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  KdndProcess d(flags);
  Conn k(d, tiny_model(kT));
  ASSERT_TRUE(k.ok()) << d.log();
  Cache cache;
  ASSERT_TRUE(cache.init());
  for (size_t i = 0; i < cache.host.size(); ++i) cache.host[i] = uint16_t(0x3000 + (i * 13 + 5) % 0x0900);
  const ThreeSegments three(21);
  const kdn_segment* segs = three.segs;
  ASSERT_NO_FATAL_FAILURE(three.store(k, cache));

  // Both loads go to slots 128.. (blocks 8..), segment after segment.
  std::vector<int64_t> slots(40 + 16 + 20);
  for (size_t t = 0; t < slots.size(); ++t) slots[t] = 128 + int64_t(t);
  std::vector<uint16_t> want(cache.host.size(), 0);
  std::vector<void*> want_bases;
  for (uint32_t l = 0; l < kLayers; ++l) want_bases.push_back(want.data() + l * kLayerElems);
  kdn_engine_layout host_dst = cache.layout(false, slots.data());
  host_dst.layer_base = want_bases.data();
  uint64_t tokens[3] = {};
  ASSERT_EQ(kdn_segment_retrieve_to(k.c, k.m, segs, 3, target, &host_dst, tokens), KDN_ERR_NOT_FOUND);
  EXPECT_EQ(tokens[0], 40u);
  EXPECT_EQ(tokens[1], 16u);
  EXPECT_EQ(tokens[2], 0u);

  kdn_gpu_kv* kv = register_cache(k, cache);
  ASSERT_NE(kv, nullptr) << d.log();
  cudaEvent_t done = nullptr;
  cudaIpcEventHandle_t done_handle;
  std::memcpy(&done_handle, kdn_gpu_kv_done_event(kv), sizeof done_handle);
  ASSERT_EQ(cudaIpcOpenEventHandle(&done, done_handle), cudaSuccess);
  const kdn_engine_layout dst = cache.layout(true, slots.data());
  for (int round = 0; round < 2; ++round) {  // the second time from T0 where there is one
    ASSERT_EQ(cudaMemset(cache.dev, 0, cache.host.size() * 2), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    uint32_t loaded[3] = {9, 9, 9};
    ASSERT_EQ(kdn_gpu_segment_retrieve(k.c, k.m, segs, 3, target, kv, &dst, loaded), KDN_ERR_NOT_FOUND) << d.log();
    EXPECT_EQ(loaded[0], 3u);
    EXPECT_EQ(loaded[1], 1u);
    EXPECT_EQ(loaded[2], 0u);
    ASSERT_EQ(cudaStreamWaitEvent(0, done, 0), cudaSuccess);
    const std::vector<uint16_t> got = cache.download();
    ASSERT_EQ(got.size(), want.size());
    size_t first_diff = 0;
    while (first_diff < got.size() && got[first_diff] == want[first_diff]) ++first_diff;
    EXPECT_EQ(first_diff, got.size()) << "round " << round << ": first difference at element " << first_diff;
  }
  // Segments 0 and 1 alone load whole.
  uint32_t loaded[2] = {};
  ASSERT_EQ(kdn_gpu_segment_retrieve(k.c, k.m, segs, 2, target, kv, &dst, loaded), KDN_OK) << d.log();
  EXPECT_EQ(loaded[0], 3u);
  EXPECT_EQ(loaded[1], 1u);
  ASSERT_EQ(cudaStreamWaitEvent(0, done, 0), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // A target whose segment would end past KDN_MAX_POSITION is refused in libkdn.
  const int64_t far[2] = {KDN_MAX_POSITION, 0};
  EXPECT_EQ(kdn_gpu_segment_retrieve(k.c, k.m, segs, 2, far, kv, &dst, loaded), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kdn_gpu_unregister(k.c, kv), KDN_OK);
  cudaEventDestroy(done);
  EXPECT_EQ(kdn_ping(k.c), KDN_OK);
}

TEST(GpuEngine, SegmentsMovedOnTheDeviceMatchTheHostPath) {
  const int64_t target[3] = {100, 3, 200};
  run_segment_retrieve({"--log-level", "info", "--set", "tier.gpu.enable=on"}, target);
}

TEST(GpuEngine, SegmentsMovedThroughT0MatchTheHostPath) {
  const int64_t target[3] = {1000003, 41, 7};
  run_segment_retrieve({"--log-level", "info", "--set", "tier.gpu.enable=on", "--set", "tier.gpu.bytes=64M", "--set",
                        "tier.gpu.staging_bytes=8M", "--set", "tier.gpu.slice_bytes=64K"},
                       target);
}

TEST(GpuEngine, SegmentsAtTheirBasePositionAreCopiedAsIs) {
  const int64_t target[3] = {5, 0, 9};  // delta 0 everywhere: plain scatter
  run_segment_retrieve({"--log-level", "info", "--set", "tier.gpu.enable=on"}, target);
}

// GPU_BLEND_SELECT (the blend's selection run by kdnd on the device): two segments stored from the
// host and loaded into device blocks at other positions by kdnd (K re-rotated), a third never
// stored. Then this process plays the check pass: it overwrites layer 1's K rows of four tokens
// with values of four sizes and the V rows of two others, and records its engine event. kdnd
// re-rotates its own copy of layer 1 as the segment retrieve did, so every untouched token has
// deviation 0: exactly the touched tokens come back, the largest changes first when fewer are
// asked, and with nothing changed (layer 0) the tie rule picks the first compared tokens.
void run_blend_select(const std::vector<std::string>& flags) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  KdndProcess d(flags);
  Conn k(d, tiny_model(kT));
  ASSERT_TRUE(k.ok()) << d.log();
  Cache cache;
  ASSERT_TRUE(cache.init());
  for (size_t i = 0; i < cache.host.size(); ++i) cache.host[i] = uint16_t(0x3000 + (i * 11 + 7) % 0x0900);
  const ThreeSegments three(31);
  const kdn_segment* segs = three.segs;
  const int64_t target[3] = {100, 3, 200};
  ASSERT_NO_FATAL_FAILURE(three.store(k, cache));

  cudaEvent_t written = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&written, cudaEventInterprocess | cudaEventDisableTiming), cudaSuccess);
  cudaIpcEventHandle_t written_handle{};
  ASSERT_EQ(cudaIpcGetEventHandle(&written_handle, written), cudaSuccess);
  kdn_gpu_kv* kv = register_cache(k, cache, &written_handle);
  ASSERT_NE(kv, nullptr) << d.log();
  cudaEvent_t done = nullptr;
  cudaIpcEventHandle_t done_handle;
  std::memcpy(&done_handle, kdn_gpu_kv_done_event(kv), sizeof done_handle);
  ASSERT_EQ(cudaIpcOpenEventHandle(&done, done_handle), cudaSuccess);

  // Engine tokens: segment 0 is 0..39, segment 1 40..55, segment 2 56..75 (slots 128..).
  std::vector<int64_t> slots(40 + 16 + 20);
  for (size_t t = 0; t < slots.size(); ++t) slots[t] = 128 + int64_t(t);
  const kdn_engine_layout dst = cache.layout(true, slots.data());
  ASSERT_EQ(cudaMemset(cache.dev, 0, cache.host.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  uint32_t loaded[3] = {};
  ASSERT_EQ(kdn_gpu_segment_retrieve(k.c, k.m, segs, 3, target, kv, &dst, loaded), KDN_ERR_NOT_FOUND) << d.log();
  ASSERT_EQ(cudaStreamWaitEvent(0, done, 0), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  // The check pass: new rows for layer 1.
  std::vector<uint16_t> rows = cache.download();
  ASSERT_EQ(rows.size(), cache.host.size());
  auto set_rows = [&](uint32_t plane, int64_t token, uint16_t value) {
    const int64_t slot = slots[size_t(token)];
    const int64_t at = 1 * kLayerElems + plane * (kBlocks * kBlockSize * kHeads * kDim) +
                       (slot / kBlockSize) * (kBlockSize * kHeads * kDim) + (slot % kBlockSize) * (kHeads * kDim);
    for (int64_t c = 0; c < kHeads * kDim; ++c) rows[size_t(at + c)] = value;
  };
  set_rows(0, 3, 0x4400);   // 4.0: the largest change
  set_rows(0, 17, 0x4200);  // 3.0
  set_rows(0, 41, 0x4000);  // 2.0
  set_rows(0, 50, 0x3C00);  // 1.0
  set_rows(1, 0, 0x4000);
  set_rows(1, 45, 0x3C00);
  set_rows(0, 60, 0x4800);  // segment 2 was never loaded: not compared
  ASSERT_EQ(cudaMemcpy(cache.dev, rows.data(), rows.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(written, 0), cudaSuccess);

  auto select = [&](uint32_t layer, uint32_t plane, double ratio, uint32_t capacity, std::vector<int32_t>* out) {
    out->assign(76, -7);
    uint32_t n = 0, compared = 0;
    const int rc = kdn_gpu_blend_select(k.c, k.m, segs, 3, target, kv, &dst, layer, plane, ratio, out->data(), capacity,
                                        &n, &compared);
    if (rc == KDN_OK) {
      EXPECT_EQ(compared, 56u) << "40 + 16 loaded tokens";
      out->resize(n);
    }
    return rc;
  };
  std::vector<int32_t> got;
  ASSERT_EQ(select(1, KDN_BLEND_PLANE_K, 4.5 / 56, 76, &got), KDN_OK) << d.log();
  EXPECT_EQ(got, (std::vector<int32_t>{3, 17, 41, 50}));
  ASSERT_EQ(select(1, KDN_BLEND_PLANE_K, 2.5 / 56, 76, &got), KDN_OK);
  EXPECT_EQ(got, (std::vector<int32_t>{3, 17}));
  ASSERT_EQ(select(1, KDN_BLEND_PLANE_V, 2.5 / 56, 76, &got), KDN_OK);
  EXPECT_EQ(got, (std::vector<int32_t>{0, 45}));
  ASSERT_EQ(select(0, KDN_BLEND_PLANE_K, 4.5 / 56, 76, &got), KDN_OK);  // nothing changed: the tie rule
  EXPECT_EQ(got, (std::vector<int32_t>{0, 1, 2, 3}));
  ASSERT_EQ(select(1, KDN_BLEND_PLANE_K, 0.0, 76, &got), KDN_OK);
  EXPECT_TRUE(got.empty());
  EXPECT_EQ(select(1, KDN_BLEND_PLANE_K, 4.5 / 56, 3, &got), KDN_ERR_LIMIT);  // room for 3 of 4
  EXPECT_EQ(select(kLayers, KDN_BLEND_PLANE_K, 0.1, 76, &got), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kdn_gpu_unregister(k.c, kv), KDN_OK);
  cudaEventDestroy(done);
  cudaEventDestroy(written);
  EXPECT_EQ(kdn_ping(k.c), KDN_OK);
}

TEST(GpuEngine, BlendSelectionOnTheDeviceFindsTheChangedRows) {
  run_blend_select({"--log-level", "info", "--set", "tier.gpu.enable=on"});
}

TEST(GpuEngine, BlendSelectionReadsT0CopiesAlike) {
  run_blend_select({"--log-level", "info", "--set", "tier.gpu.enable=on", "--set", "tier.gpu.bytes=64M", "--set",
                    "tier.gpu.staging_bytes=8M"});
}

// GPU_CHECK: a retrieve's answer comes once its copies are queued, and its ticket names them;
// kdn_gpu_check says whether they landed whole. The GPU tier's fault seam reports the second
// retrieve's batch as failed when it lands (as a copy that failed on the device would be): the
// check after it says KDN_ERR_IO, the checks before and after KDN_OK.
TEST(GpuEngine, ACheckReportsACopyThatFailedAfterTheAnswer) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(setenv("KDN_TEST_GPU_FAIL_RETRIEVE", "2", 1), 0);
  KdndProcess d({"--log-level", "info", "--set", "tier.gpu.enable=on"}, "", kdn::testing::kdnd_test_binary());
  unsetenv("KDN_TEST_GPU_FAIL_RETRIEVE");
  Conn k(d, tiny_model(kT));
  ASSERT_TRUE(k.ok()) << d.log();
  Cache cache;
  ASSERT_TRUE(cache.init());
  for (size_t i = 0; i < cache.host.size(); ++i) cache.host[i] = uint16_t(0x3000 + (i * 5 + 1) % 0x0700);
  ASSERT_TRUE(cache.upload());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  kdn_gpu_kv* kv = register_cache(k, cache);
  ASSERT_NE(kv, nullptr) << d.log();
  const std::vector<int32_t> toks = doc_tokens(41, 2 * kT);
  const kdn_engine_layout src = cache.layout(true, nullptr);
  uint32_t stored = 0;
  ASSERT_EQ(kdn_gpu_store(k.c, k.m, toks.data(), toks.size(), 0, 2, kv, &src, &stored), KDN_OK) << d.log();
  EXPECT_EQ(stored, 2u);
  EXPECT_EQ(kdn_gpu_check(k.c, kv), KDN_OK) << "nothing retrieved yet";

  std::vector<int64_t> slots(2 * kT);
  for (size_t t = 0; t < slots.size(); ++t) slots[t] = 128 + int64_t(t);
  const kdn_engine_layout dst = cache.layout(true, slots.data());
  for (int round = 1; round <= 3; ++round) {
    uint32_t loaded = 0;
    ASSERT_EQ(kdn_gpu_retrieve(k.c, k.m, toks.data(), toks.size(), 0, kv, &dst, &loaded), KDN_OK) << d.log();
    EXPECT_EQ(loaded, 2u);
    EXPECT_EQ(kdn_gpu_check(k.c, kv), round == 2 ? KDN_ERR_IO : KDN_OK) << "round " << round;
  }
  // Two retrieves, one check: both landed whole.
  for (int round = 0; round < 2; ++round) {
    uint32_t loaded = 0;
    ASSERT_EQ(kdn_gpu_retrieve(k.c, k.m, toks.data(), toks.size(), 0, kv, &dst, &loaded), KDN_OK);
  }
  EXPECT_EQ(kdn_gpu_check(k.c, kv), KDN_OK);
  EXPECT_NE(d.log().find("copies on device 0 failed"), std::string::npos) << d.log();
  EXPECT_EQ(kdn_gpu_unregister(k.c, kv), KDN_OK);
  EXPECT_EQ(kdn_ping(k.c), KDN_OK);
}

// GPU_PREFETCH: chunks stored from the host are brought into T0 ahead of their retrieve; LOOKUP
// then reports them in tier 0, a second prefetch finds them there, and the retrieve that follows
// writes what the CPU scatter of the stored chunks writes. Without T0 the call is refused.
TEST(GpuEngine, PrefetchBringsAPrefixIntoT0) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  KdndProcess d({"--log-level", "info", "--set", "tier.gpu.enable=on", "--set", "tier.gpu.bytes=64M", "--set",
                 "tier.gpu.staging_bytes=8M"});
  Conn k(d, tiny_model(kT));
  ASSERT_TRUE(k.ok()) << d.log();
  Cache cache;
  ASSERT_TRUE(cache.init());
  for (size_t i = 0; i < cache.host.size(); ++i) cache.host[i] = uint16_t(0x3000 + (i * 3 + 2) % 0x0A00);
  const std::vector<int32_t> toks = doc_tokens(51, kChunks * kT);
  const kdn_engine_layout host_src = cache.layout(false, nullptr);
  uint32_t stored = 0;
  ASSERT_EQ(kdn_store_from(k.c, k.m, toks.data(), toks.size(), 0, kChunks, &host_src, &stored), KDN_OK);
  ASSERT_EQ(stored, kChunks);
  kdn_gpu_kv* kv = register_cache(k, cache);
  ASSERT_NE(kv, nullptr) << d.log();

  uint32_t cached = 0, queued = 0;
  ASSERT_EQ(kdn_gpu_prefetch(k.c, k.m, toks.data(), toks.size(), kv, &cached, &queued), KDN_OK) << d.log();
  EXPECT_EQ(cached, kChunks);
  EXPECT_EQ(queued, kChunks);
  kdn_lookup_result look{};
  for (int i = 0; i < 200; ++i) {  // the copies land in the background
    ASSERT_EQ(kdn_lookup(k.c, k.m, toks.data(), toks.size(), &look), KDN_OK);
    if (look.tier_chunks[0] == kChunks) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(look.tier_chunks[0], kChunks) << "every chunk in T0";
  ASSERT_EQ(kdn_gpu_prefetch(k.c, k.m, toks.data(), toks.size(), kv, &cached, &queued), KDN_OK);
  EXPECT_EQ(cached, kChunks);
  EXPECT_EQ(queued, 0u) << "already there";

  // The retrieve reads T0: the blocks hold what the CPU scatter of the stored chunks writes.
  std::vector<int64_t> slots(kChunks * kT);
  for (size_t t = 0; t < slots.size(); ++t) slots[t] = 128 + int64_t(t);
  std::vector<uint16_t> want = cache.host;  // the source rows stay; slots 128.. are overwritten
  std::vector<void*> want_bases;
  for (uint32_t l = 0; l < kLayers; ++l) want_bases.push_back(want.data() + l * kLayerElems);
  kdn_engine_layout host_dst = cache.layout(false, slots.data());
  host_dst.layer_base = want_bases.data();
  uint32_t loaded = 0;
  ASSERT_EQ(kdn_retrieve_to(k.c, k.m, toks.data(), toks.size(), 0, &host_dst, &loaded), KDN_OK);
  ASSERT_EQ(loaded, kChunks);
  ASSERT_TRUE(cache.upload());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const kdn_engine_layout dst = cache.layout(true, slots.data());
  ASSERT_EQ(kdn_gpu_retrieve(k.c, k.m, toks.data(), toks.size(), 0, kv, &dst, &loaded), KDN_OK) << d.log();
  EXPECT_EQ(loaded, kChunks);
  EXPECT_EQ(kdn_gpu_check(k.c, kv), KDN_OK);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cache.download(), want);
  EXPECT_EQ(kdn_gpu_unregister(k.c, kv), KDN_OK);

  KdndProcess no_t0({"--log-level", "info", "--set", "tier.gpu.enable=on"});
  Conn k2(no_t0, tiny_model(kT));
  ASSERT_TRUE(k2.ok());
  ASSERT_EQ(kdn_store_from(k2.c, k2.m, toks.data(), toks.size(), 0, kChunks, &host_src, &stored), KDN_OK);
  kdn_gpu_kv* kv2 = register_cache(k2, cache);
  ASSERT_NE(kv2, nullptr) << no_t0.log();
  EXPECT_EQ(kdn_gpu_prefetch(k2.c, k2.m, toks.data(), toks.size(), kv2, &cached, &queued), KDN_ERR_UNSUPPORTED);
  EXPECT_EQ(kdn_gpu_unregister(k2.c, kv2), KDN_OK);
}

}  // namespace
}  // namespace kdn::testing
