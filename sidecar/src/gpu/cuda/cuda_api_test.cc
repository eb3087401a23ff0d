// cuda_api.h: the completion queue and the no-device answers on every machine; devices, the T0
// region, host registration, copies, priorities and completions on a device; and, across two
// processes, an engine's legacy IPC memory, VMM memory and interprocess event opened by kdnd.
// Every device case skips without a device.
#include "cuda_api.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "aligned_buffer.h"
#include "cuda_api_testing.h"

namespace kdn::sidecar::gpu {
namespace {

constexpr int kWaitMs = 30000;  // every wait on a device or the other process is bounded
constexpr uint64_t kMiB = 1 << 20;

#define SKIP_WITHOUT_DEVICE() \
  if (!available()) GTEST_SKIP() << "no CUDA device"

bool readable(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN) != 0;
}

// ---- CompletionQueue (every build) ---------------------------------------------------------------

TEST(CompletionQueue, PushMakesTheFdReadableAndDrainClearsIt) {
  CompletionQueue q;
  ASSERT_TRUE(q.ok());
  EXPECT_FALSE(readable(q.fd(), 0));
  q.push({7, false});
  q.push({8, true});
  q.push({9, false});
  EXPECT_TRUE(readable(q.fd(), 0));
  std::vector<CompletionQueue::Done> got;
  ASSERT_EQ(q.drain(&got), 3u);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].token, 7u);
  EXPECT_FALSE(got[0].failed);
  EXPECT_EQ(got[1].token, 8u);
  EXPECT_TRUE(got[1].failed);
  EXPECT_EQ(got[2].token, 9u);
  EXPECT_FALSE(readable(q.fd(), 0));
  EXPECT_EQ(q.drain(&got), 0u);
  EXPECT_EQ(q.drain(nullptr), 0u);
}

TEST(CompletionQueue, EveryTokenFromManyThreadsIsDrainedOnce) {
  constexpr int kThreads = 8, kEach = 2000;
  CompletionQueue q;
  ASSERT_TRUE(q.ok());
  std::vector<std::thread> pushers;
  for (int t = 0; t < kThreads; ++t) {
    pushers.emplace_back([&q, t] {
      for (int i = 0; i < kEach; ++i) q.push({static_cast<uint64_t>(t) * kEach + i, false});
    });
  }
  std::set<uint64_t> seen;
  std::vector<CompletionQueue::Done> got;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kWaitMs);
  while (seen.size() < size_t{kThreads} * kEach && std::chrono::steady_clock::now() < deadline) {
    if (!readable(q.fd(), 100)) continue;
    got.clear();
    q.drain(&got);
    for (const auto& d : got) EXPECT_TRUE(seen.insert(d.token).second) << "token " << d.token << " twice";
  }
  for (auto& t : pushers) t.join();
  got.clear();
  q.drain(&got);
  EXPECT_TRUE(got.empty());
  EXPECT_EQ(seen.size(), size_t{kThreads} * kEach);
  EXPECT_FALSE(readable(q.fd(), 0));
}

// ---- without CUDA or without a device ------------------------------------------------------------

void expect_unsupported(const Status& st, const char* call) {
  EXPECT_EQ(st.code(), Code::kUnsupported) << call << ": " << st.what();
  EXPECT_GT(std::strlen(st.what()), 10u) << call;
}

TEST(GpuApiWithoutDevice, EveryCallAnswersUnsupported) {
  if (available()) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_TRUE(devices().empty());
  EXPECT_FALSE(can_access_peer(0, 1));
  const uint8_t uuid[16] = {};
  expect_unsupported(device_by_uuid(uuid).status(), "device_by_uuid");
  expect_unsupported(enable_peer_access(0, 1), "enable_peer_access");
  AlignedBuffer host(kMiB);
  expect_unsupported(host_register(host.data(), host.size()), "host_register");
  host_unregister(host.data());
  auto region = region_create(0, 64 * kMiB);
  expect_unsupported(region.status(), "region_create");
  IpcHandle h;
  expect_unsupported(open_ipc_memory(0, h).status(), "open_ipc_memory");
  const int fd = ::eventfd(0, EFD_CLOEXEC);
  expect_unsupported(import_vmm_memory(0, fd, 2 * kMiB).status(), "import_vmm_memory");
  ::close(fd);
  expect_unsupported(stream_create(0, true).status(), "stream_create");
  expect_unsupported(ipc_event_create(0, &h).status(), "ipc_event_create");
  expect_unsupported(ipc_event_open(0, h).status(), "ipc_event_open");
  int dummy = 0, dummy2 = 0;
  expect_unsupported(copy_async(&dummy, &dummy2, sizeof dummy, nullptr), "copy_async");
  CompletionQueue q;
  expect_unsupported(notify_after(nullptr, &q, 1), "notify_after");
  std::vector<CompletionQueue::Done> got;
  EXPECT_EQ(q.drain(&got), 0u) << "a refused notify_after pushed a token";
  expect_unsupported(testing::ipc_alloc(0, kMiB, &h).status(), "testing::ipc_alloc");
  expect_unsupported(testing::vmm_alloc_export(0, kMiB).status(), "testing::vmm_alloc_export");
  EXPECT_NE(last_error(), nullptr);
  // The void calls are no-ops.
  DeviceRegion empty;
  region_destroy(empty);
  close_ipc_memory(0, nullptr);
  unmap_vmm_memory(nullptr, 0);
  stream_destroy(nullptr);
  event_destroy(nullptr);
}

