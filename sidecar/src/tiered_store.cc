#include "tiered_store.h"

#include <kdn/common/clock.h>

#include <cassert>

namespace kdn::sidecar {

namespace {
constexpr TierId kHost = TierId::kHost;
constexpr uint8_t bit(TierId t) { return uint8_t(1u << tier_index(t)); }
}  // namespace

TierPolicy::TierPolicy(std::array<Tier*, kTierCount> tiers, std::array<TierRules, kTierCount> rules)
    : tiers_(tiers), rules_(rules) {
  for (uint32_t t = 0; t < kTierCount; ++t)
    if (tiers_[t]) eviction_[t] = make_eviction_policy(rules_[t].eviction, TierId(t));
}

std::optional<TierId> TierPolicy::demotion_target(TierId from) const noexcept {
  if (rules_[tier_index(from)].on_evict != EvictAction::kDemote) return std::nullopt;
  for (uint32_t t = tier_index(from) + 1; t < kTierCount; ++t)
    if (tiers_[t]) return TierId(t);
  return std::nullopt;
}

// ---- lookup ----------------------------------------------------------------------------------

uint32_t TieredStore::lookup(std::span<const kdn_key> keys, uint64_t bytes, uint32_t tier_chunks[kTierCount],
                             const std::function<bool(const Entry&)>* in_gpu) noexcept {
  uint32_t hits = 0;
  for (const kdn_key& k : keys) {
    const Entry* e = index_.find(k);
    if (e == nullptr || !e->committed() || e->bytes != bytes || e->resident == 0) break;
    ++tier_chunks[in_gpu != nullptr && (*in_gpu)(*e) ? tier_index(TierId::kGpu) : e->fastest_tier()];
    ++hits;
  }
  return hits;
}

uint32_t TieredStore::cached_prefix(std::span<const kdn_key> keys, uint64_t bytes) const noexcept {
  uint32_t hits = 0;
  for (const kdn_key& k : keys) {
    const Entry* e = index_.find(k);
    if (e == nullptr || !e->committed() || e->bytes != bytes || e->resident == 0) break;
    ++hits;
  }
  return hits;
}

uint32_t TieredStore::probe(const kdn_key& key, uint64_t bytes) const noexcept {
  const Entry* e = index_.find(key);
  if (e == nullptr || !e->committed() || e->bytes != bytes || e->resident == 0) return kTierCount;
  return e->fastest_tier();
}

const char* read_op_name(ReadOp op) noexcept {
  switch (op) {
    case ReadOp::kLookup:
      return "lookup";
    case ReadOp::kLookupEach:
      return "lookup_each";
    case ReadOp::kLease:
      return "lease";
    case ReadOp::kLeaseEach:
      return "lease_each";
    case ReadOp::kCount:
      break;
  }
  return "?";
}

void TieredStore::note_read(ReadOp op, const uint64_t hits[kTierCount], uint64_t misses) noexcept {
  uint64_t found = 0;
  for (uint32_t t = 0; t < kTierCount; ++t) {
    counters_.hit_chunks[size_t(op)][t] += hits[t];
    found += hits[t];
  }
  counters_.miss_chunks[size_t(op)] += misses;
  const bool lease = op == ReadOp::kLease || op == ReadOp::kLeaseEach;
  ++(lease ? counters_.leases : counters_.lookups);
  (lease ? counters_.lease_hit_chunks : counters_.lookup_hit_chunks) += found;
  (lease ? counters_.lease_miss_chunks : counters_.lookup_miss_chunks) += misses;
}

void TieredStore::note_flow(TierId from, TierId to, uint64_t bytes, bool from_staging) noexcept {
  if (!from_staging) counters_.tier_bytes[tier_index(from)][size_t(Flow::kOut)] += bytes;
  counters_.tier_bytes[tier_index(to)][size_t(Flow::kIn)] += bytes;
}

// ---- room ------------------------------------------------------------------------------------

void TieredStore::track_resident(TierId t, const Entry* e, int sign) noexcept {
  counters_.resident_chunks[tier_index(t)] += uint64_t(int64_t(sign));
  counters_.resident_bytes[tier_index(t)] += uint64_t(int64_t(sign) * int64_t(e->bytes));
}

void TieredStore::drop_copy(Entry* e, TierId t, bool discard) noexcept {
  policy_.eviction(t).on_remove(e);  // before the placement goes: queues are per slot class
  track_resident(t, e, -1);
  const Placement p = index_.drop_copy(e, t);
  if (discard)
    policy_.tier(t)->discard(p);
  else
    policy_.tier(t)->free(p);
}

void TieredStore::erase_if_empty(Entry* e) noexcept {
  if (e->resident != 0 || e->moving != 0 || e->leases != 0 || e->io != 0) return;
  if (e->committed()) ++counters_.dropped_chunks;
  index_.erase(e);
}

TieredStore::Evicted TieredStore::evict_one(TierId t, uint16_t cls) {
  EvictionPolicy& ev = policy_.eviction(t);
  Entry* v = ev.victim(cls);
  if (v == nullptr) v = ev.victim_any();
  if (v == nullptr) return Evicted::kNone;
  ev.on_evict(v);
  ++counters_.evicted_chunks;
  // Free when the tier it would be demoted to holds a copy already (a copy further down, in
  // the shared tier say, does not stop a demotion to the disk tier, which serves it faster).
  const auto to = policy_.demotion_target(t);
  if (to && !v->in_tier(*to) && start_demotion(v, t, *to)) return Evicted::kDemoting;
  drop_copy(v, t);
  erase_if_empty(v);
  return Evicted::kFreed;
}

Result<Placement> TieredStore::allocate_with_room(TierId t, uint64_t bytes) {
  Tier* tier = policy_.tier(t);
  auto cls = tier->slot_class(bytes);
  if (!cls.ok()) return cls.status();
  // Victims whose copy can go at once are dropped until the allocation succeeds; the first
  // one that must be written down first ends the attempt: room comes when it lands.
  for (;;) {
    auto p = tier->allocate(bytes);
    if (p.ok() || p.status().code() != Code::kNoSpace) return p;
    const Evicted e = demotions_[tier_index(t)] >= options_.max_demotions ? Evicted::kNone : evict_one(t, *cls);
    if (e == Evicted::kFreed) continue;
    if (e == Evicted::kDemoting || demotions_in_flight(t))
      return Status(Code::kInProgress, "room comes when demotions land");
    return Status(Code::kNoSpace, "tier full of leased, reserved or moving chunks");
  }
}

bool TieredStore::demotions_in_flight(TierId from) const noexcept { return demotions_[tier_index(from)] > 0; }

// ---- transfers -------------------------------------------------------------------------------

TransferId TieredStore::start(const Record& r, Transfer t) noexcept {
  t.id = next_transfer_++;
  try {
    transfers_.emplace(t.id, r);  // before submit: a synchronous tier may complete at once
  } catch (const std::bad_alloc&) {
    return 0;  // not started: the caller undoes what it prepared
  }
  Status st = policy_.tier(r.tier)->submit(t);
  if (!st.ok()) {
    transfers_.erase(t.id);
    return 0;
  }
  ++r.entry->io;
  return t.id;
}

Result<Placement> TieredStore::allocate_below(TierId to, uint64_t bytes) {
  Tier* tier = policy_.tier(to);
  auto p = tier->allocate(bytes);
  // A full lower tier makes room by its own rule; if that fails too, nothing is written.
  if (!p.ok() && p.status().code() == Code::kNoSpace) {
    auto cls = tier->slot_class(bytes);
    while (cls.ok() && !p.ok() && p.status().code() == Code::kNoSpace && evict_one(to, *cls) == Evicted::kFreed)
      p = tier->allocate(bytes);
  }
  return p;
}

std::optional<TierId> TieredStore::tier_below_host() const noexcept {
  for (uint32_t t = tier_index(kHost) + 1; t < kTierCount; ++t)
    if (policy_.tier(TierId(t))) return TierId(t);
  return std::nullopt;
}

bool TieredStore::start_demotion(Entry* e, TierId from, TierId to, uint64_t waiter) {
  Tier* source = policy_.tier(from);
  std::byte* host = source->address(e->placement[tier_index(from)]);
  if (host == nullptr || e->moving_to(to)) return false;  // only host-addressable tiers demote by themselves
  auto p = allocate_below(to, e->bytes);
  if (!p.ok()) return false;
  index_.begin_move(e, to, *p);
  Record r{Kind::kDemote, e, e->generation, to, from, to, {}, 0};
  if (waiter) r.waiters.push_back(waiter);
  Transfer t{Transfer::Direction::kWrite, *p, host, e->bytes, 0, ChunkIdentity{e->key, e->fingerprint}};
  if (start(r, t) == 0) {
    policy_.tier(to)->free(index_.end_move(e, to, false));
    return false;
  }
  e->evicting |= bit(from);
  ++demotions_[tier_index(from)];
  return true;
}

bool TieredStore::start_copy_down(Entry* e, std::vector<uint64_t> waiters, uint64_t cookie) {
  const auto to = tier_below_host();
  if (!to || !e->in_tier(kHost) || e->in_tier(*to) || e->moving_to(*to)) return false;
  auto p = allocate_below(*to, e->bytes);
  if (!p.ok()) return false;
  index_.begin_move(e, *to, *p);
  Record r{Kind::kCopyDown, e, e->generation, *to, kHost, *to, std::move(waiters), cookie};
  Transfer t{Transfer::Direction::kWrite,          *p, host()->address(e->placement[tier_index(kHost)]), e->bytes, 0,
             ChunkIdentity{e->key, e->fingerprint}};
  if (start(r, t) == 0) {
    policy_.tier(*to)->free(index_.end_move(e, *to, false));
    return false;
  }
  return true;
}

Status TieredStore::start_promotion(Entry* e, TierId from, uint64_t waiter) {
  Record r{Kind::kPromote, e, e->generation, from, from, kHost, {}, 0};
  if (waiter) r.waiters.push_back(waiter);  // may throw: before anything changes
  auto p = allocate_with_room(kHost, e->bytes);
  if (!p.ok()) return p.status();
  index_.begin_move(e, kHost, *p);
  const TransferId id =
      start(r, Transfer{Transfer::Direction::kRead, e->placement[tier_index(from)], host()->address(*p), e->bytes, 0});
  if (id == 0) {
    host()->free(index_.end_move(e, kHost, false));
    return Status(Code::kIo, "the tier refused the read");
  }
  try {
    promoting_[e] = id;
  } catch (const std::bad_alloc&) {
    // Only other readers joining this promotion need the entry: without it they miss.
  }
  return OkStatus();
}

bool TieredStore::start_upload(Entry* e, bool for_eviction) {
  Tier* shared = remote();
  if (shared == nullptr || !e->committed() || !e->in_tier(kHost) || e->in_tier(TierId::kRemote) ||
      e->moving_to(TierId::kRemote))
    return false;
  auto p = allocate_below(TierId::kRemote, e->bytes);
  if (!p.ok()) return false;
  index_.begin_move(e, TierId::kRemote, *p);
  Record r{Kind::kUpload, e, e->generation, TierId::kRemote, kHost, TierId::kRemote, {}, uint64_t(for_eviction)};
  Transfer t{Transfer::Direction::kWrite,          *p, host()->address(e->placement[tier_index(kHost)]), e->bytes, 0,
             ChunkIdentity{e->key, e->fingerprint}};
  if (start(r, t) == 0) {
    shared->free(index_.end_move(e, TierId::kRemote, false));
    return false;
  }
  if (for_eviction) {
    e->evicting |= bit(kHost);
    ++demotions_[tier_index(kHost)];
  }
  return true;
}

Status TieredStore::probe_remote(std::span<const kdn_key> keys, const kdn_key& fingerprint, uint64_t bytes,
                                 uint64_t waiter) noexcept {
  Tier* shared = remote();
  if (shared == nullptr) return Status(Code::kUnsupported, "no shared tier");
  const TransferId id = next_transfer_++;
  try {
    auto p = std::make_unique<ProbeState>();
    p->waiter = waiter;
    p->bytes = bytes;
    for (const kdn_key& k : keys)
      if (index_.find(k) == nullptr) p->chunks.push_back(ChunkIdentity{k, fingerprint});
    if (p->chunks.empty()) return Status(Code::kNotFound, "every key is in the index");
    ProbeState& ps = *p;
    probes_.emplace(id, std::move(p));
    Status st = shared->probe(id, ps.chunks, &ps.exists);
    if (!st.ok()) {
      probes_.erase(id);
      return st;
    }
    ++counters_.remote_probes;
    counters_.remote_probe_keys += ps.chunks.size();
  } catch (const std::bad_alloc&) {
    probes_.erase(id);
    return Status(Code::kNoMemory, "probing the shared tier");
  }
  return OkStatus();
}

void TieredStore::apply_probe(ProbeState& p, const Status& status, std::vector<StoreEvent>& events) {
  // A failed probe (a node down, a timeout) still says yes for the keys that answered.
  if (!status.ok()) ++counters_.remote_failed_probes;
  Tier* shared = remote();
  const uint64_t now = now_ns();
  for (size_t i = 0; i < p.chunks.size() && i < p.exists.size(); ++i) {
    if (!p.exists[i] || index_.find(p.chunks[i].key) != nullptr) continue;
    auto placement = shared->adopt(p.chunks[i], p.bytes);
    if (!placement.ok() && placement.status().code() == Code::kNoSpace) {
      // This node's budget in the store is full: it forgets older chunks it knew there (the
      // values stay for other nodes).
      auto cls = shared->slot_class(p.bytes);
      while (cls.ok() && !placement.ok() && placement.status().code() == Code::kNoSpace &&
             evict_one(TierId::kRemote, *cls) == Evicted::kFreed)
        placement = shared->adopt(p.chunks[i], p.bytes);
    }
    if (!placement.ok()) break;
    if (adopt_copy(p.chunks[i].key, p.chunks[i].fingerprint, p.bytes, TierId::kRemote, *placement, now))
      ++counters_.remote_found_chunks;
  }
  if (p.waiter) events.push_back(StoreEvent{p.waiter, 0, kdn_key{}, OkStatus(), true});
}

// ---- reserve / commit / abort ------------------------------------------------------------------

Result<TieredStore::Reserved> TieredStore::reserve(const kdn_key& key, const kdn_key& fingerprint, uint64_t bytes,
                                                   uint64_t session, uint64_t now_ns) {
  if (const Entry* e = index_.find(key)) {
    return Reserved{e->committed() ? ReserveOutcome::kAlreadyCached : ReserveOutcome::kInFlight, nullptr};
  }
  auto p = allocate_with_room(kHost, bytes);
  if (!p.ok()) return p.status();
  Entry* e = nullptr;
  try {
    e = index_.create(key, fingerprint, bytes, session, now_ns);
  } catch (...) {
    host()->free(*p);
    throw;
  }
  index_.begin_move(e, kHost, *p);
  ++open_reservations_;
  return Reserved{ReserveOutcome::kReserved, e};
}

Status TieredStore::commit(Entry* e, const std::byte* src, uint64_t waiter, uint64_t cookie) noexcept {
  assert(e->state == EntryState::kReserved);
  Record r{Kind::kCommit, e, e->generation, kHost, kHost, kHost, {}, cookie};
  try {
    if (waiter) r.waiters.push_back(waiter);
  } catch (const std::bad_alloc&) {
    abort(e);  // either way a failed commit leaves no reservation behind
    return Status(Code::kNoMemory, "could not start the copy into the arena");
  }
  index_.begin_write(e);
  --open_reservations_;
  const TransferId id = start(r, Transfer{Transfer::Direction::kWrite, e->placement[tier_index(kHost)],
                                          const_cast<std::byte*>(src), e->bytes, 0});
  if (id == 0) {
    host()->free(index_.end_move(e, kHost, false));
    ++counters_.aborted_chunks;
    index_.erase(e);
    return Status(Code::kNoMemory, "could not start the copy into the arena");
  }
  return OkStatus();
}

void TieredStore::settle(const kdn_key& key) noexcept {
  Entry* e = index_.find(key);
  if (e != nullptr && e->committed() && e->in_tier(kHost) && e->links[tier_index(kHost)].queue == 0)
    policy_.eviction(kHost).on_insert(e);
}

void TieredStore::abort(Entry* e) noexcept {
  assert(e->state == EntryState::kReserved && e->io == 0);
  --open_reservations_;
  ++counters_.aborted_chunks;
  host()->free(index_.end_move(e, kHost, false));
  index_.erase(e);
}

// ---- lease -------------------------------------------------------------------------------------

TieredStore::Acquired TieredStore::acquire(const kdn_key& key, uint64_t bytes, uint64_t waiter, Entry** out,
                                           uint64_t now_ns, TierId* from) {
  Entry* e = index_.find(key);
  if (e == nullptr || !e->committed() || e->bytes != bytes) return Acquired::kMiss;
  if (e->in_tier(kHost)) {
    ++e->leases;
    ++active_leases_;
    e->evicting &= uint8_t(~bit(kHost));  // a demotion for eviction keeps the host copy now
    e->last_access_ns = now_ns;
    ++counters_.retrieved_chunks;
    counters_.retrieved_bytes += e->bytes;
    counters_.tier_bytes[tier_index(kHost)][size_t(Flow::kOut)] += e->bytes;
    *out = e;
    return Acquired::kLeased;
  }
  if (e->moving_to(kHost)) {  // someone else's promotion: wait for the same bytes
    auto it = promoting_.find(e);
    if (it == promoting_.end()) return Acquired::kMiss;
    Record& r = transfers_.at(it->second);
    if (waiter) r.waiters.push_back(waiter);
    if (from) *from = r.from;
    return Acquired::kPromoting;
  }
  for (uint32_t t = tier_index(kHost) + 1; t < kTierCount; ++t) {
    if (!e->in_tier(TierId(t)) || !policy_.promotes_from(TierId(t))) continue;
    const Status st = start_promotion(e, TierId(t), waiter);
    if (st.ok()) {
      if (from) *from = TierId(t);
      return Acquired::kPromoting;
    }
    if (st.code() == Code::kInProgress) return Acquired::kNoRoomYet;
    break;
  }
  return Acquired::kMiss;
}

uint32_t TieredStore::prefetch(std::span<const kdn_key> keys, uint64_t bytes, uint32_t limit) noexcept {
  uint32_t started = 0;
  for (const kdn_key& k : keys) {
    if (started >= limit) break;
    Entry* e = index_.find(k);
    if (e == nullptr || !e->committed() || e->bytes != bytes) break;
    if (e->in_tier(kHost) || e->moving_to(kHost)) continue;
    bool ok = false;
    for (uint32_t t = tier_index(kHost) + 1; t < kTierCount && !ok; ++t) {
      if (e->in_tier(TierId(t)) && policy_.promotes_from(TierId(t))) {
        try {
          ok = start_promotion(e, TierId(t), 0).ok();
        } catch (const std::bad_alloc&) {
          return started;
        }
      }
    }
    if (!ok) break;
    ++started;
    ++counters_.prefetched_chunks;
  }
  return started;
}

void TieredStore::touch(Entry* e, uint64_t now_ns) noexcept {
  e->last_access_ns = now_ns;
  for (uint32_t t = 0; t < kTierCount; ++t)
    if (e->in_tier(TierId(t))) policy_.eviction(TierId(t)).on_access(e);
}

void TieredStore::unpin(Entry* e) noexcept {
  assert(e->leases > 0);
  --e->leases;
  --active_leases_;
}

bool TieredStore::pin_host_copy(Entry* e) noexcept {
  if (!e->committed() || !e->in_tier(kHost)) return false;
  ++e->leases;
  ++active_leases_;
  e->evicting &= uint8_t(~bit(kHost));  // as acquire: a pinned host copy stays
  return true;
}

// ---- admin -------------------------------------------------------------------------------------

bool TieredStore::evict(const kdn_key& key) noexcept {
  Entry* e = index_.find(key);
  if (e == nullptr || !e->committed() || e->leases != 0 || e->io != 0 || e->moving != 0) return false;
  // A shared tier's copy is forgotten, not deleted: other nodes may be using it.
  for (uint32_t t = 0; t < kTierCount; ++t)
    if (e->in_tier(TierId(t))) drop_copy(e, TierId(t), TierId(t) != TierId::kRemote);
  ++counters_.evicted_chunks;
  erase_if_empty(e);
  return true;
}

uint64_t TieredStore::evict_all() noexcept {
  std::vector<kdn_key> keys;
  try {
    keys.reserve(index_.size());
    index_.for_each([&](Entry& e) {
      keys.push_back(e.key);
      return true;
    });
  } catch (const std::bad_alloc&) {}
  uint64_t n = 0;
  for (const kdn_key& k : keys) n += evict(k);
  return n;
}

std::pair<uint64_t, uint64_t> TieredStore::demote_all(uint64_t waiter) noexcept {
  const auto below = tier_below_host();
  if (!below) return {0, 0};
  std::vector<Entry*> hosted;
  try {
    index_.for_each([&](Entry& e) {
      if (e.committed() && e.in_tier(kHost) && e.leases == 0) hosted.push_back(&e);
      return true;
    });
  } catch (const std::bad_alloc&) {}
  uint64_t dropped = 0, demoting = 0;
  for (Entry* e : hosted) {
    if (!e->evictable_from(kHost)) continue;
    if (e->in_tier(*below)) {
      drop_copy(e, kHost);
      ++dropped;
      continue;
    }
    try {
      if (start_demotion(e, kHost, *below, waiter)) ++demoting;
    } catch (const std::bad_alloc&) {
      break;
    }
  }
  counters_.evicted_chunks += dropped;
  return {dropped, demoting};
}

bool TieredStore::adopt(const kdn_key& key, const kdn_key& fingerprint, uint64_t bytes, TierId t,
                        const Placement& placement, uint64_t now_ns) noexcept {
  if (!adopt_copy(key, fingerprint, bytes, t, placement, now_ns)) return false;
  ++counters_.recovered_chunks;
  return true;
}

bool TieredStore::adopt_copy(const kdn_key& key, const kdn_key& fingerprint, uint64_t bytes, TierId t,
                             const Placement& placement, uint64_t now_ns) noexcept {
  Tier* tier = policy_.tier(t);
  if (index_.find(key) != nullptr) {
    tier->free(placement);
    return false;
  }
  Entry* e = nullptr;
  try {
    e = index_.create(key, fingerprint, bytes, 0, now_ns);
  } catch (const std::bad_alloc&) {
    tier->free(placement);
    return false;
  }
  index_.begin_write(e);
  index_.publish(e, now_ns);
  index_.add_copy(e, t, placement);
  policy_.eviction(t).on_insert(e);
  track_resident(t, e, +1);
  return true;
}

uint64_t TieredStore::write_down(uint64_t limit) noexcept {
  const auto below = tier_below_host();
  if (!below || limit == 0) return 0;
  std::vector<Entry*> todo;
  try {
    index_.for_each([&](Entry& e) {
      if (e.committed() && e.in_tier(kHost) && !e.in_tier(*below) && e.moving == 0 && e.io == 0) todo.push_back(&e);
      return todo.size() < limit;
    });
  } catch (const std::bad_alloc&) {}
  uint64_t started = 0;
  for (Entry* e : todo) {
    try {
      if (!start_copy_down(e, {}, 0)) break;  // the tier below is full of pinned copies, or failing
    } catch (const std::bad_alloc&) {
      break;
    }
    ++started;
  }
  return started;
}

uint64_t TieredStore::host_only_chunks() noexcept {
  const auto below = tier_below_host();
  if (!below) return 0;
  uint64_t n = 0;
  index_.for_each([&](Entry& e) {
    n += e.committed() && e.in_tier(kHost) && !e.in_tier(*below);
    return true;
  });
  return n;
}

// ---- completions -------------------------------------------------------------------------------

size_t TieredStore::poll(std::vector<StoreEvent>& events, bool* room) {
  size_t applied = 0;
  for (uint32_t t = 0; t < kTierCount; ++t) {
    Tier* tier = policy_.tier(TierId(t));
    if (tier == nullptr || tier->in_flight() == 0) continue;
    TierCompletion done[64];
    for (size_t n; (n = tier->reap(done)) > 0;) {
      for (size_t i = 0; i < n; ++i) {
        if (auto pr = probes_.find(done[i].id); pr != probes_.end()) {
          std::unique_ptr<ProbeState> p = std::move(pr->second);
          probes_.erase(pr);
          apply_probe(*p, done[i].status, events);
          ++applied;
          continue;
        }
        auto it = transfers_.find(done[i].id);
        if (it == transfers_.end()) continue;  // a tier bug; nothing of ours to apply
        Record r = std::move(it->second);
        transfers_.erase(it);
        apply(r, done[i].status, events, room);
        ++applied;
      }
      if (n < std::size(done)) break;
    }
  }
  return applied;
}

void TieredStore::apply(const Record& r, const Status& status, std::vector<StoreEvent>& events, bool* room) {
  Entry* e = r.entry;
  assert(e->generation == r.generation && e->io > 0);
  --e->io;
  const kdn_key key = e->key;
  switch (r.kind) {
    case Kind::kCommit:
      if (status.ok()) {
        index_.end_move(e, kHost, true);
        index_.publish(e, e->last_access_ns);
        track_resident(kHost, e, +1);  // queued for eviction at settle()
        ++counters_.stored_chunks;
        counters_.stored_bytes += e->bytes;
        note_flow(r.from, r.to, e->bytes, /*from_staging=*/true);
        if (options_.upload == StoreOptions::Upload::kThrough) {
          try {
            (void)start_upload(e, false);  // nobody waits for it: the network is not the COMMIT's
          } catch (const std::bad_alloc&) {}
        }
        // write_through: the COMMIT completes once the copy below landed too (its waiters move
        // to that transfer); if it cannot start, the chunk is committed in the host tier alone.
        if (options_.write_through && !r.waiters.empty()) {
          bool moved = false;
          try {
            moved = start_copy_down(e, r.waiters, r.cookie);
          } catch (const std::bad_alloc&) {}
          if (moved) return;
        }
      } else {
        ++counters_.transfer_errors;
        host()->free(index_.end_move(e, kHost, false));
        index_.erase(e);
      }
      break;
    case Kind::kPromote:
      promoting_.erase(e);
      if (status.ok()) {
        index_.end_move(e, kHost, true);
        policy_.eviction(kHost).on_insert(e);
        track_resident(kHost, e, +1);
        ++counters_.promoted_chunks;
        counters_.promoted_bytes += e->bytes;
        ++counters_.promoted_from_chunks[tier_index(r.from)];
        counters_.promoted_from_bytes[tier_index(r.from)] += e->bytes;
        note_flow(r.from, r.to, e->bytes);
      } else {
        host()->free(index_.end_move(e, kHost, false));
        if (r.tier == TierId::kRemote) {
          // A shared copy that is gone, damaged, of another model, or out of reach: this node
          // forgets it (a later probe finds it again) and leaves the value to the store and its
          // writer, who overwrites it with its next upload.
          if (status.code() == Code::kCorrupt)
            ++counters_.corrupt_chunks;
          else
            ++counters_.transfer_errors;
          if (e->in_tier(r.tier)) drop_copy(e, r.tier);
          erase_if_empty(e);
        } else if (status.code() == Code::kCorrupt) {
          ++counters_.corrupt_chunks;  // the lower copy is damaged: never serve it
          if (e->in_tier(r.tier)) drop_copy(e, r.tier, true);
          erase_if_empty(e);
        } else {
          ++counters_.transfer_errors;
        }
      }
      break;
    case Kind::kDemote: {
      --demotions_[tier_index(r.from)];
      // Leased meanwhile (acquire cleared the bit): the source copy stays.
      const bool leave = (e->evicting & bit(r.from)) != 0;
      e->evicting &= uint8_t(~bit(r.from));
      if (status.ok()) {
        index_.end_move(e, r.to, true);
        policy_.eviction(r.to).on_insert(e);
        track_resident(r.to, e, +1);
        ++counters_.demoted_chunks;
        counters_.demoted_bytes += e->bytes;
        note_flow(r.from, r.to, e->bytes);
        // write_back with a disk tier: the chunk leaves host memory, so it goes to the shared
        // tier now (its host copy leaves once that upload lands).
        if (leave && r.from == kHost && options_.upload == StoreOptions::Upload::kBack && e->evictable_from(kHost)) {
          bool uploading = false;
          try {
            uploading = start_upload(e, true);
          } catch (const std::bad_alloc&) {}
          if (uploading) {
            *room = true;
            break;
          }
        }
        if (leave && e->evictable_from(r.from)) drop_copy(e, r.from);
      } else {
        ++counters_.transfer_errors;
        policy_.tier(r.to)->free(index_.end_move(e, r.to, false));
        // The copy it made room for: dropped (the node keeps taking chunks while the device
        // fails), or kept where it was.
        if (leave && options_.drop_on_failed_demotion && e->evictable_from(r.from)) {
          ++counters_.failed_demotions;
          drop_copy(e, r.from);
          for (uint64_t w : r.waiters) events.push_back(StoreEvent{w, r.cookie, key, status});
          erase_if_empty(e);
          *room = true;
          return;
        }
      }
      *room = true;
      break;
    }
    case Kind::kCopyDown:
      if (status.ok()) {
        index_.end_move(e, r.to, true);
        policy_.eviction(r.to).on_insert(e);
        track_resident(r.to, e, +1);
        ++counters_.written_through_chunks;
        note_flow(r.from, r.to, e->bytes);
      } else {
        ++counters_.transfer_errors;  // the chunk is committed in the host tier alone
        policy_.tier(r.to)->free(index_.end_move(e, r.to, false));
      }
      // The waiters are a COMMIT's: it succeeded whatever became of the copy below.
      for (uint64_t w : r.waiters) events.push_back(StoreEvent{w, r.cookie, key, OkStatus()});
      return;
    case Kind::kUpload: {
      const bool for_eviction = r.cookie != 0;
      const bool leave = for_eviction && (e->evicting & bit(kHost)) != 0;
      if (for_eviction) {
        --demotions_[tier_index(kHost)];
        e->evicting &= uint8_t(~bit(kHost));
        *room = true;
      }
      if (status.ok()) {
        index_.end_move(e, r.to, true);
        policy_.eviction(r.to).on_insert(e);
        track_resident(r.to, e, +1);
        ++counters_.uploaded_chunks;
        note_flow(r.from, r.to, e->bytes);
      } else {
        ++counters_.failed_uploads;  // the chunk stays on this node alone
        policy_.tier(r.to)->free(index_.end_move(e, r.to, false));
      }
      // Its host copy was leaving (its demotion to the disk tier landed first, or there is
      // none): it leaves now, whatever became of the upload, as a failed demotion's would.
      if (leave && e->evictable_from(kHost) &&
          (status.ok() || options_.drop_on_failed_demotion || (e->resident & uint8_t(~bit(kHost))) != 0)) {
        drop_copy(e, kHost);
        erase_if_empty(e);
      }
      return;
    }
  }
  for (uint64_t w : r.waiters) events.push_back(StoreEvent{w, r.cookie, key, status});
}

}  // namespace kdn::sidecar
