// The pool of pinned landings (pinned_landings.h) and the landing search, on the CPU: the seam
// counts what would be page-locked, so reuse, the idle cap and the hand-back from another thread
// are checked without a device.
#include "pinned_landings.h"
#include "t0_device_encode.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace kdn::sidecar::gpu {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

std::atomic<int> g_pins{0}, g_unpins{0};
std::atomic<bool> g_refuse{false};

Status fake_pin(void* p, size_t bytes) noexcept {
  if (g_refuse.load() || p == nullptr || bytes == 0) return Status(Code::kUnsupported, "no pinning here");
  ++g_pins;
  return OkStatus();
}
void fake_unpin(void*) noexcept { ++g_unpins; }

class PinnedLandingsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    g_pins = 0;
    g_unpins = 0;
    g_refuse = false;
  }
};

TEST_F(PinnedLandingsTest, ABufferIsPinnedOnceAndReusedStoreAfterStore) {
  auto pool = PinnedLandings::create(PinSeam{fake_pin, fake_unpin}, 64 * kMiB);
  std::byte* first = nullptr;
  for (int store = 0; store < 10; ++store) {
    auto l = pool->acquire(3 * kMiB + 5);
    ASSERT_TRUE(l.ok());
    EXPECT_GE(l->size(), 3 * kMiB + 5);
    if (store == 0) first = l->data();
    EXPECT_EQ(l->data(), first) << "store " << store << " got a fresh buffer";
  }
  EXPECT_EQ(g_pins.load(), 1);
  EXPECT_EQ(g_unpins.load(), 0);
  const LandingStats s = pool->stats();
  EXPECT_EQ(s.pinned, 1u);
  EXPECT_EQ(s.reused, 9u);
  EXPECT_EQ(s.idle_bytes, 4 * kMiB);
  pool.reset();
  EXPECT_EQ(g_unpins.load(), 1) << "the idle buffer is unpinned with the pool";
}

TEST_F(PinnedLandingsTest, TheSmallestIdleBufferThatFitsIsTaken) {
  auto pool = PinnedLandings::create(PinSeam{fake_pin, fake_unpin}, 64 * kMiB);
  {
    auto big = pool->acquire(16 * kMiB);
    auto small = pool->acquire(2 * kMiB);
    ASSERT_TRUE(big.ok() && small.ok());
  }
  auto l = pool->acquire(kMiB + 1);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->size(), 2 * kMiB);
  auto l2 = pool->acquire(3 * kMiB);  // larger than the small one: the big one
  ASSERT_TRUE(l2.ok());
  EXPECT_EQ(l2->size(), 16 * kMiB);
  EXPECT_EQ(g_pins.load(), 2);
}

TEST_F(PinnedLandingsTest, IdleBuffersPastTheCapAreUnpinnedAndFreed) {
  auto pool = PinnedLandings::create(PinSeam{fake_pin, fake_unpin}, 8 * kMiB);
  {
    auto a = pool->acquire(4 * kMiB);
    auto b = pool->acquire(4 * kMiB);
    auto c = pool->acquire(4 * kMiB);
    ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  }
  EXPECT_EQ(g_pins.load(), 3);
  EXPECT_EQ(g_unpins.load(), 1) << "two fit under 8 MiB; the third is let go";
  EXPECT_EQ(pool->stats().idle_bytes, 8 * kMiB);
}

TEST_F(PinnedLandingsTest, APinRefusalIsAnErrorAndHoldsNothing) {
  auto pool = PinnedLandings::create(PinSeam{fake_pin, fake_unpin}, 8 * kMiB);
  g_refuse = true;
  auto l = pool->acquire(kMiB);
  EXPECT_EQ(l.status().code(), Code::kUnsupported);
  EXPECT_EQ(pool->stats().idle_bytes, 0u);
  EXPECT_EQ(pool.use_count(), 1) << "a failed acquire keeps no reference to the pool";
}

TEST_F(PinnedLandingsTest, AWorkerHoldingTheLastLandingGivesItBackAfterThePoolsOwnerLeft) {
  auto pool = PinnedLandings::create(PinSeam{fake_pin, fake_unpin}, 8 * kMiB);
  auto l = pool->acquire(kMiB);
  ASSERT_TRUE(l.ok());
  PinnedLandings::Landing held = std::move(*l);
  pool.reset();  // the service went away; the job still holds its landing (and the pool)
  std::thread worker([h = std::move(held)]() mutable { h = PinnedLandings::Landing(); });
  worker.join();
  EXPECT_EQ(g_pins.load(), 1);
  EXPECT_EQ(g_unpins.load(), 1) << "kept idle, then unpinned with the pool";
}

TEST(FindLanded, FollowsTheStoresOrderAndFindsKeysOutOfIt) {
  StoreEncodes enc;
  for (uint64_t i = 0; i < 5; ++i) enc.keys.push_back(T0Key{1, kdn_key{i, i}, 7});
  uint32_t cursor = 0;
  EXPECT_EQ(find_landed(enc, enc.keys[0], cursor), -1) << "not landed yet";
  enc.landed = true;
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(find_landed(enc, enc.keys[size_t(i)], cursor), i);
  EXPECT_EQ(find_landed(enc, enc.keys[3], cursor), 3) << "out of order: found by wrapping";
  EXPECT_EQ(find_landed(enc, enc.keys[1], cursor), 1);
  EXPECT_EQ(find_landed(enc, T0Key{1, kdn_key{9, 9}, 7}, cursor), -1);
  EXPECT_EQ(find_landed(enc, T0Key{1, kdn_key{2, 2}, 8}, cursor), -1) << "another generation";
}

}  // namespace
}  // namespace kdn::sidecar::gpu
