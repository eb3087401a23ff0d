// The index state machine and the moves between tiers, with the fault-injecting tier standing
// in for a lower tier: demotion on eviction, promotion on lease, transfers that fail or
// return damaged bytes, and chunks leased while they move.
#include "tiered_store.h"
#include "chunk_index.h"
#include "tiers/fault_tier.h"
#include "tiers/host_arena_tier.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

namespace kdn::sidecar {
namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kChunk = 1 * kMiB;  // above the host tier's inline copy size: real workers
kdn_key K(uint64_t i) { return kdn_key{i, ~i}; }
const kdn_key kFp{1, 2};

TEST(ChunkIndex, StateMachine) {
  ChunkIndex idx;
  Entry* e = idx.create(K(1), kFp, 100, 7, 1);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->state, EntryState::kReserved);
  EXPECT_EQ(e->owner_session, 7u);
  const uint64_t g1 = e->generation;
  const Placement p{4096, 4096, 0};
  idx.begin_move(e, TierId::kHost, p);
  EXPECT_TRUE(e->moving_to(TierId::kHost));
  EXPECT_FALSE(e->in_tier(TierId::kHost));
  idx.begin_write(e);
  EXPECT_EQ(e->state, EntryState::kWriting);
  idx.end_move(e, TierId::kHost, true);
  idx.publish(e, 5);
  EXPECT_TRUE(e->committed());
  EXPECT_EQ(e->owner_session, 0u);
  EXPECT_TRUE(e->in_tier(TierId::kHost));
  EXPECT_EQ(e->fastest_tier(), tier_index(TierId::kHost));
  EXPECT_TRUE(e->evictable_from(TierId::kHost));
  ++e->leases;
  EXPECT_FALSE(e->evictable_from(TierId::kHost)) << "a leased host copy stays";
  --e->leases;
  ++e->io;
  EXPECT_FALSE(e->evictable_from(TierId::kHost)) << "nothing under a transfer leaves";
  --e->io;
  // A second copy below; dropping the host one leaves the disk one.
  idx.begin_move(e, TierId::kDisk, Placement{0, 4096, 0});
  EXPECT_TRUE(e->evictable_from(TierId::kHost));
  idx.end_move(e, TierId::kDisk, true);
  EXPECT_EQ(idx.drop_copy(e, TierId::kHost).offset, 4096u);
  EXPECT_EQ(e->fastest_tier(), tier_index(TierId::kDisk));
  idx.drop_copy(e, TierId::kDisk);
  EXPECT_EQ(e->fastest_tier(), kTierCount);
  idx.erase(e);
  EXPECT_EQ(idx.find(K(1)), nullptr);
  Entry* again = idx.create(K(1), kFp, 100, 8, 9);
  EXPECT_GT(again->generation, g1) << "a key created anew is a new generation";
  EXPECT_EQ(idx.counters().created, 2u);
  EXPECT_EQ(idx.counters().published, 1u);
}

TEST(ChunkIndex, FailedMoveReturnsItsPlacement) {
  ChunkIndex idx;
  Entry* e = idx.create(K(2), kFp, 100, 1, 1);
  idx.begin_move(e, TierId::kDisk, Placement{8192, 4096, 3});
  const Placement back = idx.end_move(e, TierId::kDisk, false);
  EXPECT_EQ(back.offset, 8192u);
  EXPECT_EQ(back.slot_class, 3u);
  EXPECT_FALSE(e->in_tier(TierId::kDisk));
  EXPECT_FALSE(e->placement[tier_index(TierId::kDisk)].valid());
}