// ---- on a device ---------------------------------------------------------------------------------

uint32_t pattern(uint32_t seed, size_t i) { return static_cast<uint32_t>(i * 2654435761u) ^ seed; }

void fill(void* p, size_t bytes, uint32_t seed) {
  auto* w = static_cast<uint32_t*>(p);
  for (size_t i = 0; i < bytes / 4; ++i) w[i] = pattern(seed, i);
}

// The index of the first word that differs from `seed`'s pattern, or -1.
int64_t first_mismatch(const void* p, size_t bytes, uint32_t seed) {
  const auto* w = static_cast<const uint32_t*>(p);
  for (size_t i = 0; i < bytes / 4; ++i) {
    if (w[i] != pattern(seed, i)) return static_cast<int64_t>(i);
  }
  return -1;
}

// A stream destroyed on scope exit.
struct Stream {
  void* s = nullptr;
  explicit Stream(bool low_priority = true) {
    auto r = stream_create(0, low_priority);
    EXPECT_TRUE(r.ok()) << r.status().what();
    if (r.ok()) s = *r;
  }
  ~Stream() { stream_destroy(s); }
};

TEST(GpuApi, DevicesAreDescribedAndFoundByUuid) {
  SKIP_WITHOUT_DEVICE();
  const auto all = devices();
  ASSERT_FALSE(all.empty());
  for (size_t i = 0; i < all.size(); ++i) {
    const DeviceInfo& d = all[i];
    EXPECT_EQ(d.ordinal, static_cast<int>(i));
    EXPECT_GT(std::strlen(d.name), 0u);
    EXPECT_GT(d.memory_bytes, 64 * kMiB);
    EXPECT_GE(d.sm_major, 5);
    const uint8_t zero[16] = {};
    EXPECT_NE(std::memcmp(d.uuid, zero, 16), 0);
    auto found = device_by_uuid(d.uuid);
    ASSERT_TRUE(found.ok()) << found.status().what();
    EXPECT_EQ(*found, d.ordinal);
    std::printf("device %d: %s sm_%d%d %llu MiB pci %04x:%02x:%02x vmm=%d posix_fd=%d\n", d.ordinal, d.name, d.sm_major,
                d.sm_minor, static_cast<unsigned long long>(d.memory_bytes / kMiB), d.pci_domain, d.pci_bus,
                d.pci_device, d.vmm_supported, d.posix_fd_handles);
  }
  uint8_t nobody[16];
  std::memset(nobody, 0xff, sizeof nobody);
  EXPECT_EQ(device_by_uuid(nobody).status().code(), Code::kNotFound);
}

