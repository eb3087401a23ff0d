#include "chunk_store.h"

#include <gtest/gtest.h>

#include <vector>

namespace kdn::sidecar {
namespace {

constexpr uint64_t kMiB = 1 << 20;
kdn_key K(uint64_t i) { return kdn_key{i, ~i}; }
const kdn_key kFp{1, 2};

class ChunkStoreTest : public ::testing::TestWithParam<EvictionKind> {
 protected:
  // 4 slabs of 64 MiB, 8 MiB chunks: 32 slots.
  ChunkStore s{256 * kMiB, 64 * kMiB, GetParam()};
  uint64_t now = 1;

  ChunkEntry* put(uint64_t i, uint64_t session = 1) {
    auto r = s.reserve(K(i), kFp, 8 * kMiB, session, ++now);
    EXPECT_TRUE(r.ok()) << r.status().what();
    if (!r.ok() || r->outcome != ChunkStore::ReserveOutcome::kReserved) return nullptr;
    EXPECT_TRUE(s.commit(r->entry, session, ++now).ok());
    return r->entry;
  }
};

TEST_P(ChunkStoreTest, TwoPhaseStoreAndLookup) {
  auto r = s.reserve(K(1), kFp, 8 * kMiB, 7, ++now);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->outcome, ChunkStore::ReserveOutcome::kReserved);
  const kdn_key keys[] = {K(1)};
  EXPECT_EQ(s.lookup(keys, 8 * kMiB), 0u) << "reserved chunks are invisible";
  auto r2 = s.reserve(K(1), kFp, 8 * kMiB, 8, ++now);
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(r2->outcome, ChunkStore::ReserveOutcome::kInFlight);
  EXPECT_FALSE(s.commit(r->entry, 8, ++now).ok()) << "only the writer commits";
  ASSERT_TRUE(s.commit(r->entry, 7, ++now).ok());
  EXPECT_EQ(s.lookup(keys, 8 * kMiB), 1u);
  EXPECT_EQ(s.lookup(keys, 4 * kMiB), 0u) << "a size mismatch is a miss";
  auto r3 = s.reserve(K(1), kFp, 8 * kMiB, 8, ++now);
  EXPECT_EQ(r3->outcome, ChunkStore::ReserveOutcome::kAlreadyCached);
}

TEST_P(ChunkStoreTest, LookupStopsAtFirstGap) {
  put(1); put(2); put(4);
  const kdn_key keys[] = {K(1), K(2), K(3), K(4)};
  EXPECT_EQ(s.lookup(keys, 8 * kMiB), 2u);
}

TEST_P(ChunkStoreTest, AbortFreesTheSlot) {
  for (int i = 0; i < 32; ++i) {
    auto r = s.reserve(K(100 + i), kFp, 8 * kMiB, 3, ++now);
    ASSERT_TRUE(r.ok());
  }
  auto full = s.reserve(K(999), kFp, 8 * kMiB, 3, ++now);
  EXPECT_EQ(full.status().code(), Code::kNoSpace) << "reservations are never evicted";
  auto again = s.reserve(K(100), kFp, 8 * kMiB, 4, ++now);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->outcome, ChunkStore::ReserveOutcome::kInFlight);
  ChunkEntry* e = const_cast<ChunkEntry*>(s.find(K(100)));
  EXPECT_FALSE(s.abort(e, 4).ok());
  ASSERT_TRUE(s.abort(e, 3).ok());
  EXPECT_TRUE(s.reserve(K(999), kFp, 8 * kMiB, 3, ++now).ok());
}

TEST_P(ChunkStoreTest, EvictionUnderPressureNeverTouchesLeases) {
  for (int i = 0; i < 32; ++i) ASSERT_NE(put(i), nullptr);
  // Lease the first 8: they must survive any amount of pressure.
  std::vector<ChunkEntry*> leased;
  for (int i = 0; i < 8; ++i) leased.push_back(s.lease(K(i), 8 * kMiB, ++now));
  for (int i = 32; i < 200; ++i) ASSERT_NE(put(i), nullptr) << i;
  for (int i = 0; i < 8; ++i) EXPECT_NE(s.find(K(i)), nullptr) << "leased chunk " << i << " evicted";
  EXPECT_EQ(s.resident_chunks(), 32u);
  EXPECT_GE(s.counters().evicted_chunks, 168u);
  // Everything leased or reserved: no space, and no hang.
  for (int i = 8; i < 32; ++i) s.evict_if({});
  uint64_t n = 0;
  s.for_each([&](const ChunkEntry& e) { n += e.leases > 0; return true; });
  EXPECT_EQ(n, 8u);
  for (int i = 0; i < 24; ++i) ASSERT_TRUE(s.reserve(K(1000 + i), kFp, 8 * kMiB, 9, ++now).ok());
  auto r = s.reserve(K(5000), kFp, 8 * kMiB, 9, ++now);
  EXPECT_EQ(r.status().code(), Code::kNoSpace);
  for (ChunkEntry* e : leased) s.release(e);
  EXPECT_TRUE(s.reserve(K(5000), kFp, 8 * kMiB, 9, ++now).ok());
}

TEST_P(ChunkStoreTest, RecentlyUsedChunksSurvive) {
  for (int i = 0; i < 32; ++i) put(i);
  // Keep touching chunk 0; under LRU and S3-FIFO it must outlive a scan of new chunks.
  for (int i = 32; i < 64; ++i) {
    ChunkEntry* e = s.lease(K(0), 8 * kMiB, ++now);
    ASSERT_NE(e, nullptr) << "hot chunk evicted at step " << i;
    s.touch(e, ++now);
    s.release(e);
    put(i);
  }
}

TEST_P(ChunkStoreTest, MixedSizesShareTheArena) {
  for (int i = 0; i < 32; ++i) put(i);
  // A 32 MiB model arrives: whole slabs of the 8 MiB class must be freed for it.
  for (int i = 0; i < 6; ++i) {
    auto r = s.reserve(K(500 + i), kFp, 32 * kMiB, 2, ++now);
    ASSERT_TRUE(r.ok()) << i << ": " << r.status().what();
    ASSERT_TRUE(s.commit(r->entry, 2, ++now).ok());
  }
  uint64_t n = 0, bytes = 0, big = 0;
  s.for_each([&](const ChunkEntry& e) {
    ++n;
    bytes += e.bytes;
    big += e.bytes == 32 * kMiB;
    return true;
  });
  EXPECT_GE(big, 1u);
  EXPECT_EQ(n, s.resident_chunks());
  EXPECT_EQ(bytes, s.resident_bytes());
  EXPECT_LE(s.resident_bytes(), s.capacity_bytes());
  EXPECT_NE(s.find(K(505)), nullptr) << "the newest chunk is resident";
}

INSTANTIATE_TEST_SUITE_P(Policies, ChunkStoreTest,
                         ::testing::Values(EvictionKind::kLru, EvictionKind::kS3Fifo));

}  // namespace
}  // namespace kdn::sidecar