// A host tier of `slots` 1 MiB chunks over a real sealed memfd, and optionally a fault tier.
class TieredStoreTest : public ::testing::Test {
 protected:
  void build(uint32_t slots, bool with_disk, EvictAction host_rule = EvictAction::kDemote, uint32_t disk_slots = 16) {
    ipc::SegmentOptions so;
    so.seal_writes = true;
    auto seg = ipc::SharedSegment::create("test-arena", slots * kChunk, so);
    ASSERT_TRUE(seg.ok());
    HostArenaOptions ho;
    ho.slab_bytes = kChunk;
    ho.copy_threads = 2;
    auto host = HostArenaTier::create(std::move(*seg), ho);
    ASSERT_TRUE(host.ok());
    host_ = std::move(*host);
    std::array<Tier*, kTierCount> tiers{};
    std::array<TierRules, kTierCount> rules{};
    tiers[tier_index(TierId::kHost)] = host_.get();
    rules[tier_index(TierId::kHost)] = TierRules{host_rule, EvictionKind::kLru};
    if (with_disk) {
      auto disk = FaultTier::create(TierId::kDisk, disk_slots * kChunk, kChunk);
      ASSERT_TRUE(disk.ok());
      disk_ = std::move(*disk);
      tiers[tier_index(TierId::kDisk)] = disk_.get();
      rules[tier_index(TierId::kDisk)] = TierRules{EvictAction::kDrop, EvictionKind::kLru};
    }
    store_ = std::make_unique<TieredStore>(TierPolicy(tiers, rules), options_);
    staged_.assign(kChunk, std::byte{0});
  }

  // Runs the transfers until `pred` holds (or 2 s pass); returns the events seen.
  template <class Pred>
  std::vector<StoreEvent> settle_until(Pred pred, bool* room = nullptr) {
    std::vector<StoreEvent> events;
    bool r = false;
    for (int i = 0; i < 200000 && !pred(events); ++i) {
      if (disk_) disk_->complete_all();
      store_->poll(events, &r);
    }
    if (room) *room = r;
    return events;
  }

  // Stores chunk i holding the byte pattern i, through a commit from staged memory.
  void put(uint64_t i) {
    auto r = store_->reserve(K(i), kFp, kChunk, 1, ++now_);
    ASSERT_TRUE(r.ok()) << r.status().what();
    ASSERT_EQ(r->outcome, TieredStore::ReserveOutcome::kReserved);
    std::memset(staged_.data(), int(i & 0xFF), kChunk);
    ASSERT_TRUE(store_->commit(r->entry, staged_.data(), 100 + i, 0).ok());
    auto ev = settle_until([&](auto& e) { return !e.empty(); });
    ASSERT_EQ(ev.size(), 1u);
    ASSERT_TRUE(ev[0].status.ok());
    store_->settle(K(i));
  }

  uint32_t hits(uint64_t i, uint32_t* tier = nullptr) {
    uint32_t tiers[kTierCount] = {};
    const kdn_key k = K(i);
    const uint32_t h = store_->lookup(std::span(&k, 1), kChunk, tiers);
    if (tier) *tier = tiers[tier_index(TierId::kDisk)] ? tier_index(TierId::kDisk) : tier_index(TierId::kHost);
    return h;
  }

  bool host_bytes_are(const Entry* e, uint64_t i) {
    const std::byte* p = host_->address(e->placement[tier_index(TierId::kHost)]);
    for (uint64_t b = 0; b < kChunk; b += 4096)
      if (p[b] != std::byte(i & 0xFF)) return false;
    return true;
  }

  std::unique_ptr<HostArenaTier> host_;
  std::unique_ptr<FaultTier> disk_;
  std::unique_ptr<TieredStore> store_;
  StoreOptions options_;
  std::vector<std::byte> staged_;
  uint64_t now_ = 1;
};

