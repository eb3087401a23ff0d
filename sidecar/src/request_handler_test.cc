// The request handler against a real namespace (host arena tier, sealed memfd) and a session's
// real shared memory, without the daemon's loop: each test plays the loop itself, so it can
// stop a request half-way, deliver completions late, or end the session in the middle.
#include "request_handler.h"
#include "tiers/fault_tier.h"
#include "gpu/gpu_service.h"

#include <kdn/common/clock.h>
#include <kdn/common/model_presets.h>
#include <kdn/ipc/ops.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

// Allocation failure through a seam: while `g_fail_after` is >= 0, the allocation that brings
// it below zero throws std::bad_alloc (only this test binary replaces operator new).
namespace kdn::sidecar {
thread_local long g_fail_after = -1;

void* allocate_or_fail(std::size_t n) {
  if (g_fail_after >= 0 && g_fail_after-- == 0) throw std::bad_alloc();
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
}  // namespace kdn::sidecar

void* operator new(std::size_t n) { return kdn::sidecar::allocate_or_fail(n); }
void* operator new[](std::size_t n) { return kdn::sidecar::allocate_or_fail(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace kdn::sidecar {
namespace {

using ipc::Opcode;

constexpr uint64_t kMiB = 1 << 20;

// A small model: 2 layers x 2 heads x 64 dims x 16 tokens, f16: 16 KiB chunks.
kdn_model_desc small_model(uint32_t chunk_tokens = 16, uint32_t head_dim = 64) {
  return shaped_desc(2, 2, head_dim, chunk_tokens, "test-model");
}

kdn_key K(uint64_t i) { return kdn_key{i * 0x9E3779B97F4A7C15ull, i}; }

class HandlerTest : public ::testing::Test {
 protected:
  void SetUp() override { config_.fill_defaults(); }

  void build(uint64_t arena_bytes = 64 * kMiB, bool with_disk = false) {
    ipc::SegmentOptions so;
    so.seal_writes = true;
    auto seg = ipc::SharedSegment::create("test-arena", arena_bytes, so);
    ASSERT_TRUE(seg.ok());
    HostArenaOptions ho;
    ho.slab_bytes = 4 * kMiB;
    auto host = HostArenaTier::create(std::move(*seg), ho);
    ASSERT_TRUE(host.ok());
    ns_.name = "test";
    ns_.region_id = 1;
    ns_.region_generation = 1;
    ns_.host = std::move(*host);
    std::array<Tier*, kTierCount> tiers{};
    std::array<TierRules, kTierCount> rules{};
    tiers[tier_index(TierId::kHost)] = ns_.host.get();
    rules[tier_index(TierId::kHost)] =
        TierRules{with_disk ? EvictAction::kDemote : EvictAction::kDrop, EvictionKind::kLru};
    if (with_disk) {
      auto disk = FaultTier::create(TierId::kDisk, 256 * kMiB, 4 * kMiB);
      ASSERT_TRUE(disk.ok());
      disk_ = std::move(*disk);
      tiers[tier_index(TierId::kDisk)] = disk_.get();
    }
    ns_.store = std::make_unique<TieredStore>(TierPolicy(tiers, rules));
    handler_ = std::make_unique<RequestHandler>(models_, counters_, config_);
  }

  std::unique_ptr<Session> open_session(uint64_t staging = 16 * kMiB, uint32_t payload = 8 * kMiB) {
    auto s = std::make_unique<Session>();
    s->id = next_session_++;
    auto layout = ipc::SessionLayout::compute(64, payload);
    EXPECT_TRUE(layout.ok());
    auto shm = ipc::DaemonSession::create(*layout, s->id);
    EXPECT_TRUE(shm.ok());
    s->shm = std::move(*shm);
    if (staging) {
      auto st = StagingArea::create(staging);
      EXPECT_TRUE(st.ok());
      s->staging = std::move(*st);
      s->staging_region = 2;
    }
    s->ns = &ns_;
    ++ns_.sessions;
    return s;
  }

  std::byte* payload(Session& s) { return s.shm.segment().data() + s.shm.layout().payload_offset; }

  // Plays the loop: steps the op (slices of `slice_ns`), delivering transfer completions,
  // until it is done. Returns how many steps it took.
  int run(Op& op, uint64_t slice_ns = 200'000) {
    int steps = 0;
    for (;;) {
      ++steps;
      const Step st = handler_->step(op, now_ns() + slice_ns);
      if (st == Step::kDone) return steps;
      if (st == Step::kWait) deliver(op);
      if (steps > 1'000'000) {
        ADD_FAILURE() << "request never finished";
        return steps;
      }
    }
  }

  // Completes transfers until the op waits for nothing (its copies landed, or room came).
  void deliver(Op& op) {
    std::vector<StoreEvent> events;
    for (int i = 0; i < 200000 && (op.waiting > 0 || op.wants_room); ++i) {
      if (disk_) disk_->complete_all();
      events.clear();
      bool room = false;
      ns_.store->poll(events, &room);
      for (const StoreEvent& ev : events)
        if (ev.waiter == op.token) handler_->on_event(op, ev);
      if (room) op.wants_room = false;
    }
  }

  Op make(Session& s, Opcode code, uint32_t model_id = 0) {
    Op op;
    op.token = next_token_++;
    op.session = &s;
    op.sqe.opcode = uint8_t(code);
    op.sqe.model_id = model_id;
    op.sqe.user_data = op.token;
    return op;
  }

  uint32_t register_model(Session& s, const kdn_model_desc& d = small_model()) {
    const ipc::ModelRecord rec = ipc::to_wire(d);
    std::memcpy(payload(s), &rec, sizeof rec);
    Op op = make(s, Opcode::kRegisterModel);
    op.sqe.in_len = sizeof rec;
    run(op);
    EXPECT_EQ(op.cqe.status, KDN_OK);
    auto r = ipc::RegisterModelOp::result(op.cqe);
    EXPECT_TRUE(r.ok());
    return r.ok() ? r->model_id : 0;
  }

  // Keys at payload offset 0, output records at `out_off`.
  Op keyed(Session& s, Opcode code, uint32_t model, uint64_t first, uint32_t n, uint32_t out_record = 0,
           uint32_t out_off = 4 * kMiB) {
    for (uint32_t i = 0; i < n; ++i) {
      const kdn_key k = K(first + i);
      std::memcpy(payload(s) + i * sizeof k, &k, sizeof k);
    }
    Op op = make(s, code, model);
    op.sqe.in_len = n * sizeof(kdn_key);
    if (out_record) {
      op.sqe.out_off = out_off;
      op.sqe.out_len = n * out_record;
    }
    return op;
  }

  Op ids_op(Session& s, Opcode code, const std::vector<uint64_t>& ids) {
    std::memcpy(payload(s), ids.data(), ids.size() * 8);
    Op op = make(s, code);
    op.sqe.in_len = uint32_t(ids.size() * 8);
    return op;
  }

  template <class T>
  std::vector<T> records(Session& s, const Op& op, uint32_t n) {
    std::vector<T> out(n);
    std::memcpy(out.data(), payload(s) + op.sqe.out_off, n * sizeof(T));
    return out;
  }

  // RESERVE + write (pattern = key index) + COMMIT of keys [first, first + n).
  void store(Session& s, uint32_t model, uint64_t first, uint32_t n, uint64_t chunk_bytes) {
    Op r = keyed(s, Opcode::kReserve, model, first, n, sizeof(ipc::ReserveRecord));
    run(r);
    ASSERT_EQ(r.cqe.status, KDN_OK);
    auto recs = records<ipc::ReserveRecord>(s, r, n);
    std::vector<uint64_t> ids;
    for (uint32_t i = 0; i < n; ++i) {
      if (recs[i].state != uint32_t(ipc::ReserveState::kReserved)) continue;
      ASSERT_EQ(recs[i].slot.region, s.staging_region);
      std::memset(const_cast<std::byte*>(s.staging.at(recs[i].slot.offset)), int((first + i) & 0xFF), chunk_bytes);
      ids.push_back(recs[i].reservation_id);
    }
    Op c = ids_op(s, Opcode::kCommit, ids);
    run(c);
    ASSERT_EQ(c.cqe.status, KDN_OK);
    ASSERT_EQ(c.cqe.res[0], ids.size());
  }

  // Runs the request `make()` builds with its n-th allocation failing, for n = 0, 1, ... until
  // it succeeds whole; after every failure `holds_nothing` must hold. Returns whether there was
  // at least one failure and then a success.
  template <class Make, class Check>
  bool fail_each_allocation(Make make, Check holds_nothing) {
    bool failed_once = false;
    for (long n = 0; n < 2000; ++n) {
      Op op = make();
      g_fail_after = n;
      const Step st = handler_->step(op, now_ns() + 10'000'000'000);
      g_fail_after = -1;
      if (st != Step::kDone) return false;
      if (op.cqe.status == KDN_OK) return failed_once;
      if (op.cqe.status != KDN_ERR_NO_MEMORY) return false;
      failed_once = true;
      if (!holds_nothing()) {
        ADD_FAILURE() << "a request whose allocation " << n << " failed still holds something";
        return false;
      }
    }
    return false;
  }

  Config config_;
  ModelTable models_{4096};
  DaemonCounters counters_;
  Namespace ns_;
  std::unique_ptr<FaultTier> disk_;
  std::unique_ptr<RequestHandler> handler_;
  uint64_t next_session_ = 1, next_token_ = 1;
};

TEST_F(HandlerTest, StoreLeaseRoundTripThroughStaging) {
  build();
  auto s = open_session();
  const uint32_t m = register_model(*s);
  const uint64_t chunk = ModelInfo::from_desc(small_model())->chunk_bytes;
  store(*s, m, 0, 8, chunk);
  Op look = keyed(*s, Opcode::kLookup, m, 0, 10);
  run(look);
  auto hits = ipc::LookupOp::result(look.cqe, 10);
  ASSERT_TRUE(hits.ok());
  EXPECT_EQ(hits->hit_chunks, 8u);
  EXPECT_EQ(hits->tier_chunks[tier_index(TierId::kHost)], 8u);

  // Another session leases them: arena references, with the bytes the writer staged.
  auto reader = open_session(0);
  const uint32_t m2 = register_model(*reader);
  EXPECT_EQ(m2, m) << "equal descriptors share one model id";
  Op lease = keyed(*reader, Opcode::kLease, m2, 0, 10, sizeof(ipc::LeaseRecord));
  run(lease);
  ASSERT_EQ(lease.cqe.status, KDN_OK);
  EXPECT_EQ(lease.cqe.res[0], 8u);
  auto recs = records<ipc::LeaseRecord>(*reader, lease, 10);
  for (uint32_t i = 0; i < 8; ++i) {
    EXPECT_EQ(recs[i].slot.region, ns_.region_id);
    EXPECT_EQ(recs[i].slot.generation, ns_.region_generation);
    const std::byte* p = ns_.host->arena().data() + recs[i].slot.offset;
    EXPECT_EQ(p[0], std::byte(i));
    EXPECT_EQ(p[chunk - 1], std::byte(i));
  }
  ipc::LeaseRecord zero{};
  EXPECT_EQ(std::memcmp(&recs[8], &zero, sizeof zero), 0) << "records past the prefix are zero";
  EXPECT_EQ(std::memcmp(&recs[9], &zero, sizeof zero), 0);
  // Leasing again gives the same ids; each needs its own release.
  Op again = keyed(*reader, Opcode::kLease, m2, 0, 8, sizeof(ipc::LeaseRecord));
  run(again);
  auto recs2 = records<ipc::LeaseRecord>(*reader, again, 8);
  EXPECT_EQ(recs2[3].lease_id, recs[3].lease_id);
  EXPECT_EQ(ns_.store->active_leases(), 8u) << "one pin per session and chunk";
  std::vector<uint64_t> ids;
  for (uint32_t i = 0; i < 8; ++i) ids.push_back(recs[i].lease_id);
  Op rel = ids_op(*reader, Opcode::kRelease, ids);
  run(rel);
  EXPECT_EQ(rel.cqe.status, KDN_OK);
  EXPECT_EQ(ns_.store->active_leases(), 8u) << "still leased once more";
  Op rel2 = ids_op(*reader, Opcode::kRelease, ids);
  run(rel2);
  EXPECT_EQ(ns_.store->active_leases(), 0u);
  Op rel3 = ids_op(*reader, Opcode::kRelease, {ids[0]});
  run(rel3);
  EXPECT_EQ(rel3.cqe.status, KDN_ERR_NOT_FOUND);
}

TEST_F(HandlerTest, LimitsRefuseWholeRequestsAndTakeNothing) {
  config_.max_reservations = 4;
  config_.max_leases = 3;
  config_.max_lease_count = 2;
  build();
  auto s = open_session();
  const uint32_t m = register_model(*s);
  const uint64_t chunk = ModelInfo::from_desc(small_model())->chunk_bytes;
  Op r = keyed(*s, Opcode::kReserve, m, 0, 5, sizeof(ipc::ReserveRecord));
  run(r);
  EXPECT_EQ(r.cqe.status, KDN_ERR_LIMIT);
  EXPECT_EQ(ns_.store->open_reservations(), 0u);
  EXPECT_TRUE(s->reservations.empty());
  store(*s, m, 0, 4, chunk);
  Op l = keyed(*s, Opcode::kLease, m, 0, 4, sizeof(ipc::LeaseRecord));
  run(l);
  EXPECT_EQ(l.cqe.status, KDN_ERR_LIMIT) << "4 chunks > max_leases";
  EXPECT_EQ(ns_.store->active_leases(), 0u);
  // Two leases of chunk 0 are fine, a third is over max_lease_count: rolled back whole.
  Op a = keyed(*s, Opcode::kLease, m, 0, 1, sizeof(ipc::LeaseRecord));
  run(a);
  Op b = keyed(*s, Opcode::kLease, m, 0, 1, sizeof(ipc::LeaseRecord));
  run(b);
  ASSERT_EQ(b.cqe.status, KDN_OK);
  Op c = keyed(*s, Opcode::kLease, m, 0, 2, sizeof(ipc::LeaseRecord));
  run(c);
  EXPECT_EQ(c.cqe.status, KDN_ERR_LIMIT);
  EXPECT_EQ(s->leases.begin()->second.count, 2u);
  EXPECT_EQ(s->leases.size(), 1u) << "chunk 1's lease of the refused request was rolled back";
  EXPECT_GE(ns_.counters.limit_errors, 3u);
  // A read-only session cannot reserve.
  auto ro = open_session(0);
  const uint32_t m3 = register_model(*ro);
  Op ror = keyed(*ro, Opcode::kReserve, m3, 100, 1, sizeof(ipc::ReserveRecord));
  run(ror);
  EXPECT_EQ(ror.cqe.status, KDN_ERR_LIMIT);
}

TEST_F(HandlerTest, ReserveThatRunsOutOfArenaZeroesWhatItDidNotServe) {
  // 4 MiB arena of 256 KiB... a big model: 2 x 2 x 128 dims x 256 tokens f16 = 512 KiB chunks.
  build(4 * kMiB);
  auto s = open_session(64 * kMiB);
  const kdn_model_desc big = small_model(256, 128);
  const uint32_t m = register_model(*s, big);
  const uint64_t chunk = ModelInfo::from_desc(big)->chunk_bytes;
  ASSERT_EQ(chunk, 512 * 1024u);
  // Fill the payload's output area with garbage first: unserved records must come back zero.
  std::memset(payload(*s) + 4 * kMiB, 0xEE, 20 * sizeof(ipc::ReserveRecord));
  Op r = keyed(*s, Opcode::kReserve, m, 0, 20, sizeof(ipc::ReserveRecord));
  run(r);
  ASSERT_EQ(r.cqe.status, KDN_OK);
  auto res = ipc::ReserveOp::result(r.cqe, 20);
  ASSERT_TRUE(res.ok());
  EXPECT_EQ(res->served, 8u) << "8 slots of 512 KiB in 4 MiB";
  EXPECT_EQ(res->reserved, 8u);
  EXPECT_EQ(res->stop, KDN_ERR_NO_SPACE);
  auto recs = records<ipc::ReserveRecord>(*s, r, 20);
  ipc::ReserveRecord zero{};
  for (uint32_t i = 8; i < 20; ++i) EXPECT_EQ(std::memcmp(&recs[i], &zero, sizeof zero), 0) << i;
  for (uint32_t i = 0; i < 8; ++i) EXPECT_EQ(recs[i].state, uint32_t(ipc::ReserveState::kReserved));
  // Nothing served at all: the status says so.
  Op none = keyed(*s, Opcode::kReserve, m, 100, 2, sizeof(ipc::ReserveRecord));
  run(none);
  EXPECT_EQ(none.cqe.status, KDN_ERR_NO_SPACE);
  (void)chunk;
}

TEST_F(HandlerTest, LargeRequestsAreSlicedAndStillExact) {
  build();
  auto s = open_session();
  const uint32_t m = register_model(*s);
  const uint64_t chunk = ModelInfo::from_desc(small_model())->chunk_bytes;
  store(*s, m, 0, 512, chunk);
  Op look = keyed(*s, Opcode::kLookup, m, 0, 65536);
  const int steps = run(look, 1);  // a 1 ns slice: one batch per step
  EXPECT_GT(steps, 1);
  auto hits = ipc::LookupOp::result(look.cqe, 65536);
  ASSERT_TRUE(hits.ok());
  EXPECT_EQ(hits->hit_chunks, 512u);
  Op lease = keyed(*s, Opcode::kLease, m, 0, 600, sizeof(ipc::LeaseRecord));
  EXPECT_GT(run(lease, 1), 1);
  EXPECT_EQ(lease.cqe.res[0], 512u);
  EXPECT_EQ(ns_.store->active_leases(), 512u);
}

TEST_F(HandlerTest, CommitWaitsForItsCopiesAndASessionEndingMeanwhileLosesNothing) {
  build(64 * kMiB);
  auto s = open_session(64 * kMiB);
  const kdn_model_desc big = small_model(256, 128);
  const uint32_t m = register_model(*s, big);
  const uint64_t chunk = ModelInfo::from_desc(big)->chunk_bytes;  // 512 KiB: copied by workers
  Op r = keyed(*s, Opcode::kReserve, m, 0, 16, sizeof(ipc::ReserveRecord));
  run(r);
  auto recs = records<ipc::ReserveRecord>(*s, r, 16);
  std::vector<uint64_t> ids;
  for (auto& rec : recs) {
    std::memset(const_cast<std::byte*>(s->staging.at(rec.slot.offset)), 0x3C, chunk);
    ids.push_back(rec.reservation_id);
  }
  Op c = ids_op(*s, Opcode::kCommit, ids);
  ASSERT_EQ(handler_->step(c, now_ns() + 1'000'000'000), Step::kWait);
  EXPECT_EQ(c.waiting, 16u);
  // The client goes away with the copies in flight: its holdings go, the copies land.
  handler_->drop_holdings(*s);
  deliver(c);
  ASSERT_EQ(handler_->step(c, now_ns() + 1'000'000'000), Step::kDone);
  EXPECT_EQ(c.cqe.status, KDN_OK);
  EXPECT_EQ(c.cqe.res[0], 16u);
  EXPECT_EQ(s->staging.free_bytes(), s->staging.capacity()) << "every staging slot came back";
  auto reader = open_session(0);
  const uint32_t m2 = register_model(*reader, big);
  Op look = keyed(*reader, Opcode::kLookup, m2, 0, 16);
  run(look);
  EXPECT_EQ(look.cqe.res[0], 16u) << "committed chunks of a client that died are kept";
}

TEST_F(HandlerTest, ReservationsExpire) {
  config_.reservation_timeout_ms = 1;
  build();
  auto s = open_session();
  const uint32_t m = register_model(*s);
  Op r = keyed(*s, Opcode::kReserve, m, 0, 3, sizeof(ipc::ReserveRecord));
  run(r);
  auto recs = records<ipc::ReserveRecord>(*s, r, 3);
  EXPECT_EQ(handler_->expire_reservations(*s, now_ns() + 2'000'000), 3u);
  EXPECT_EQ(ns_.store->open_reservations(), 0u);
  EXPECT_EQ(s->staging.free_bytes(), s->staging.capacity());
  Op c = ids_op(*s, Opcode::kCommit, {recs[0].reservation_id});
  run(c);
  EXPECT_EQ(c.cqe.status, KDN_ERR_NOT_FOUND);
  EXPECT_EQ(ns_.counters.expired_reservations, 3u);
}

TEST_F(HandlerTest, ModelsAreLimitedPerSessionAndFreedWithTheirLastSession) {
  config_.max_models = 3;
  build();
  auto s = open_session(0);
  uint32_t ids[3];
  for (uint32_t i = 0; i < 3; ++i) ids[i] = register_model(*s, small_model(16 + i));
  EXPECT_EQ(register_model(*s, small_model(16)), ids[0]) << "registering again is no new model";
  const ipc::ModelRecord rec = ipc::to_wire(small_model(40));
  std::memcpy(payload(*s), &rec, sizeof rec);
  Op op = make(*s, Opcode::kRegisterModel);
  op.sqe.in_len = sizeof rec;
  run(op);
  EXPECT_EQ(op.cqe.status, KDN_ERR_LIMIT);
  EXPECT_EQ(models_.live(), 3u);
  handler_->drop_holdings(*s);
  EXPECT_EQ(models_.live(), 0u);
  auto t = open_session(0);
  const uint32_t reused = register_model(*t, small_model(16));
  EXPECT_NE(reused, ids[0]) << "a freed slot comes back under a new generation";
  EXPECT_EQ(models_.get(ids[0]), nullptr) << "the old id is stale";
  // A model id of another session is not this session's to use.
  Op look = keyed(*s, Opcode::kLookup, reused, 0, 1);
  run(look);
  EXPECT_EQ(look.cqe.status, KDN_ERR_NOT_FOUND);
}

TEST_F(HandlerTest, AnAllocationFailureEndsOneRequestAndRollsItBack) {
  build();
  auto s = open_session();
  const uint32_t m = register_model(*s);
  const uint64_t chunk = ModelInfo::from_desc(small_model())->chunk_bytes;
  store(*s, m, 0, 200, chunk);
  EXPECT_TRUE(fail_each_allocation([&] { return keyed(*s, Opcode::kLease, m, 0, 200, sizeof(ipc::LeaseRecord)); },
                                   [&] { return ns_.store->active_leases() == 0 && s->leases.empty(); }));
  EXPECT_TRUE(
      fail_each_allocation([&] { return keyed(*s, Opcode::kReserve, m, 1000, 100, sizeof(ipc::ReserveRecord)); },
                           [&] { return ns_.store->open_reservations() == 0 && s->reservations.empty(); }));
}

TEST_F(HandlerTest, LeaseWaitsForAPromotionFromALowerTier) {
  build(4 * kMiB, true);
  auto s = open_session(64 * kMiB);
  const kdn_model_desc big = small_model(256, 128);
  const uint32_t m = register_model(*s, big);
  const uint64_t chunk = ModelInfo::from_desc(big)->chunk_bytes;
  store(*s, m, 0, 8, chunk);  // fills the 4 MiB host arena
  // Storing 8 more pushes the first ones down to the disk tier (the reservation waits for
  // the demotions to land).
  store(*s, m, 100, 8, chunk);
  Op look = keyed(*s, Opcode::kLookup, m, 0, 8);
  run(look);
  auto hits = ipc::LookupOp::result(look.cqe, 8);
  ASSERT_TRUE(hits.ok());
  EXPECT_EQ(hits->hit_chunks, 8u);
  EXPECT_GT(hits->tier_chunks[tier_index(TierId::kDisk)], 0u);
  Op lease = keyed(*s, Opcode::kLease, m, 0, 4, sizeof(ipc::LeaseRecord));
  run(lease);
  ASSERT_EQ(lease.cqe.status, KDN_OK);
  EXPECT_EQ(lease.cqe.res[0], 4u);
  auto recs = records<ipc::LeaseRecord>(*s, lease, 4);
  for (uint32_t i = 0; i < 4; ++i) {
    const std::byte* p = ns_.host->arena().data() + recs[i].slot.offset;
    EXPECT_EQ(p[0], std::byte(i)) << "promoted bytes are the stored ones";
    EXPECT_EQ(p[chunk - 1], std::byte(i));
  }
  EXPECT_GT(ns_.store->counters().promoted_chunks, 0u);
}

// An engine that only leases (no LOOKUP first) still shows hits and misses, and they add up:
// hits by tier sum to the hits, hits + misses to the chunks asked for, per operation.
TEST_F(HandlerTest, LeaseOnlyTrafficCountsHitsAndMissesThatAddUp) {
  build(4 * kMiB, true);
  auto s = open_session(64 * kMiB);
  const kdn_model_desc big = small_model(256, 128);
  const uint32_t m = register_model(*s, big);
  const uint64_t chunk = ModelInfo::from_desc(big)->chunk_bytes;
  store(*s, m, 0, 8, chunk);    // fills the 4 MiB host arena
  store(*s, m, 100, 8, chunk);  // pushes keys 0.. down to the disk tier
  auto reader = open_session(0);
  const uint32_t m2 = register_model(*reader, big);
  // LEASE of 6 keys: 4 cached (promoted from disk), then two that are not (the prefix ends).
  Op lease = keyed(*reader, Opcode::kLease, m2, 0, 6, sizeof(ipc::LeaseRecord));
  const kdn_key gone[2] = {K(300), K(301)};
  std::memcpy(payload(*reader) + 4 * sizeof(kdn_key), gone, sizeof gone);
  run(lease);
  ASSERT_EQ(lease.cqe.status, KDN_OK);
  ASSERT_EQ(lease.cqe.res[0], 4u);
  // LEASE_EACH of 4 keys: 100 and 101 are cached, 200 and 201 are not.
  Op each = keyed(*reader, Opcode::kLeaseEach, m2, 100, 4, sizeof(ipc::LeaseRecord));
  const kdn_key absent[2] = {K(200), K(201)};
  std::memcpy(payload(*reader) + 2 * sizeof(kdn_key), absent, sizeof absent);
  run(each);
  ASSERT_EQ(each.cqe.status, KDN_OK);
  const StoreCounters& k = ns_.store->counters();
  EXPECT_EQ(k.lookups, 0u) << "nothing looked up";
  EXPECT_EQ(k.leases, 2u);
  EXPECT_EQ(k.lease_hit_chunks, 6u);
  EXPECT_EQ(k.lease_miss_chunks, 4u);
  EXPECT_EQ(k.lease_hit_chunks + k.lease_miss_chunks, 6u + 4u) << "every chunk asked for is a hit or a miss";
  const auto sum = [&](ReadOp op) {
    uint64_t n = 0;
    for (uint32_t t = 0; t < kTierCount; ++t) n += k.hit_chunks[size_t(op)][t];
    return n;
  };
  EXPECT_EQ(sum(ReadOp::kLease), 4u);
  EXPECT_EQ(sum(ReadOp::kLeaseEach), 2u);
  EXPECT_EQ(k.miss_chunks[size_t(ReadOp::kLease)], 2u);
  EXPECT_EQ(k.miss_chunks[size_t(ReadOp::kLeaseEach)], 2u);
  EXPECT_GT(k.hit_chunks[size_t(ReadOp::kLease)][tier_index(TierId::kDisk)], 0u)
      << "promoted chunks count for the disk tier";
  // (Chunks a read-ahead brought up before the request reached them count for the host tier,
  // as their lease records say.)
  EXPECT_LE(k.hit_chunks[size_t(ReadOp::kLease)][tier_index(TierId::kDisk)] +
                k.hit_chunks[size_t(ReadOp::kLeaseEach)][tier_index(TierId::kDisk)],
            k.promoted_chunks);
  // STATS and TIER_STATS say the same.
  const ipc::StatsRecord st = handler_->stats(ns_, false);
  EXPECT_EQ(st.leases, 2u);
  EXPECT_EQ(st.lease_hit_chunks, 6u);
  EXPECT_EQ(st.lease_miss_chunks, 4u);
  const auto tiers = handler_->tier_stats(ns_);
  uint64_t by_tier = 0;
  for (const auto& t : tiers) by_tier += t.lease_hit_chunks;
  EXPECT_EQ(by_tier, st.lease_hit_chunks);
  // Bytes by tier and direction: what came into the host tier went in from commits and
  // promotions; the disk tier gave out what it promoted.
  EXPECT_EQ(k.tier_bytes[tier_index(TierId::kHost)][size_t(Flow::kIn)], k.stored_bytes + k.promoted_bytes);
  EXPECT_EQ(k.tier_bytes[tier_index(TierId::kDisk)][size_t(Flow::kOut)], k.promoted_bytes);
  EXPECT_EQ(k.tier_bytes[tier_index(TierId::kDisk)][size_t(Flow::kIn)], k.demoted_bytes);
  EXPECT_GE(k.tier_bytes[tier_index(TierId::kHost)][size_t(Flow::kOut)], k.retrieved_bytes + k.demoted_bytes);
  // A LOOKUP then counts as a lookup alone.
  Op look = keyed(*reader, Opcode::kLookup, m2, 0, 10);
  run(look);
  EXPECT_EQ(k.lookups, 1u);
  EXPECT_EQ(k.lookup_hit_chunks + k.lookup_miss_chunks, 10u);
  EXPECT_EQ(k.leases, 2u);
}

// Segment lookups and leases: every key on its own, a miss in the middle stops nothing.
TEST_F(HandlerTest, LookupEachAndLeaseEachServeEveryKeyOnItsOwn) {
  build();
  auto s = open_session();
  const uint32_t m = register_model(*s);
  const uint64_t chunk = ModelInfo::from_desc(small_model())->chunk_bytes;
  store(*s, m, 0, 4, chunk);
  store(*s, m, 6, 2, chunk);  // keys 4 and 5 (and 8, 9) are missing
  Op look = keyed(*s, Opcode::kLookupEach, m, 0, 10, 1);
  std::memset(payload(*s) + look.sqe.out_off, 0x77, 10);
  run(look);
  ASSERT_EQ(look.cqe.status, KDN_OK);
  auto map = records<uint8_t>(*s, look, 10);
  const uint8_t host = uint8_t(tier_index(TierId::kHost)), miss = ipc::kTierMiss;
  EXPECT_EQ(map, (std::vector<uint8_t>{host, host, host, host, miss, miss, host, host, miss, miss}));
  auto hits = ipc::LookupEachOp::result(look.cqe, map.data(), 10);
  ASSERT_TRUE(hits.ok());
  EXPECT_EQ(hits->hit_chunks, 6u);
  // The plain LOOKUP stops at the first miss.
  Op prefix = keyed(*s, Opcode::kLookup, m, 0, 10);
  run(prefix);
  EXPECT_EQ(prefix.cqe.res[0], 4u);

  auto reader = open_session(0);
  const uint32_t m2 = register_model(*reader);
  Op lease = keyed(*reader, Opcode::kLeaseEach, m2, 0, 10, sizeof(ipc::LeaseRecord));
  std::memset(payload(*reader) + lease.sqe.out_off, 0xEE, 10 * sizeof(ipc::LeaseRecord));
  run(lease);
  ASSERT_EQ(lease.cqe.status, KDN_OK);
  auto got = ipc::LeaseEachOp::result(lease.cqe, 10);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->leased, 6u);
  auto recs = records<ipc::LeaseRecord>(*reader, lease, 10);
  const ipc::LeaseRecord zero{};
  std::vector<uint64_t> ids;
  for (uint32_t i = 0; i < 10; ++i) {
    const bool cached = i < 4 || i == 6 || i == 7;
    if (!cached) {
      EXPECT_EQ(std::memcmp(&recs[i], &zero, sizeof zero), 0) << "a miss is a zero record: " << i;
      continue;
    }
    ASSERT_NE(recs[i].lease_id, 0u) << i;
    EXPECT_EQ(ns_.host->arena().data()[recs[i].slot.offset], std::byte(i));
    ids.push_back(recs[i].lease_id);
  }
  EXPECT_EQ(ns_.store->active_leases(), 6u);
  Op rel = ids_op(*reader, Opcode::kRelease, ids);
  run(rel);
  EXPECT_EQ(rel.cqe.status, KDN_OK);
  EXPECT_EQ(ns_.store->active_leases(), 0u);
  // The same key twice (two segments sharing a chunk): one lease, counted twice.
  Op twice = keyed(*reader, Opcode::kLeaseEach, m2, 0, 1, sizeof(ipc::LeaseRecord));
  const kdn_key k0 = K(0);
  std::memcpy(payload(*reader) + sizeof k0, &k0, sizeof k0);
  twice.sqe.in_len = 2 * sizeof k0;
  twice.sqe.out_len = 2 * sizeof(ipc::LeaseRecord);
  run(twice);
  ASSERT_EQ(twice.cqe.status, KDN_OK);
  auto two = records<ipc::LeaseRecord>(*reader, twice, 2);
  EXPECT_EQ(two[0].lease_id, two[1].lease_id);
  EXPECT_EQ(reader->leases.at(two[0].lease_id).count, 2u);
}

TEST_F(HandlerTest, LeaseEachPromotesFromALowerTierAndKeepsItsLimits) {
  config_.max_leases = 6;
  build(4 * kMiB, true);
  auto s = open_session(64 * kMiB);
  const kdn_model_desc big = small_model(256, 128);
  const uint32_t m = register_model(*s, big);
  const uint64_t chunk = ModelInfo::from_desc(big)->chunk_bytes;
  store(*s, m, 0, 8, chunk);
  store(*s, m, 100, 8, chunk);  // pushes the first ones down to the disk tier
  Op look = keyed(*s, Opcode::kLookupEach, m, 0, 8, 1);
  run(look);
  auto map = records<uint8_t>(*s, look, 8);
  EXPECT_GT(std::count(map.begin(), map.end(), uint8_t(tier_index(TierId::kDisk))), 0);
  Op lease = keyed(*s, Opcode::kLeaseEach, m, 0, 4, sizeof(ipc::LeaseRecord));
  run(lease);
  ASSERT_EQ(lease.cqe.status, KDN_OK);
  EXPECT_EQ(lease.cqe.res[0], 4u);
  auto recs = records<ipc::LeaseRecord>(*s, lease, 4);
  for (uint32_t i = 0; i < 4; ++i) EXPECT_EQ(ns_.host->arena().data()[recs[i].slot.offset], std::byte(i));
  // Over max_leases: the whole request is refused and takes nothing.
  Op over = keyed(*s, Opcode::kLeaseEach, m, 100, 4, sizeof(ipc::LeaseRecord));
  run(over);
  EXPECT_EQ(over.cqe.status, KDN_ERR_LIMIT);
  EXPECT_EQ(ns_.store->active_leases(), 4u);
}

}  // namespace
}  // namespace kdn::sidecar

namespace kdn::sidecar {
namespace {

// Without a GPU tier (none, or one that is off) every GPU request is refused whole, takes
// nothing (no lease pinned, no reservation left), and GPU_INFO says the tier is off.
TEST_F(HandlerTest, GpuRequestsWithoutAGpuTierAreUnsupportedAndTakeNothing) {
  build();
  GpuTierConfig off;
  off.enable = "off";
  auto svc = gpu::GpuService::create(off);
  ASSERT_TRUE(svc.ok());
  auto s = open_session();
  const uint32_t m = register_model(*s);
  const uint64_t chunk = ModelInfo::from_desc(small_model())->chunk_bytes;
  store(*s, m, 0, 4, chunk);
  for (gpu::GpuService* g : {static_cast<gpu::GpuService*>(nullptr), svc->get()}) {
    handler_->set_gpu(g);
    for (Opcode code : {Opcode::kGpuRetrieve, Opcode::kGpuStore, Opcode::kGpuPrefetch}) {
      Op op = keyed(*s, code, m, 0, 4);
      op.sqe.arg[0] = ipc::GpuRegistrationRef{1, 1}.word();
      op.sqe.arg[2] = ipc::GpuLayoutRef{4 * kMiB, 96}.word();
      run(op);
      EXPECT_EQ(op.cqe.status, KDN_ERR_UNSUPPORTED) << ipc::opcode_name(uint8_t(code));
    }
    {  // GPU_SEGMENT_RETRIEVE: keys, one output byte per key, chunk records at arg1
      Op op = keyed(*s, Opcode::kGpuSegmentRetrieve, m, 0, 4, 1);
      const ipc::GpuSegmentChunkRecord recs[4] = {{3, 0, ipc::kGpuSegmentStart}, {3, 16, 0}, {0, 32, 0}, {0, 48, 0}};
      std::memcpy(payload(*s) + 5 * kMiB, recs, sizeof recs);
      ipc::GpuSegmentRetrieveOp::put({m, {1, 1}, {5 * kMiB, sizeof recs}, {4 * kMiB + 4096, 96}}, op.sqe);
      run(op);
      EXPECT_EQ(op.cqe.status, KDN_ERR_UNSUPPORTED);
    }
    {  // GPU_BLEND_SELECT: the same records, int32 indices out
      Op op = keyed(*s, Opcode::kGpuBlendSelect, m, 0, 4, 4);
      const ipc::GpuSegmentChunkRecord recs[4] = {{3, 0, ipc::kGpuSegmentStart}, {3, 16, 0}, {0, 32, 0}, {0, 48, 0}};
      std::memcpy(payload(*s) + 5 * kMiB, recs, sizeof recs);
      ipc::GpuBlendSelectOp::put({m, {1, 1}, {5 * kMiB, sizeof recs}, {4 * kMiB + 4096, 96}, 0, 0, 150000}, op.sqe);
      run(op);
      EXPECT_EQ(op.cqe.status, KDN_ERR_UNSUPPORTED);
    }
    EXPECT_EQ(ns_.store->active_leases(), 0u);
    Op check = make(*s, Opcode::kGpuCheck);
    ipc::GpuCheckOp::put({{1, 1}, 1, 1}, check.sqe);
    run(check);
    EXPECT_EQ(check.cqe.status, KDN_ERR_UNSUPPORTED);
    Op reg = make(*s, Opcode::kGpuRegister);
    reg.sqe.in_len = sizeof(ipc::GpuRegisterRecord);
    reg.sqe.out_off = 4 * kMiB;
    reg.sqe.out_len = sizeof(ipc::GpuRegisteredRecord);
    run(reg);
    EXPECT_EQ(reg.cqe.status, KDN_ERR_UNSUPPORTED);
    Op unreg = make(*s, Opcode::kGpuUnregister);
    run(unreg);
    EXPECT_EQ(unreg.cqe.status, KDN_ERR_UNSUPPORTED);
    Op info = make(*s, Opcode::kGpuInfo);
    info.sqe.out_off = 4 * kMiB;
    info.sqe.out_len = 4 * sizeof(ipc::GpuDeviceRecord);
    run(info);
    ASSERT_EQ(info.cqe.status, KDN_OK);
    auto r = ipc::GpuInfoOp::result(info.cqe, 4);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->enabled, 0u);
    EXPECT_EQ(r->written, 0u);
  }
  // The chunks are all still there and unpinned: a lease finds them.
  Op lease = keyed(*s, Opcode::kLease, m, 0, 4, sizeof(ipc::LeaseRecord));
  run(lease);
  EXPECT_EQ(lease.cqe.res[0], 4u);
}

}  // namespace
}  // namespace kdn::sidecar
