#include "payload_allocator.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace kdn::shim {
namespace {

TEST(PayloadAllocator, FirstFitAndCoalescing) {
  PayloadAllocator a(4096);
  auto x = a.alloc(100), y = a.alloc(1000), z = a.alloc(2000);
  ASSERT_TRUE(x && y && z);
  EXPECT_EQ(x->off % PayloadAllocator::kAlign, 0u);
  EXPECT_GE(y->off, x->off + 100);
  EXPECT_FALSE(a.alloc(2048)) << "only ~900 bytes left";
  a.free(*y);
  a.free(*x);
  a.free(*z);
  auto all = a.alloc(4096);
  ASSERT_TRUE(all) << "freed neighbours must coalesce back into one range";
  EXPECT_EQ(all->off, 0u);
}

TEST(PayloadAllocator, RandomChurnNeverOverlaps) {
  PayloadAllocator a(1 << 16);
  std::mt19937 rng(3);
  std::vector<PayloadRange> live;
  for (int i = 0; i < 5000; ++i) {
    if (live.empty() || rng() % 3) {
      if (auto r = a.alloc(1 + rng() % 3000)) {
        for (auto& o : live) ASSERT_TRUE(r->off + r->len <= o.off || o.off + o.len <= r->off);
        live.push_back(*r);
      }
    } else {
      size_t k = rng() % live.size();
      a.free(live[k]);
      live.erase(live.begin() + k);
    }
  }
  for (auto& r : live) a.free(r);
  EXPECT_TRUE(a.alloc(1 << 16));
}

}  // namespace
}  // namespace kdn::shim