TEST_F(TieredStoreTest, CommitPublishesOnlyWhenTheCopyLands) {
  build(4, false);
  auto r = store_->reserve(K(1), kFp, kChunk, 1, ++now_);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(hits(1), 0u) << "a reservation is invisible";
  auto again = store_->reserve(K(1), kFp, kChunk, 2, ++now_);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->outcome, TieredStore::ReserveOutcome::kInFlight);
  std::memset(staged_.data(), 0x5A, kChunk);
  ASSERT_TRUE(store_->commit(r->entry, staged_.data(), 9, 77).ok());
  EXPECT_EQ(store_->reserve(K(1), kFp, kChunk, 2, ++now_)->outcome, TieredStore::ReserveOutcome::kInFlight)
      << "being written is still in flight for other writers";
  auto ev = settle_until([](auto& e) { return !e.empty(); });
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].waiter, 9u);
  EXPECT_EQ(ev[0].cookie, 77u);
  EXPECT_EQ(hits(1), 1u);
  Entry* e = nullptr;
  ASSERT_EQ(store_->acquire(K(1), kChunk, 1, &e, ++now_), TieredStore::Acquired::kLeased);
  EXPECT_TRUE(host_bytes_are(e, 0x5A));
  store_->unpin(e);
  EXPECT_EQ(store_->counters().stored_chunks, 1u);
  EXPECT_EQ(store_->reserve(K(1), kFp, kChunk, 2, ++now_)->outcome, TieredStore::ReserveOutcome::kAlreadyCached);
}

TEST_F(TieredStoreTest, DropEvictionAndLeasedChunksStay) {
  build(4, false, EvictAction::kDrop);
  for (uint64_t i = 1; i <= 4; ++i) put(i);
  Entry* leased = nullptr;
  ASSERT_EQ(store_->acquire(K(1), kChunk, 1, &leased, ++now_), TieredStore::Acquired::kLeased);
  put(5);  // evicts the least recent unleased chunk: 2
  EXPECT_EQ(hits(1), 1u) << "leased chunks are never evicted";
  EXPECT_EQ(hits(2), 0u);
  EXPECT_EQ(store_->counters().dropped_chunks, 1u);
  // With every slot leased, a reservation is refused at once.
  std::vector<Entry*> pins;
  for (uint64_t i : {3, 4, 5}) {
    Entry* e = nullptr;
    ASSERT_EQ(store_->acquire(K(i), kChunk, 1, &e, ++now_), TieredStore::Acquired::kLeased);
    pins.push_back(e);
  }
  EXPECT_EQ(store_->reserve(K(9), kFp, kChunk, 1, ++now_).status().code(), Code::kNoSpace);
  store_->unpin(leased);
  for (Entry* e : pins) store_->unpin(e);
  EXPECT_EQ(store_->active_leases(), 0u);
}

TEST_F(TieredStoreTest, EvictionDemotesAndTheCopyStaysReadableUntilItLands) {
  build(2, true);
  put(1);
  put(2);
  // Full: making room starts a demotion of chunk 1; the reservation waits for it.
  auto r = store_->reserve(K(3), kFp, kChunk, 1, ++now_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInProgress);
  ASSERT_EQ(disk_->held(), 1u);
  uint32_t tier = 0;
  EXPECT_EQ(hits(1, &tier), 1u);
  EXPECT_EQ(tier, tier_index(TierId::kHost)) << "readable in the host tier while the write is in flight";
  bool room = false;
  auto ev = settle_until([&](auto&) { return disk_->in_flight() == 0; }, &room);
  EXPECT_TRUE(room);
  EXPECT_TRUE(ev.empty()) << "nobody waited for the demotion";
  EXPECT_EQ(hits(1, &tier), 1u);
  EXPECT_EQ(tier, tier_index(TierId::kDisk));
  EXPECT_EQ(store_->counters().demoted_chunks, 1u);
  EXPECT_EQ(store_->counters().dropped_chunks, 0u);
  auto r2 = store_->reserve(K(3), kFp, kChunk, 1, ++now_);
  ASSERT_TRUE(r2.ok()) << r2.status().what();
  store_->abort(r2->entry);
}