TEST(GpuApi, BadArgumentsAreRefusedWithTheCudaError) {
  SKIP_WITHOUT_DEVICE();
  EXPECT_EQ(region_create(0, 0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(host_register(nullptr, kMiB).code(), Code::kInvalidArgument);
  EXPECT_EQ(ipc_event_create(0, nullptr).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(notify_after(nullptr, nullptr, 1).code(), Code::kInvalidArgument);
  EXPECT_FALSE(stream_create(devices().size() + 3, true).ok());
  IpcHandle garbage;
  std::memset(garbage.bytes, 0x5a, sizeof garbage.bytes);
  auto opened = open_ipc_memory(0, garbage);
  ASSERT_FALSE(opened.ok());
  EXPECT_NE(std::strstr(opened.status().what(), "cudaIpcOpenMemHandle"), nullptr) << opened.status().what();
  const int fd = ::eventfd(0, EFD_CLOEXEC);
  EXPECT_EQ(import_vmm_memory(0, fd, 4097).status().code(), Code::kInvalidArgument);
  ::close(fd);
}

TEST(GpuApi, RegionHoldsWhatIsCopiedIn) {
  SKIP_WITHOUT_DEVICE();
  const uint64_t bytes = 64 * kMiB;
  auto region = region_create(0, bytes);
  ASSERT_TRUE(region.ok()) << region.status().what();
  EXPECT_NE(region->base, nullptr);
  EXPECT_EQ(region->bytes, bytes);
  EXPECT_EQ(region->ipc_capable, region->pool != nullptr);
  std::printf("region: %s\n", region->ipc_capable ? "POSIX-fd pool" : "cudaMalloc fallback");
  Stream s;
  std::vector<uint32_t> in(bytes / 4), out(bytes / 4, 0);
  fill(in.data(), bytes, 0x1234);
  ASSERT_TRUE(copy_async(region->base, in.data(), bytes, s.s).ok());
  ASSERT_TRUE(copy_async(out.data(), region->base, bytes, s.s).ok());
  ASSERT_TRUE(stream_sync(s.s).ok());
  EXPECT_EQ(first_mismatch(out.data(), bytes, 0x1234), -1);
  region_destroy(*region);
  EXPECT_EQ(region->base, nullptr);
  EXPECT_EQ(region->pool, nullptr);
}

TEST(GpuApi, RegisteredHostMemoryCopiesBitExact) {
  SKIP_WITHOUT_DEVICE();
  const uint64_t bytes = 64 * kMiB;
  AlignedBuffer src(bytes), dst(bytes);
  ASSERT_NE(src.data(), nullptr);
  ASSERT_NE(dst.data(), nullptr);
  ASSERT_TRUE(host_register(src.data(), bytes).ok());
  ASSERT_TRUE(host_register(src.data(), bytes).ok()) << "registering twice is success";
  ASSERT_TRUE(host_register(dst.data(), bytes).ok());
  IpcHandle unused;
  auto dev = testing::ipc_alloc(0, bytes, &unused);
  ASSERT_TRUE(dev.ok()) << dev.status().what();
  fill(src.data(), bytes, 0xabcd);
  std::memset(dst.data(), 0, bytes);
  Stream s;
  ASSERT_TRUE(copy_async(*dev, src.data(), bytes, s.s).ok());
  ASSERT_TRUE(copy_async(dst.data(), *dev, bytes, s.s).ok());
  ASSERT_TRUE(stream_sync(s.s).ok());
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), bytes), 0);
  testing::ipc_free(0, *dev);
  host_unregister(src.data());
  host_unregister(dst.data());
}

TEST(GpuApi, StreamsOfBothPrioritiesCopy) {
  SKIP_WITHOUT_DEVICE();
  Stream low(true), high(false);
  ASSERT_NE(low.s, nullptr);
  ASSERT_NE(high.s, nullptr);
  std::vector<uint32_t> a(kMiB / 4), b(kMiB / 4, 0), c(kMiB / 4, 0);
  fill(a.data(), kMiB, 77);
  IpcHandle unused;
  auto dev = testing::ipc_alloc(0, kMiB, &unused);
  ASSERT_TRUE(dev.ok()) << dev.status().what();
  ASSERT_TRUE(copy_async(*dev, a.data(), kMiB, low.s).ok());
  ASSERT_TRUE(stream_sync(low.s).ok());
  ASSERT_TRUE(copy_async(b.data(), *dev, kMiB, high.s).ok());
  ASSERT_TRUE(copy_async(c.data(), *dev, kMiB, low.s).ok());
  ASSERT_TRUE(stream_sync(high.s).ok());
  ASSERT_TRUE(stream_sync(low.s).ok());
  EXPECT_EQ(first_mismatch(b.data(), kMiB, 77), -1);
  EXPECT_EQ(first_mismatch(c.data(), kMiB, 77), -1);
  testing::ipc_free(0, *dev);
}

TEST(GpuApi, NotifyAfterDeliversTokensOnceTheCopyHasRun) {
  SKIP_WITHOUT_DEVICE();
  const uint64_t bytes = 64 * kMiB;
  AlignedBuffer host(bytes), back(bytes);
  ASSERT_TRUE(host_register(host.data(), bytes).ok());
  ASSERT_TRUE(host_register(back.data(), bytes).ok());
  fill(host.data(), bytes, 0x5eed);
  IpcHandle unused;
  auto dev = testing::ipc_alloc(0, bytes, &unused);
  ASSERT_TRUE(dev.ok()) << dev.status().what();
  CompletionQueue q;
  Stream s;
  ASSERT_TRUE(copy_async(*dev, host.data(), bytes, s.s).ok());
  ASSERT_TRUE(notify_after(s.s, &q, 41).ok());
  ASSERT_TRUE(copy_async(back.data(), *dev, bytes, s.s).ok());
  ASSERT_TRUE(notify_after(s.s, &q, 42).ok());
  std::vector<CompletionQueue::Done> got;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kWaitMs);
  while (got.size() < 2 && std::chrono::steady_clock::now() < deadline) {
    if (readable(q.fd(), 100)) q.drain(&got);
  }
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].token, 41u);
  EXPECT_EQ(got[1].token, 42u);
  EXPECT_FALSE(got[0].failed || got[1].failed);
  // Token 42 ran after the copy back: its bytes are there without a sync.
  EXPECT_EQ(std::memcmp(host.data(), back.data(), bytes), 0);
  ASSERT_TRUE(stream_sync(s.s).ok());
  testing::ipc_free(0, *dev);
  host_unregister(host.data());
  host_unregister(back.data());
}

}  // namespace
}  // namespace kdn::sidecar::gpu
