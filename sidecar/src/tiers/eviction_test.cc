// The eviction policies of eviction.h over hand-built entries: EntryList's links, LRU and
// S3-FIFO victim order, per-size-class queues, victim_any, entries that are not evictable
// (leased host copies, transfers in flight, copies already leaving, reservations) skipped
// and re-queued, S3-FIFO's small/main/ghost queues, and parse_eviction_kind.
#include "tiers/eviction.h"

#include <gtest/gtest.h>

#include <deque>
#include <vector>

namespace kdn::sidecar {
namespace {

// Entries with stable addresses, each a committed copy in `tier_` of a given size class.
class Entries {
 public:
  explicit Entries(TierId tier) : tier_(tier) {}
  Entry* make(uint64_t id, uint16_t cls = 0, uint64_t last_access_ns = 0) {
    Entry& e = store_.emplace_back();
    e.key = kdn_key{id, 0};
    e.state = EntryState::kCommitted;
    e.resident = uint8_t(1u << tier_index(tier_));
    e.placement[tier_index(tier_)].slot_class = cls;
    e.placement[tier_index(tier_)].bytes = 4096;
    e.last_access_ns = last_access_ns;
    return &e;
  }

 private:
  TierId tier_;
  std::deque<Entry> store_;
};

uint8_t queue_of(const Entry* e, TierId t) { return e->links[tier_index(t)].queue; }
uint8_t freq_of(const Entry* e, TierId t) { return e->links[tier_index(t)].freq; }

// Takes victims of class `cls` one by one (as the store does: victim, on_evict, then
// on_remove) and returns their ids in order; stops at the first null.
std::vector<uint64_t> drain(EvictionPolicy& p, uint16_t cls = 0) {
  std::vector<uint64_t> ids;
  while (Entry* v = p.victim(cls)) {
    ids.push_back(v->key.lo);
    p.on_evict(v);
    p.on_remove(v);
  }
  return ids;
}

// ---- EntryList

TEST(EntryList, PushFrontIsNewestBackIsOldest) {
  Entries es(TierId::kHost);
  Entry* a = es.make(1);
  Entry* b = es.make(2);
  Entry* c = es.make(3);
  EntryList l(tier_index(TierId::kHost));
  EXPECT_EQ(l.back(), nullptr);
  l.push_front(a, 1);
  l.push_front(b, 1);
  l.push_front(c, 2);
  EXPECT_EQ(l.size(), 3u);
  EXPECT_EQ(l.back(), a);
  EXPECT_EQ(queue_of(c, TierId::kHost), 2);
  l.remove(b);  // the middle: a and c are linked to each other now
  EXPECT_EQ(queue_of(b, TierId::kHost), 0);
  EXPECT_EQ(l.back(), a);
  l.remove(a);
  EXPECT_EQ(l.back(), c);
  l.remove(c);
  EXPECT_EQ(l.back(), nullptr);
  EXPECT_EQ(l.size(), 0u);
  l.push_front(b, 1);  // a list emptied to nothing takes entries again
  EXPECT_EQ(l.back(), b);
}

TEST(EntryList, UsesOnlyItsOwnTiersLinks) {
  Entries es(TierId::kDisk);
  Entry* a = es.make(1);
  Entry* b = es.make(2);
  EntryList disk(tier_index(TierId::kDisk));
  EntryList host(tier_index(TierId::kHost));
  disk.push_front(a, 1);
  disk.push_front(b, 1);
  host.push_front(b, 2);  // the same entry queued in a second tier
  EXPECT_EQ(queue_of(b, TierId::kDisk), 1);
  EXPECT_EQ(queue_of(b, TierId::kHost), 2);
  host.remove(b);
  EXPECT_EQ(queue_of(b, TierId::kDisk), 1);
  EXPECT_EQ(disk.size(), 2u);
  EXPECT_EQ(disk.back(), a);
  disk.remove(a);
  EXPECT_EQ(disk.back(), b);
}

// ---- LRU

TEST(LruPolicy, OldestGoesFirstAndVictimDoesNotRemove) {
  auto p = make_eviction_policy(EvictionKind::kLru, TierId::kHost);
  EXPECT_EQ(p->tier(), TierId::kHost);
  EXPECT_EQ(p->victim(0), nullptr);
  Entries es(TierId::kHost);
  for (uint64_t id = 1; id <= 4; ++id) p->on_insert(es.make(id));
  EXPECT_EQ(p->victim(0)->key.lo, 1u);
  EXPECT_EQ(p->victim(0)->key.lo, 1u);  // still there until on_remove
  EXPECT_EQ(drain(*p), (std::vector<uint64_t>{1, 2, 3, 4}));
}

TEST(LruPolicy, AccessMakesAnEntryTheNewest) {
  auto p = make_eviction_policy(EvictionKind::kLru, TierId::kHost);
  Entries es(TierId::kHost);
  Entry* a = es.make(1);
  Entry* b = es.make(2);
  Entry* c = es.make(3);
  p->on_insert(a);
  p->on_insert(b);
  p->on_insert(c);
  p->on_access(a);
  p->on_access(b);
  EXPECT_EQ(drain(*p), (std::vector<uint64_t>{3, 1, 2}));
}

TEST(LruPolicy, AccessOrRemoveOfAnEntryNotQueuedIsIgnored) {
  auto p = make_eviction_policy(EvictionKind::kLru, TierId::kHost);
  Entries es(TierId::kHost);
  Entry* stray = es.make(9);
  p->on_access(stray);  // never inserted: must not join a queue
  p->on_remove(stray);
  EXPECT_EQ(p->victim(0), nullptr);
  Entry* a = es.make(1);
  p->on_insert(a);
  p->on_remove(a);
  p->on_remove(a);  // twice: the second is a no-op
  EXPECT_EQ(p->victim(0), nullptr);
}

TEST(LruPolicy, EachSizeClassHasItsOwnQueue) {
  auto p = make_eviction_policy(EvictionKind::kLru, TierId::kDisk);
  Entries es(TierId::kDisk);
  p->on_insert(es.make(1, 0));
  p->on_insert(es.make(2, 2));
  p->on_insert(es.make(3, 0));
  p->on_insert(es.make(4, 2));
  EXPECT_EQ(p->victim(1), nullptr);  // a class between two used ones
  EXPECT_EQ(p->victim(7), nullptr);  // a class never seen
  EXPECT_EQ(drain(*p, 2), (std::vector<uint64_t>{2, 4}));
  EXPECT_EQ(drain(*p, 0), (std::vector<uint64_t>{1, 3}));
}

TEST(LruPolicy, VictimAnyTakesTheLeastRecentlyUsedClassTail) {
  auto p = make_eviction_policy(EvictionKind::kLru, TierId::kHost);
  EXPECT_EQ(p->victim_any(), nullptr);
  Entries es(TierId::kHost);
  p->on_insert(es.make(1, 0, 300));
  p->on_insert(es.make(2, 1, 100));
  p->on_insert(es.make(3, 2, 200));
  p->on_insert(es.make(4, 1, 50));  // newer in its queue: class 1's tail is still id 2
  EXPECT_EQ(p->victim_any()->key.lo, 2u);
  p->on_remove(p->victim_any());
  EXPECT_EQ(p->victim_any()->key.lo, 4u);  // class 1's new tail, the oldest of all
  p->on_remove(p->victim_any());
  EXPECT_EQ(p->victim_any()->key.lo, 3u);
}

TEST(LruPolicy, VictimAnySkipsAClassWhoseEntriesArePinned) {
  auto p = make_eviction_policy(EvictionKind::kLru, TierId::kHost);
  Entries es(TierId::kHost);
  Entry* old = es.make(1, 0, 10);
  old->leases = 1;
  p->on_insert(old);
  p->on_insert(es.make(2, 1, 500));
  EXPECT_EQ(p->victim_any()->key.lo, 2u);
}

// Each way an entry is not evictable_from(tier): the entry at the tail is skipped, the next
// one is the victim, and the skipped one is re-queued as the newest.
TEST(LruPolicy, EntriesNotEvictableAreSkippedAndRequeued) {
  struct Case {
    const char* what;
    void (*pin)(Entry*);
    void (*unpin)(Entry*);
  };
  const Case cases[] = {
      {"leased host copy", [](Entry* e) { e->leases = 1; }, [](Entry* e) { e->leases = 0; }},
      {"transfer in flight", [](Entry* e) { e->io = 2; }, [](Entry* e) { e->io = 0; }},
      {"already leaving", [](Entry* e) { e->evicting = 1u << tier_index(TierId::kHost); },
       [](Entry* e) { e->evicting = 0; }},
      {"reserved", [](Entry* e) { e->state = EntryState::kReserved; },
       [](Entry* e) { e->state = EntryState::kCommitted; }},
      {"being written", [](Entry* e) { e->state = EntryState::kWriting; },
       [](Entry* e) { e->state = EntryState::kCommitted; }},
      {"no copy here", [](Entry* e) { e->resident = 0; },
       [](Entry* e) { e->resident = 1u << tier_index(TierId::kHost); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    auto p = make_eviction_policy(EvictionKind::kLru, TierId::kHost);
    Entries es(TierId::kHost);
    Entry* a = es.make(1);
    p->on_insert(a);
    p->on_insert(es.make(2));
    p->on_insert(es.make(3));
    c.pin(a);
    Entry* v = p->victim(0);
    ASSERT_NE(v, nullptr);
    EXPECT_EQ(v->key.lo, 2u);
    c.unpin(a);
    // a went to the front when it was skipped: 3 is older than it now.
    EXPECT_EQ(drain(*p), (std::vector<uint64_t>{2, 3, 1}));
  }
}

TEST(LruPolicy, ALeaseDoesNotPinACopyOutsideTheHostTier) {
  auto p = make_eviction_policy(EvictionKind::kLru, TierId::kDisk);
  Entries es(TierId::kDisk);
  Entry* a = es.make(1);
  a->leases = 3;  // pins the host copy only
  p->on_insert(a);
  p->on_insert(es.make(2));
  EXPECT_EQ(p->victim(0), a);
}

TEST(LruPolicy, AllPinnedGivesNoVictimAndKeepsTheQueue) {
  auto p = make_eviction_policy(EvictionKind::kLru, TierId::kHost);
  Entries es(TierId::kHost);
  std::vector<Entry*> all;
  for (uint64_t id = 1; id <= 5; ++id) {
    all.push_back(es.make(id));
    all.back()->io = 1;
    p->on_insert(all.back());
  }
  EXPECT_EQ(p->victim(0), nullptr);
  EXPECT_EQ(p->victim_any(), nullptr);
  for (Entry* e : all) e->io = 0;
  // Every entry was skipped once, in order, so the order is the original one again.
  EXPECT_EQ(drain(*p), (std::vector<uint64_t>{1, 2, 3, 4, 5}));
}

// ---- S3-FIFO

TEST(S3FifoPolicy, NewEntriesQueueInSmallAndLeaveInFifoOrder) {
  auto p = make_eviction_policy(EvictionKind::kS3Fifo, TierId::kHost);
  Entries es(TierId::kHost);
  std::vector<Entry*> all;
  for (uint64_t id = 1; id <= 4; ++id) {
    all.push_back(es.make(id));
    p->on_insert(all.back());
  }
  for (Entry* e : all) EXPECT_EQ(queue_of(e, TierId::kHost), 1);  // small
  EXPECT_EQ(p->victim(0), all[0]);
  EXPECT_EQ(p->victim(0), all[0]);  // does not remove
  EXPECT_EQ(drain(*p), (std::vector<uint64_t>{1, 2, 3, 4}));
}

TEST(S3FifoPolicy, AnEntryAccessedInSmallMovesToMain) {
  auto p = make_eviction_policy(EvictionKind::kS3Fifo, TierId::kHost);
  Entries es(TierId::kHost);
  Entry* a = es.make(1);
  Entry* b = es.make(2);
  p->on_insert(a);
  p->on_insert(b);
  p->on_access(a);
  EXPECT_EQ(freq_of(a, TierId::kHost), 1);
  EXPECT_EQ(queue_of(a, TierId::kHost), 1);  // access alone moves nothing (lazy promotion)
  EXPECT_EQ(p->victim(0), b);
  EXPECT_EQ(queue_of(a, TierId::kHost), 2);  // the scan promoted it, its count spent
  EXPECT_EQ(freq_of(a, TierId::kHost), 0);
}

TEST(S3FifoPolicy, FrequencyIsATwoBitCounter) {
  auto p = make_eviction_policy(EvictionKind::kS3Fifo, TierId::kHost);
  Entries es(TierId::kHost);
  Entry* a = es.make(1);
  p->on_insert(a);
  for (int i = 0; i < 10; ++i) p->on_access(a);
  EXPECT_EQ(freq_of(a, TierId::kHost), 3);
}

TEST(S3FifoPolicy, AnEvictedKeyThatReturnsGoesStraightToMain) {
  auto p = make_eviction_policy(EvictionKind::kS3Fifo, TierId::kHost);
  Entries es(TierId::kHost);
  Entry* a = es.make(1);
  p->on_insert(a);
  ASSERT_EQ(p->victim(0), a);
  p->on_evict(a);
  p->on_remove(a);
  Entry* again = es.make(1);  // the same key stored anew
  p->on_insert(again);
  EXPECT_EQ(queue_of(again, TierId::kHost), 2);
  Entry* fresh = es.make(2);
  p->on_insert(fresh);
  EXPECT_EQ(queue_of(fresh, TierId::kHost), 1);
  // The ghost is consumed by the return: evicted from main, the key is not remembered.
  p->on_remove(fresh);
  ASSERT_EQ(p->victim(0), again);
  p->on_evict(again);
  p->on_remove(again);
  Entry* third = es.make(1);
  p->on_insert(third);
  EXPECT_EQ(queue_of(third, TierId::kHost), 1);
}

TEST(S3FifoPolicy, GhostsArePerSizeClass) {
  auto p = make_eviction_policy(EvictionKind::kS3Fifo, TierId::kDisk);
  Entries es(TierId::kDisk);
  Entry* a = es.make(1, 0);
  p->on_insert(a);
  ASSERT_EQ(p->victim(0), a);
  p->on_evict(a);
  p->on_remove(a);
  Entry* other_class = es.make(1, 3);
  p->on_insert(other_class);
  EXPECT_EQ(queue_of(other_class, TierId::kDisk), 1);
  EXPECT_EQ(p->victim(1), nullptr);
  EXPECT_EQ(p->victim(3), other_class);
}

// victim_any() asks every class for its victim and evicts one: only that one is remembered. A
// class's tail that was a candidate but not chosen, later deleted and stored again, starts in
// small like any new key.
TEST(S3FifoPolicy, OnlyTheEvictedVictimIsRemembered) {
  auto p = make_eviction_policy(EvictionKind::kS3Fifo, TierId::kHost);
  Entries es(TierId::kHost);
  Entry* a = es.make(1, 0, 200);
  Entry* b = es.make(2, 1, 100);
  p->on_insert(a);
  p->on_insert(b);
  Entry* v = p->victim_any();
  ASSERT_EQ(v, b);  // the least recently used tail
  p->on_evict(v);
  p->on_remove(v);
  p->on_remove(a);  // deleted, not evicted
  Entry* a_again = es.make(1, 0);
  p->on_insert(a_again);
  EXPECT_EQ(queue_of(a_again, TierId::kHost), 1);
  Entry* b_again = es.make(2, 1);
  p->on_insert(b_again);
  EXPECT_EQ(queue_of(b_again, TierId::kHost), 2);
}

TEST(S3FifoPolicy, TheGhostSetIsBounded) {
  // The ghost holds at most the class's population plus 16 keys; older ones are forgotten.
  auto p = make_eviction_policy(EvictionKind::kS3Fifo, TierId::kHost);
  Entries es(TierId::kHost);
  for (uint64_t id = 1; id <= 40; ++id) {
    Entry* e = es.make(id);
    p->on_insert(e);
    ASSERT_EQ(p->victim(0), e);
    p->on_evict(e);
    p->on_remove(e);
  }
  Entry* oldest = es.make(1);
  p->on_insert(oldest);
  EXPECT_EQ(queue_of(oldest, TierId::kHost), 1);
  Entry* newest = es.make(40);
  p->on_insert(newest);
  EXPECT_EQ(queue_of(newest, TierId::kHost), 2);
}

// Ten entries accessed (promoted to main) and one newer entry never accessed (in small):
// small is under its 10% share, so main's tail goes first. With LRU the new entry, the least
// recently used, goes.
TEST(S3FifoPolicy, SmallIsKeptNearATenthAndMainGivesTheVictimBelowIt) {
  Entries es(TierId::kHost);
  for (EvictionKind kind : {EvictionKind::kS3Fifo, EvictionKind::kLru}) {
    auto p = make_eviction_policy(kind, TierId::kHost);
    std::vector<Entry*> hot;
    for (uint64_t id = 1; id <= 10; ++id) {
      hot.push_back(es.make(id));
      p->on_insert(hot.back());
    }
    Entry* y = es.make(99);
    p->on_insert(y);
    for (Entry* e : hot) p->on_access(e);
    Entry* v = p->victim(0);
    ASSERT_NE(v, nullptr);
    if (kind == EvictionKind::kS3Fifo) {
      EXPECT_EQ(v, hot[0]);
      EXPECT_EQ(queue_of(v, TierId::kHost), 2);
      EXPECT_EQ(queue_of(y, TierId::kHost), 1);
    } else {
      EXPECT_EQ(v, y);
    }
  }
}

TEST(S3FifoPolicy, AMainEntryAccessedSinceGetsAnotherRound) {
  auto p = make_eviction_policy(EvictionKind::kS3Fifo, TierId::kHost);
  Entries es(TierId::kHost);
  std::vector<Entry*> m;
  for (uint64_t id = 1; id <= 3; ++id) {
    m.push_back(es.make(id));
    p->on_insert(m.back());
    p->on_access(m.back());
  }
  // The first scan promotes all three (small is then empty) and returns main's tail.
  ASSERT_EQ(p->victim(0), m[0]);
  for (Entry* e : m) EXPECT_EQ(queue_of(e, TierId::kHost), 2);
  p->on_access(m[0]);
  p->on_access(m[0]);
  EXPECT_EQ(p->victim(0), m[1]);
  EXPECT_EQ(freq_of(m[0], TierId::kHost), 1);  // one round spent, one left
  p->on_remove(m[1]);
  EXPECT_EQ(p->victim(0), m[2]);
  p->on_remove(m[2]);
  EXPECT_EQ(p->victim(0), m[0]);  // the last one: its remaining round is spent in this scan
}

// Entries accessed before a scan of one-hit keys sit in main; the scan's keys pass through
// small and leave first. LRU loses the hot entries to the same scan.
TEST(S3FifoPolicy, AScanOfOneHitKeysEvictsItselfFirst) {
  for (EvictionKind kind : {EvictionKind::kS3Fifo, EvictionKind::kLru}) {
    auto p = make_eviction_policy(kind, TierId::kHost);
    Entries es(TierId::kHost);
    for (uint64_t id = 1; id <= 4; ++id) {
      Entry* h = es.make(id);
      p->on_insert(h);
      p->on_access(h);
    }
    if (kind == EvictionKind::kS3Fifo) {
      ASSERT_NE(p->victim(0), nullptr);  // promotes the four to main
    }
    for (uint64_t id = 100; id < 120; ++id) p->on_insert(es.make(id));
    std::vector<uint64_t> first20;
    for (int i = 0; i < 20; ++i) {
      Entry* v = p->victim(0);
      ASSERT_NE(v, nullptr);
      first20.push_back(v->key.lo);
      p->on_remove(v);
    }
    int hot_lost = 0;
    for (uint64_t id : first20) hot_lost += id < 100;
    if (kind == EvictionKind::kS3Fifo) {
      EXPECT_EQ(hot_lost, 0);
      EXPECT_EQ(drain(*p), (std::vector<uint64_t>{1, 2, 3, 4}));
    } else {
      EXPECT_EQ(hot_lost, 4);
    }
  }
}

TEST(S3FifoPolicy, APinnedEntryInSmallStaysInSmall) {
  auto p = make_eviction_policy(EvictionKind::kS3Fifo, TierId::kHost);
  Entries es(TierId::kHost);
  Entry* a = es.make(1);
  Entry* b = es.make(2);
  p->on_insert(a);
  p->on_insert(b);
  a->leases = 1;
  p->on_access(a);  // accessed, but pinned: not promoted while pinned
  EXPECT_EQ(p->victim(0), b);
  EXPECT_EQ(queue_of(a, TierId::kHost), 1);
  EXPECT_EQ(freq_of(a, TierId::kHost), 0);  // the skip spent the access
  p->on_remove(b);
  a->leases = 0;
  EXPECT_EQ(p->victim(0), a);
}

TEST(S3FifoPolicy, APinnedEntryInMainIsSkippedAndStaysInMain) {
  auto p = make_eviction_policy(EvictionKind::kS3Fifo, TierId::kHost);
  Entries es(TierId::kHost);
  Entry* a = es.make(1);
  Entry* b = es.make(2);
  p->on_insert(a);
  p->on_insert(b);
  p->on_access(a);
  p->on_access(b);
  ASSERT_EQ(p->victim(0), a);  // both promoted; a is main's tail
  a->io = 1;
  EXPECT_EQ(p->victim(0), b);
  EXPECT_EQ(queue_of(a, TierId::kHost), 2);
  p->on_remove(b);
  EXPECT_EQ(p->victim(0), nullptr);  // the only entry is pinned: the scan is bounded
  a->io = 0;
  EXPECT_EQ(p->victim(0), a);
}

TEST(S3FifoPolicy, AllPinnedGivesNoVictim) {
  auto p = make_eviction_policy(EvictionKind::kS3Fifo, TierId::kHost);
  Entries es(TierId::kHost);
  for (uint64_t id = 1; id <= 6; ++id) {
    Entry* e = es.make(id);
    e->state = EntryState::kReserved;
    p->on_insert(e);
    p->on_access(e);
  }
  EXPECT_EQ(p->victim(0), nullptr);
  EXPECT_EQ(p->victim_any(), nullptr);
}

TEST(S3FifoPolicy, RemovalFromEitherQueue) {
  auto p = make_eviction_policy(EvictionKind::kS3Fifo, TierId::kHost);
  Entries es(TierId::kHost);
  Entry* in_main = es.make(1);
  Entry* in_small = es.make(2);
  Entry* other = es.make(3);
  p->on_insert(in_main);
  p->on_access(in_main);
  p->on_insert(in_small);
  p->on_insert(other);
  ASSERT_EQ(p->victim(0), in_small);  // promotes in_main on the way
  ASSERT_EQ(queue_of(in_main, TierId::kHost), 2);
  p->on_remove(in_main);
  p->on_remove(in_small);
  EXPECT_EQ(queue_of(in_main, TierId::kHost), 0);
  EXPECT_EQ(queue_of(in_small, TierId::kHost), 0);
  EXPECT_EQ(drain(*p), (std::vector<uint64_t>{3}));
}

// ---- parsing

TEST(EvictionKind, ParsesTheDocumentedNamesOnly) {
  EvictionKind k = EvictionKind::kS3Fifo;
  ASSERT_TRUE(parse_eviction_kind("lru", &k));
  EXPECT_EQ(k, EvictionKind::kLru);
  ASSERT_TRUE(parse_eviction_kind("s3fifo", &k));
  EXPECT_EQ(k, EvictionKind::kS3Fifo);
  k = EvictionKind::kLru;
  ASSERT_TRUE(parse_eviction_kind("s3-fifo", &k));
  EXPECT_EQ(k, EvictionKind::kS3Fifo);
  for (const char* bad : {"", "LRU", "Lru", "s3_fifo", "fifo", "lru ", " lru", "s3fifo\n", "arc"}) {
    k = EvictionKind::kLru;
    EXPECT_FALSE(parse_eviction_kind(bad, &k)) << '"' << bad << '"';
    EXPECT_EQ(k, EvictionKind::kLru) << "a failed parse leaves the output alone";
  }
}

}  // namespace
}  // namespace kdn::sidecar