TEST_F(TieredStoreTest, LeaseOfALowerTierChunkPromotesIt) {
  build(2, true);
  put(1);
  put(2);
  ASSERT_EQ(store_->reserve(K(3), kFp, kChunk, 1, ++now_).status().code(), Code::kInProgress);
  settle_until([&](auto&) { return disk_->in_flight() == 0; });
  ASSERT_TRUE(store_->evict(K(2)));  // room for the promotion
  Entry* e = nullptr;
  ASSERT_EQ(store_->acquire(K(1), kChunk, 42, &e, ++now_), TieredStore::Acquired::kPromoting);
  EXPECT_EQ(store_->acquire(K(1), kChunk, 43, &e, ++now_), TieredStore::Acquired::kPromoting)
      << "a second reader waits for the same promotion";
  auto ev = settle_until([](auto& e) { return e.size() >= 2; });
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_TRUE(ev[0].status.ok());
  ASSERT_EQ(store_->acquire(K(1), kChunk, 42, &e, ++now_), TieredStore::Acquired::kLeased);
  EXPECT_TRUE(host_bytes_are(e, 1)) << "the promoted bytes are the stored ones";
  EXPECT_EQ(store_->counters().promoted_chunks, 1u);
  store_->unpin(e);
}

TEST_F(TieredStoreTest, DamagedCopiesAreDroppedAndFailedReadsKeepTheirCopy) {
  build(2, true);
  put(1);
  put(2);
  ASSERT_EQ(store_->reserve(K(3), kFp, kChunk, 1, ++now_).status().code(), Code::kInProgress);
  settle_until([&](auto&) { return disk_->in_flight() == 0; });
  ASSERT_TRUE(store_->evict(K(2)));
  // An I/O error: the lease misses this time, the copy stays for a later try.
  disk_->fail_next(Transfer::Direction::kRead, Status(Code::kIo, "EIO"));
  Entry* e = nullptr;
  ASSERT_EQ(store_->acquire(K(1), kChunk, 5, &e, ++now_), TieredStore::Acquired::kPromoting);
  auto ev = settle_until([](auto& e) { return !e.empty(); });
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].status.code(), Code::kIo);
  EXPECT_EQ(hits(1), 1u);
  EXPECT_EQ(store_->counters().transfer_errors, 1u);
  // Damaged bytes: the copy is dropped and never served.
  disk_->fail_next(Transfer::Direction::kRead, Status(Code::kCorrupt, "crc"));
  ASSERT_EQ(store_->acquire(K(1), kChunk, 6, &e, ++now_), TieredStore::Acquired::kPromoting);
  ev = settle_until([](auto& e) { return !e.empty(); });
  EXPECT_EQ(ev[0].status.code(), Code::kCorrupt);
  EXPECT_EQ(hits(1), 0u);
  EXPECT_EQ(store_->acquire(K(1), kChunk, 7, &e, ++now_), TieredStore::Acquired::kMiss);
  EXPECT_EQ(store_->counters().corrupt_chunks, 1u);
  EXPECT_EQ(store_->index().find(K(1)), nullptr);
}

TEST_F(TieredStoreTest, FailedDemotionKeepsTheChunkAndALeaseKeepsTheHostCopy) {
  options_.drop_on_failed_demotion = false;
  build(2, true);
  put(1);
  put(2);
  disk_->fail_next(Transfer::Direction::kWrite, Status(Code::kIo, "ENOSPC"));
  ASSERT_EQ(store_->reserve(K(3), kFp, kChunk, 1, ++now_).status().code(), Code::kInProgress);
  settle_until([&](auto&) { return disk_->in_flight() == 0; });
  uint32_t tier = 0;
  EXPECT_EQ(hits(1, &tier), 1u);
  EXPECT_EQ(tier, tier_index(TierId::kHost)) << "a failed demotion leaves the chunk where it was";
  EXPECT_EQ(store_->counters().transfer_errors, 1u);
  // Demote again, and lease the chunk while the write is in flight: it keeps its host copy.
  ASSERT_EQ(store_->reserve(K(3), kFp, kChunk, 1, ++now_).status().code(), Code::kInProgress);
  Entry* e = nullptr;
  const Entry* victim = nullptr;
  for (uint64_t i : {1, 2}) {
    const Entry* c = store_->index().find(K(i));
    if (c->moving_to(TierId::kDisk)) victim = c;
  }
  ASSERT_NE(victim, nullptr);
  const uint64_t victim_key = victim->key.lo;
  ASSERT_EQ(store_->acquire(K(victim_key), kChunk, 1, &e, ++now_), TieredStore::Acquired::kLeased);
  settle_until([&](auto&) { return disk_->in_flight() == 0; });
  EXPECT_TRUE(e->in_tier(TierId::kHost));
  EXPECT_TRUE(e->in_tier(TierId::kDisk));
  EXPECT_TRUE(host_bytes_are(e, victim_key));
  store_->unpin(e);
}

