// The GPU engine API through libkdn and a real kdnd on a machine without a GPU (CI): kdnd
// starts with its GPU tier off and says why, GPU calls are refused with KDN_ERR_UNSUPPORTED
// (never a crash, a hang or a wrong answer), `tier.gpu.enable = on` makes kdnd refuse to
// start, and bad arguments are caught in libkdn. The data path itself needs a device: it is
// exercised by kdn-gpu-engine on a GPU machine.
#include "kdnd_process.h"

#include <kdn/kernels/executor.h>

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

namespace kdn::testing {
namespace {

kdn_gpu_kv_desc ipc_desc() {
  kdn_gpu_kv_desc d{};
  d.struct_size = sizeof d;
  d.kind = KDN_GPU_MEMORY_IPC;
  d.engine_base = 0x7f0000000000ull;
  d.bytes = 1 << 20;
  d.alloc_bytes = 1 << 20;
  d.vmm_fd = -1;
  d.ipc_handle[0] = 1;
  return d;
}

kdn_engine_layout some_layout(void** bases) {
  kdn_engine_layout l{};
  l.struct_size = sizeof l;
  l.engine_dtype = KDN_DTYPE_F16;
  l.layer_base = bases;
  l.stride_kv = 1 << 16;
  l.stride_block = 16 * 2 * 64;
  l.stride_offset = 2 * 64;
  l.stride_head = 64;
  l.stride_dim = 1;
  l.block_size = 16;
  return l;
}

TEST(GpuApi, WithoutAGpuTierRegistrationIsUnsupported) {
  if (kernels::cuda_device_count() > 0) GTEST_SKIP() << "a GPU is present: kdnd's GPU tier would be on";
  KdndProcess d({"--log-level", "info"});
  Conn k(d, tiny_model());
  ASSERT_TRUE(k.ok());
  const kdn_gpu_kv_desc desc = ipc_desc();
  kdn_gpu_kv* kv = reinterpret_cast<kdn_gpu_kv*>(uintptr_t(1));
  EXPECT_EQ(kdn_gpu_register(k.c, &desc, &kv), KDN_ERR_UNSUPPORTED);
  EXPECT_EQ(kv, nullptr);
  EXPECT_EQ(kdn_ping(k.c), KDN_OK) << "the session stays usable";
  EXPECT_NE(d.log().find("GPU tier off: no CUDA device answers"), std::string::npos) << d.log();
}

TEST(GpuApi, TierOffByConfigurationIsUnsupported) {
  KdndProcess d({"--log-level", "info", "--set", "tier.gpu.enable=off"});
  Conn k(d, tiny_model());
  ASSERT_TRUE(k.ok());
  const kdn_gpu_kv_desc desc = ipc_desc();
  kdn_gpu_kv* kv = nullptr;
  EXPECT_EQ(kdn_gpu_register(k.c, &desc, &kv), KDN_ERR_UNSUPPORTED);
  EXPECT_NE(d.log().find("GPU tier off: tier.gpu.enable = off"), std::string::npos) << d.log();
  // Every other path keeps working.
  EXPECT_EQ(store_doc(k, 3, 2), 2);
  EXPECT_EQ(verify_doc(k, 3, 2), 2);
}

TEST(GpuApi, EnableOnWithoutADeviceRefusesToStart) {
  if (kernels::cuda_device_count() > 0) GTEST_SKIP() << "a GPU is present";
  char dir[] = "/tmp/kdn-gpu-test-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string sock = std::string(dir) + "/kdnd.sock", log = std::string(dir) + "/kdnd.log";
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) ::dup2(fd, 2);
    execl(KDN_KDND_PATH, KDN_KDND_PATH, "--socket", sock.c_str(), "--host-arena-bytes", "64M", "--slab-bytes", "16M",
          "--no-populate", "--set", "tier.gpu.enable=on", static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_NE(WEXITSTATUS(status), 0);
  std::ifstream f(log);
  std::stringstream text;
  text << f.rdbuf();
  EXPECT_NE(text.str().find("tier.gpu.enable = on but no CUDA device answers"), std::string::npos) << text.str();
  ::unlink(log.c_str());
  ::unlink(sock.c_str());
  ::rmdir(dir);
}

TEST(GpuApi, BadArgumentsAreCaughtInLibkdn) {
  KdndProcess d;
  Conn k(d, tiny_model());
  ASSERT_TRUE(k.ok());
  kdn_gpu_kv* kv = nullptr;
  EXPECT_EQ(kdn_gpu_register(k.c, nullptr, &kv), KDN_ERR_INVALID_ARGUMENT);
  kdn_gpu_kv_desc desc = ipc_desc();
  EXPECT_EQ(kdn_gpu_register(nullptr, &desc, &kv), KDN_ERR_INVALID_ARGUMENT);
  desc.struct_size = 8;
  EXPECT_EQ(kdn_gpu_register(k.c, &desc, &kv), KDN_ERR_VERSION);
  desc = ipc_desc();
  desc.kind = 7;
  EXPECT_EQ(kdn_gpu_register(k.c, &desc, &kv), KDN_ERR_INVALID_ARGUMENT);
  desc = ipc_desc();
  desc.kind = KDN_GPU_MEMORY_VMM_FD;
  desc.vmm_fd = -1;
  EXPECT_EQ(kdn_gpu_register(k.c, &desc, &kv), KDN_ERR_INVALID_ARGUMENT);
  desc = ipc_desc();
  desc.bytes = 0;
  EXPECT_EQ(kdn_gpu_register(k.c, &desc, &kv), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kdn_gpu_kv_done_event(nullptr), nullptr);
  EXPECT_EQ(kdn_gpu_unregister(k.c, nullptr), KDN_ERR_INVALID_ARGUMENT);
  const std::vector<int32_t> toks = doc_tokens(1, 64);
  void* bases[2] = {reinterpret_cast<void*>(0x7f0000000000ull), reinterpret_cast<void*>(0x7f0000100000ull)};
  const kdn_engine_layout l = some_layout(bases);
  uint32_t n = 99;
  EXPECT_EQ(kdn_gpu_retrieve(k.c, k.m, toks.data(), toks.size(), 0, nullptr, &l, &n), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(n, 0u);
  EXPECT_EQ(kdn_gpu_retrieve(k.c, k.m, toks.data(), toks.size(), 0, nullptr, &l, nullptr), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kdn_gpu_store(k.c, k.m, toks.data(), toks.size(), 0, 4, nullptr, &l, &n), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kdn_ping(k.c), KDN_OK);
}

// One 40-token segment at base 4, moved to 10, and a layout of device addresses nobody mapped.
struct OneSegment {
  std::vector<int32_t> toks = doc_tokens(1, 40);
  kdn_segment seg{};
  void* bases[2] = {reinterpret_cast<void*>(0x7f0000000000ull), reinterpret_cast<void*>(0x7f0000100000ull)};
  kdn_engine_layout l = some_layout(bases);
  int64_t target = 10;
  OneSegment() {
    seg.struct_size = sizeof seg;
    seg.tokens = toks.data();
    seg.n_tokens = toks.size();
    seg.base_pos = 4;
  }
  OneSegment(const OneSegment&) = delete;  // seg and l point into the members
};

TEST(GpuApi, SegmentRetrieveArgumentsAreCaughtInLibkdn) {
  KdndProcess d;
  Conn k(d, tiny_model());
  ASSERT_TRUE(k.ok());
  const OneSegment one;
  const kdn_segment& seg = one.seg;
  const kdn_engine_layout& l = one.l;
  const int64_t& target = one.target;
  uint32_t loaded = 99;
  // No registration (none can be made without a GPU tier): refused before anything is sent.
  EXPECT_EQ(kdn_gpu_segment_retrieve(k.c, k.m, &seg, 1, &target, nullptr, &l, &loaded), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(loaded, 0u);
  EXPECT_EQ(kdn_gpu_segment_retrieve(nullptr, k.m, &seg, 1, &target, nullptr, &l, &loaded), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kdn_gpu_segment_retrieve(k.c, k.m, &seg, 1, nullptr, nullptr, &l, &loaded), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kdn_gpu_segment_retrieve(k.c, k.m, &seg, 1, &target, nullptr, nullptr, &loaded), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kdn_gpu_segment_retrieve(k.c, k.m, nullptr, 1, &target, nullptr, &l, nullptr), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kdn_ping(k.c), KDN_OK);
}

TEST(GpuApi, BlendSelectArgumentsAreCaughtInLibkdn) {
  KdndProcess d;
  Conn k(d, tiny_model());
  ASSERT_TRUE(k.ok());
  const OneSegment one;
  const kdn_segment& seg = one.seg;
  const kdn_engine_layout& l = one.l;
  const int64_t& target = one.target;
  int32_t sel[40];
  uint32_t n = 99, compared = 99;
  auto call = [&](kdn_client* c, const kdn_segment* s, const int64_t* t, const kdn_engine_layout* lay, uint32_t layer,
                  uint32_t plane, double ratio, int32_t* out, uint32_t cap, uint32_t* n_out) {
    return kdn_gpu_blend_select(c, k.m, s, 1, t, nullptr, lay, layer, plane, ratio, out, cap, n_out, &compared);
  };
  // No registration (none can be made without a GPU tier): refused before anything is sent.
  EXPECT_EQ(call(k.c, &seg, &target, &l, 0, KDN_BLEND_PLANE_K, 0.15, sel, 40, &n), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(n, 0u);
  EXPECT_EQ(compared, 0u);
  EXPECT_EQ(call(nullptr, &seg, &target, &l, 0, KDN_BLEND_PLANE_K, 0.15, sel, 40, &n), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(call(k.c, &seg, nullptr, &l, 0, KDN_BLEND_PLANE_K, 0.15, sel, 40, &n), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(call(k.c, &seg, &target, nullptr, 0, KDN_BLEND_PLANE_K, 0.15, sel, 40, &n), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(call(k.c, &seg, &target, &l, 0, 2, 0.15, sel, 40, &n), KDN_ERR_INVALID_ARGUMENT);  // no such plane
  EXPECT_EQ(call(k.c, &seg, &target, &l, 0, KDN_BLEND_PLANE_V, 1.5, sel, 40, &n), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(call(k.c, &seg, &target, &l, 0, KDN_BLEND_PLANE_V, -0.1, sel, 40, &n), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(call(k.c, &seg, &target, &l, 0, KDN_BLEND_PLANE_V, std::nan(""), sel, 40, &n), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(call(k.c, &seg, &target, &l, 0, KDN_BLEND_PLANE_K, 0.15, nullptr, 40, &n), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(call(k.c, &seg, &target, &l, 0, KDN_BLEND_PLANE_K, 0.15, sel, 40, nullptr), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_GE(kdn_abi_minor(), 4u);  // the GPU blend and check calls came with minor 4
  EXPECT_EQ(kdn_gpu_check(k.c, nullptr), KDN_ERR_INVALID_ARGUMENT);
  uint32_t cached = 9, queued = 9;
  EXPECT_EQ(kdn_gpu_prefetch(k.c, k.m, one.toks.data(), one.toks.size(), nullptr, &cached, &queued),
            KDN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(cached, 0u);
  EXPECT_EQ(queued, 0u);
  EXPECT_EQ(kdn_gpu_prefetch(nullptr, k.m, one.toks.data(), one.toks.size(), nullptr, &cached, &queued),
            KDN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kdn_gpu_check(nullptr, nullptr), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kdn_ping(k.c), KDN_OK);
}

}  // namespace
}  // namespace kdn::testing
