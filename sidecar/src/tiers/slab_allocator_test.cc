#include "tiers/slab_allocator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <vector>

namespace kdn::sidecar {
namespace {

constexpr uint64_t kMiB = 1 << 20;

TEST(SlabAllocator, SlotsAreDisjointAndAligned) {
  SlabAllocator a(256 * kMiB, 64 * kMiB);
  auto c = a.class_for(5 * kMiB + 123);
  ASSERT_TRUE(c);
  EXPECT_EQ(a.slot_bytes(*c) % SlabAllocator::kSlotAlign, 0u);
  std::vector<uint64_t> offs;
  while (auto o = a.alloc(*c)) offs.push_back(*o);
  EXPECT_EQ(offs.size(), 4u * (64 * kMiB / a.slot_bytes(*c)));
  std::sort(offs.begin(), offs.end());
  for (size_t i = 1; i < offs.size(); ++i) EXPECT_GE(offs[i] - offs[i - 1], a.slot_bytes(*c));
  EXPECT_LE(offs.back() + a.slot_bytes(*c), a.capacity());
}

TEST(SlabAllocator, EmptySlabsMoveBetweenClasses) {
  SlabAllocator a(128 * kMiB, 64 * kMiB);
  auto small = a.class_for(8 * kMiB);
  auto big = a.class_for(32 * kMiB);
  std::vector<uint64_t> s;
  while (auto o = a.alloc(*small)) s.push_back(*o);
  EXPECT_EQ(s.size(), 16u);
  EXPECT_FALSE(a.alloc(*big));
  for (int i = 0; i < 8; ++i) a.free(*small, s[i]);  // one whole slab comes free
  EXPECT_EQ(a.free_slabs(), 1u);
  EXPECT_TRUE(a.alloc(*big));
  EXPECT_TRUE(a.alloc(*big));
  EXPECT_FALSE(a.alloc(*big));
}

TEST(SlabAllocator, LargeSlotsSpanContiguousSlabs) {
  SlabAllocator a(256 * kMiB, 64 * kMiB);
  auto huge = a.class_for(100 * kMiB);  // two slabs per slot
  ASSERT_TRUE(huge);
  auto x = a.alloc(*huge), y = a.alloc(*huge);
  ASSERT_TRUE(x && y);
  EXPECT_FALSE(a.alloc(*huge));
  a.free(*huge, *x);
  EXPECT_EQ(a.free_slabs(), 2u);
  EXPECT_TRUE(a.alloc(*huge));
  EXPECT_FALSE(a.class_for(300 * kMiB));  // can never fit
  EXPECT_FALSE(a.class_for(0));
}

TEST(SlabAllocator, RandomChurnKeepsAccounting) {
  SlabAllocator a(512 * kMiB, 64 * kMiB);
  std::vector<uint16_t> cls = {*a.class_for(kMiB), *a.class_for(5 * kMiB), *a.class_for(32 * kMiB)};
  std::mt19937 rng(7);
  std::vector<std::pair<uint16_t, uint64_t>> live;
  std::set<uint64_t> offsets;
  for (int i = 0; i < 20000; ++i) {
    if (live.empty() || rng() % 2) {
      uint16_t c = cls[rng() % cls.size()];
      if (auto o = a.alloc(c)) {
        ASSERT_TRUE(offsets.insert(*o).second) << "slot handed out twice";
        live.emplace_back(c, *o);
      }
    } else {
      size_t k = rng() % live.size();
      a.free(live[k].first, live[k].second);
      offsets.erase(live[k].second);
      live[k] = live.back();
      live.pop_back();
    }
  }
  uint64_t used = 0;
  for (auto& [c, o] : live) used += a.slot_bytes(c);
  EXPECT_EQ(used, a.used_bytes());
  for (auto& [c, o] : live) a.free(c, o);
  EXPECT_EQ(a.used_bytes(), 0u);
  EXPECT_EQ(a.free_slabs(), 8u);
}

}  // namespace
}  // namespace kdn::sidecar