TEST_F(TieredStoreTest, FailedDemotionDropsTheCopyItMadeRoomFor) {
  build(2, true);  // drop_on_failed_demotion by default: a failing disk must not stall the node
  put(1);
  put(2);
  disk_->fail_next(Transfer::Direction::kWrite, Status(Code::kNoSpace, "ENOSPC"));
  ASSERT_EQ(store_->reserve(K(3), kFp, kChunk, 1, ++now_).status().code(), Code::kInProgress);
  bool room = false;
  settle_until([&](auto&) { return disk_->in_flight() == 0; }, &room);
  EXPECT_TRUE(room);
  EXPECT_EQ(store_->counters().failed_demotions, 1u);
  EXPECT_EQ(store_->counters().dropped_chunks, 1u);
  auto r = store_->reserve(K(3), kFp, kChunk, 1, ++now_);
  ASSERT_TRUE(r.ok()) << "the dropped copy made the room: " << r.status().what();
  store_->abort(r->entry);
}

TEST_F(TieredStoreTest, WriteThroughCommitsCompleteOnceTheCopyBelowLanded) {
  options_.write_through = true;
  build(4, true);
  auto r = store_->reserve(K(1), kFp, kChunk, 1, ++now_);
  ASSERT_TRUE(r.ok());
  std::memset(staged_.data(), 1, kChunk);
  ASSERT_TRUE(store_->commit(r->entry, staged_.data(), 77, 5).ok());
  // The host copy lands first; the event waits for the disk write.
  std::vector<StoreEvent> ev;
  bool room = false;
  for (int i = 0; i < 100000 && disk_->held() == 0; ++i) store_->poll(ev, &room);
  ASSERT_EQ(disk_->held(), 1u) << "the commit started a write to the disk tier";
  EXPECT_TRUE(ev.empty()) << "no COMMIT completion before the disk write";
  uint32_t tier = 0;
  EXPECT_EQ(hits(1, &tier), 1u) << "readable in the host tier meanwhile";
  ev = settle_until([](auto& e) { return !e.empty(); });
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].waiter, 77u);
  EXPECT_EQ(ev[0].cookie, 5u);
  EXPECT_TRUE(ev[0].status.ok());
  const Entry* e = store_->index().find(K(1));
  EXPECT_TRUE(e->in_tier(TierId::kHost) && e->in_tier(TierId::kDisk));
  EXPECT_EQ(store_->counters().written_through_chunks, 1u);
  // A failed disk write still completes the commit: the chunk is committed in the host tier.
  disk_->fail_next(Transfer::Direction::kWrite, Status(Code::kIo, "EIO"));
  r = store_->reserve(K(2), kFp, kChunk, 1, ++now_);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(store_->commit(r->entry, staged_.data(), 78, 6).ok());
  ev = settle_until([](auto& e) { return !e.empty(); });
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_TRUE(ev[0].status.ok());
  EXPECT_TRUE(store_->index().find(K(2))->in_tier(TierId::kHost));
  EXPECT_FALSE(store_->index().find(K(2))->in_tier(TierId::kDisk));
}

TEST_F(TieredStoreTest, AdoptedChunksAreServedByPromotion) {
  build(2, true);
  auto p = disk_->allocate(kChunk);
  ASSERT_TRUE(p.ok());
  std::memset(disk_->bytes_at(*p), 9, kChunk);
  ASSERT_TRUE(store_->adopt(K(9), kFp, kChunk, TierId::kDisk, *p, ++now_));
  auto dup = disk_->allocate(kChunk);
  ASSERT_TRUE(dup.ok());
  EXPECT_FALSE(store_->adopt(K(9), kFp, kChunk, TierId::kDisk, *dup, ++now_)) << "a key is adopted once";
  uint32_t tier = 0;
  EXPECT_EQ(hits(9, &tier), 1u);
  EXPECT_EQ(tier, tier_index(TierId::kDisk));
  Entry* e = nullptr;
  ASSERT_EQ(store_->acquire(K(9), kChunk, 1, &e, ++now_), TieredStore::Acquired::kPromoting);
  settle_until([](auto& ev) { return !ev.empty(); });
  ASSERT_EQ(store_->acquire(K(9), kChunk, 1, &e, ++now_), TieredStore::Acquired::kLeased);
  EXPECT_TRUE(host_bytes_are(e, 9));
  store_->unpin(e);
  EXPECT_EQ(store_->counters().recovered_chunks, 1u);
}

TEST_F(TieredStoreTest, DemoteAllAndWriteDownMoveChunksBelow) {
  build(4, true);
  put(1);
  put(2);
  put(3);
  Entry* leased = nullptr;
  ASSERT_EQ(store_->acquire(K(3), kChunk, 1, &leased, ++now_), TieredStore::Acquired::kLeased);
  // write_down: copies, keeping the host copy.
  EXPECT_EQ(store_->write_down(1), 1u);
  settle_until([&](auto&) { return disk_->in_flight() == 0; });
  EXPECT_EQ(store_->write_down(100), 2u);
  settle_until([&](auto&) { return disk_->in_flight() == 0; });
  EXPECT_EQ(store_->write_down(100), 0u) << "everything has a copy below";
  for (uint64_t i : {1, 2, 3}) EXPECT_TRUE(store_->index().find(K(i))->in_tier(TierId::kHost));
  // demote_all: chunks with a copy below just leave the host tier; leased ones stay.
  put(4);
  const auto [dropped, demoting] = store_->demote_all(55);
  EXPECT_EQ(dropped, 2u);
  EXPECT_EQ(demoting, 1u);
  auto ev = settle_until([](auto& e) { return !e.empty(); });
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].waiter, 55u);
  for (uint64_t i : {1, 2, 4}) {
    const Entry* e = store_->index().find(K(i));
    EXPECT_FALSE(e->in_tier(TierId::kHost)) << i;
    EXPECT_TRUE(e->in_tier(TierId::kDisk)) << i;
  }
  EXPECT_TRUE(leased->in_tier(TierId::kHost));
  store_->unpin(leased);
}

TEST_F(TieredStoreTest, AbortAndAdminEvictFreeEverything) {
  build(4, true);
  put(1);
  auto r = store_->reserve(K(2), kFp, kChunk, 1, ++now_);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(store_->open_reservations(), 1u);
  store_->abort(r->entry);
  EXPECT_EQ(store_->open_reservations(), 0u);
  EXPECT_EQ(store_->index().find(K(2)), nullptr);
  Entry* e = nullptr;
  ASSERT_EQ(store_->acquire(K(1), kChunk, 1, &e, ++now_), TieredStore::Acquired::kLeased);
  EXPECT_FALSE(store_->evict(K(1))) << "leased";
  store_->unpin(e);
  EXPECT_EQ(store_->evict_all(), 1u);
  EXPECT_EQ(store_->index().size(), 0u);
  EXPECT_EQ(host_->used_bytes(), 0u);
}

}  // namespace
}  // namespace kdn::sidecar
